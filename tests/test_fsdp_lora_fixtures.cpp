// FSDP1 + LoRA with fsdp_wrap block and use_orig_params against a CPU stand-in measured
// with torch 1.13 (tools/fixtures/gen_fsdp_lora_fixtures.py -> tests/data/fsdp_lora/*.json):
// a LoRA LLaMA whose decoder layers' parameters are views of one FlatParameter per layer
// (laid out as torch's _flat_param.py does for use_orig_params=True, requires_grad = any),
// next to the same model with frozen base weights. What memsim must reproduce: the bytes
// saved for backward at the end of the forward (the frozen Linears' inputs, now needed for
// their weight gradients), each layer's padded flat size, and the full-size flat gradient
// (memsim holds 1/world of it after the reduce-scatter).
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "live_at_mark_test_support.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kDir = MEMSIM_SOURCE_DIR + "/tests/data/fsdp_lora";

Scenario scenario_for(const nlohmann::json& c, int64_t world) {
  std::string y = "model:\n  family: hf-llama\n";
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += "  tied_embeddings: false\n  attention: eager\n  dropout: 0\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "optimizer:\n  type: adamw\n  impl: for-loop\n";
  const auto& l = c["lora"];
  y += "lora:\n  rank: " + std::to_string(l["rank"].get<int>()) + "\n  alpha: " +
       std::to_string(l["alpha"].get<int>()) + "\n  targets: [";
  bool first = true;
  for (const auto& t : l["targets"]) {
    y += (first ? "" : ", ") + t.get<std::string>();
    first = false;
  }
  y += "]\n  dropout: 0\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  if (world > 1)
    y += "parallel:\n  data: " + std::to_string(world) +
         "\n  sharding: fsdp\n  fsdp_wrap: block\n  use_orig_params: true\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "fsdp-lora-fixture.yaml");
}

using memsim_test::live;

uint64_t bytes_named(const Program& p, const std::string& name) {
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && p.str(p.tensors[e.tensor].name) == name) return e.bytes;
  return 0;
}

}  // namespace

TEST_CASE("FSDP1 block wrap with LoRA matches the torch CPU stand-in", "[fsdp-lora][fixtures]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 2);
  for (const auto& path : files) {
    std::ifstream in(path);
    nlohmann::json fx;
    in >> fx;
    const auto& frozen = fx["frozen"];
    const auto& views = fx["flat_views"];
    const std::string name = views["name"];
    INFO(name);
    const int64_t world = views["world"];
    const Program single = build_program(scenario_for(views["config"], 1));
    const Program fsdp = build_program(scenario_for(views["config"], world));
    // Saved for backward at the end of the forward: one GPU's LoRA graph, and the graph
    // in which the frozen weights are views of a FlatParameter that requires grad.
    CHECK(live(single, "forward_end", TensorKind::activation) ==
          frozen["marks"]["forward_end"]["activations"].get<uint64_t>());
    CHECK(live(fsdp, "forward_end", TensorKind::activation) ==
          views["marks"]["forward_end"]["activations"].get<uint64_t>());
    // Each layer's FlatParameter (padded) and its full-size gradient; after the
    // reduce-scatter memsim's rank keeps 1/world of the stand-in's unsharded gradient.
    uint64_t grad_numel = 0;
    for (size_t l = 0; l < views["layers"].size(); ++l) {
      const auto& layer = views["layers"][l];
      INFO("layer " << l);
      CHECK(layer["requires_grad"].get<bool>());
      const uint64_t padded = layer["padded_numel"];
      CHECK(layer["grad_numel"].get<uint64_t>() == padded);
      CHECK(bytes_named(fsdp, "FlatParameter (wrap) of block " + std::to_string(l)) == padded * 4);
      CHECK(bytes_named(fsdp, "FlatParameter.grad (unsharded) of block " + std::to_string(l)) ==
            padded * 4);
      grad_numel += padded;
    }
    CHECK(views["marks"]["backward_end"]["gradients"].get<uint64_t>() == grad_numel * 4);
    CHECK(live(fsdp, "backward_end", TensorKind::gradient) == grad_numel * 4 / world);
    CHECK(views["frozen_params_with_grad"].get<int>() == 0);
  }
}
