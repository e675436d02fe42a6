// torch DDP around a LoRA model and around a bf16 model with fp32 master weights, against
// real torch 1.13 (CPU, gloo; tests/data/ddp_combos/*.json from
// tools/fixtures/gen_ddp_lora_master_fixtures.py): the reducer's buckets hold only the
// parameters that require grad (the adapters; the 16-bit parameters), at construction
// and after the rebuild in gradient-ready order, byte for byte.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "json_test_support.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/parallel/data_parallel.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kDir = MEMSIM_SOURCE_DIR + "/tests/data/ddp_combos";

using memsim_test::load_json;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The fixture's model and training script as a scenario; `qlora`: the same adapters on
// an NF4 base.
Scenario combo_scenario(const nlohmann::json& f, bool qlora = false) {
  const nlohmann::json& c = f["config"];
  const std::string family = f["family"];
  std::string y = "model:\n  family: " + family + "\n";
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += std::string("  tied_embeddings: ") + (family == "hf-gpt2" ? "true" : "false") + "\n";
  y += "  attention: eager\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: " + c["dtype"].get<std::string>() + "\n";
  const bool master = f["master_weights"].get<bool>();
  if (master) y += "  master_weights: true\n";
  y += master ? "optimizer:\n  type: adamw\n  impl: for-loop\n"
              : "optimizer:\n  type: sgd\n  impl: for-loop\n";
  if (!f["lora"].is_null()) {
    const auto& l = f["lora"];
    y += "lora:\n  rank: " + std::to_string(l["rank"].get<int>()) + "\n  alpha: " +
         num(l["alpha"].get<double>()) + "\n  targets: [";
    bool first = true;
    for (const auto& t : l["targets"]) {
      y += (first ? "" : ", ") + t.get<std::string>();
      first = false;
    }
    y += "]\n  adapter_dtype: " + l.value("adapter_dtype", std::string("fp32")) + "\n";
    if (qlora) y += "  base_dtype: nf4\n";
  }
  y += "step:\n  kind: train\n  warmup_steps: 2\n";
  // DDP wraps the model for data > 1 only; world size 1 in torch is the same reducer.
  y += "parallel:\n  data: " + std::to_string(f["world_size"].get<int>() + 1) + "\n";
  if (f["gradient_as_bucket_view"].get<int>() != 0) y += "  gradient_as_bucket_view: true\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "ddp-combo-fixture.yaml");
}

std::vector<uint64_t> named_allocs(const Program& p, const char* name) {
  std::vector<uint64_t> out;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && p.str(p.tensors[e.tensor].name) == name)
      out.push_back(e.bytes);
  return out;
}

std::vector<uint64_t> torch_buckets(const nlohmann::json& f) {
  std::vector<uint64_t> expect = f["construction_bucket_sizes"].get<std::vector<uint64_t>>();
  for (uint64_t b : f["rebuilt_bucket_sizes"].get<std::vector<uint64_t>>()) expect.push_back(b);
  return expect;
}

LiveBytes at_optimizer_end(const Program& p) {
  const LiveBytes live = live_bytes_at_mark(p, "optimizer_end");
  REQUIRE(live.found_mark);
  return live;
}

}  // namespace

TEST_CASE("DDP around LoRA / master-weight models: buckets match torch 1.13 exactly",
          "[dp][dp-combo][lora]") {
  int seen = 0;
  int lora = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kDir)) {
    if (entry.path().extension() != ".json") continue;
    const nlohmann::json f = load_json(entry.path());
    INFO(entry.path().filename().string());
    REQUIRE(f["bucket_cap_bytes"].get<uint64_t>() == kDdpBucketCapBytes);
    REQUIRE(f["find_unused_parameters"].get<int>() == 0);
    const bool view = f["gradient_as_bucket_view"].get<int>() != 0;
    const Program p = build_program(combo_scenario(f));
    // Same parameters: memsim allocates the base model first and then (get_peft_model)
    // the adapters, so torch's frozen parameters in order, then its trainable ones (each
    // sublist in model.parameters() order, the reducer's parameter order).
    std::vector<uint64_t> params;
    for (const MemoryEvent& e : p.events)
      if (e.type == EventType::alloc && e.kind == TensorKind::parameter) params.push_back(e.bytes);
    std::vector<uint64_t> torch_params;
    for (bool trainable : {false, true})
      for (const auto& q : f["parameters"])
        if (q["requires_grad"].get<bool>() == trainable)
          torch_params.push_back(q["bytes"].get<uint64_t>());
    REQUIRE(params == torch_params);
    // torch's rebuilt buckets index the reducer's parameters: the trainable ones alone.
    std::vector<uint64_t> trainable;
    for (const auto& q : f["parameters"])
      if (q["requires_grad"].get<bool>()) trainable.push_back(q["bytes"].get<uint64_t>());
    const auto& idx = f["rebuilt_per_bucket_param_indices"];
    REQUIRE(idx.size() == f["rebuilt_bucket_sizes"].size());
    for (size_t b = 0; b < idx.size(); ++b) {
      uint64_t sum = 0;
      for (const auto& i : idx[b]) sum += trainable.at(i.get<size_t>());
      CHECK(sum == f["rebuilt_bucket_sizes"][b].get<uint64_t>());
    }
    // The one bucket of the trainable parameters at construction, then the rebuilt ones.
    const std::vector<uint64_t> expect = torch_buckets(f);
    CHECK(named_allocs(p, "ddp.reducer.bucket") == expect);
    uint64_t rebuilt = 0;
    for (uint64_t b : f["rebuilt_bucket_sizes"].get<std::vector<uint64_t>>()) rebuilt += b;
    // Gradients after the step: the trainable .grads plus the buckets, or
    // (gradient_as_bucket_view) the buckets themselves.
    uint64_t own = 0;
    for (const auto& b : f["grad_storage_bytes"]) own += b.get<uint64_t>();
    const LiveBytes live = at_optimizer_end(p);
    CHECK(live.by_kind[int(TensorKind::gradient)] == (view ? rebuilt : own + rebuilt));
    if (f["master_weights"].get<bool>()) {
      // fp32 masters and AdamW's m and v, as on one GPU.
      CHECK(live.by_kind[int(TensorKind::optimizer_state)] ==
            f["master_bytes"].get<uint64_t>() + f["optimizer_state_bytes"].get<uint64_t>());
    } else {
      ++lora;
    }
    ++seen;
  }
  CHECK(seen == 18);
  CHECK(lora == 12);
}

TEST_CASE("DDP around a QLoRA model buckets the same adapters (NF4 base, no grad)",
          "[dp][dp-combo][lora]") {
  // torch's fixture has a bf16 base; an NF4 base is as frozen, so the reducer sees the
  // same fp32 adapters.
  for (const char* name : {"llama_bf16_lora_all_r64_w2.json", "llama_bf16_lora_all_r64_w2_view.json"}) {
    INFO(name);
    const nlohmann::json f = load_json(std::string(kDir) + "/" + name);
    const Program p = build_program(combo_scenario(f, /*qlora=*/true));
    CHECK(named_allocs(p, "ddp.reducer.bucket") == torch_buckets(f));
  }
}

TEST_CASE("DDP with LoRA adds buckets for the adapters only", "[dp][dp-combo][lora]") {
  const nlohmann::json f = load_json(std::string(kDir) + "/llama_lora_all_r64_w2.json");
  Scenario s = combo_scenario(f);
  s.parallel.data = 1;
  const LiveBytes single = at_optimizer_end(build_program(s));
  s.parallel.data = 8;
  const Program p = build_program(s);
  const LiveBytes ddp = at_optimizer_end(p);
  uint64_t adapters = 0;
  for (const auto& q : f["parameters"])
    if (q["requires_grad"].get<bool>()) adapters += q["bytes"].get<uint64_t>();
  CHECK(ddp.by_kind[int(TensorKind::parameter)] == single.by_kind[int(TensorKind::parameter)]);
  CHECK(single.by_kind[int(TensorKind::gradient)] == adapters);
  CHECK(ddp.by_kind[int(TensorKind::gradient)] == 2 * adapters);  // .grad + buckets
  CHECK(p.rank.data == 8);
}

TEST_CASE("LoRA with ZeRO-1 is still refused, with FSDP1 without use_orig_params too", "[dp][dp-combo][lora]") {
  const nlohmann::json f = load_json(std::string(kDir) + "/llama_lora_qv_r8_w2.json");
  Scenario s = combo_scenario(f);
  s.parallel.data = 4;
  s.parallel.zero = 1;  // ZeroRedundancyOptimizer: which parameters it partitions is not modelled
  CHECK_THROWS_WITH(build_program(s),
                    Catch::StartsWith("ddp-combo-fixture.yaml: lora: is modelled with torch DDP") &&
                        Catch::Contains("not with ZeRO-1 (parallel.zero: 1)"));
  s.parallel.zero = 3;
  // FSDP1 flattens frozen and trainable parameters together: torch refuses that without
  // use_orig_params (docs/fsdp-lora.md; tests/test_fsdp_lora.cpp models it with).
  s.parallel.sharding = Sharding::fsdp;
  CHECK_THROWS_WITH(build_program(s),
                    Catch::StartsWith("ddp-combo-fixture.yaml: parallel.use_orig_params: false with lora"));
}
