// The hf-gpt2 and hf-llama families against real PyTorch: tests/data/torch_cpu/*.json
// hold training steps of plain-torch stand-ins of the Hugging Face models measured on
// CPU (tools/fixtures/gen_torch_cpu_fixtures.py; requested bytes, no allocator
// rounding). For each fixture the same scenario is built and executed, and compared:
// bytes live at the end of the forward (exactly), the step's peak (within 2%) and the
// activation bytes each layer leaves alive for backward (exactly).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "real_run_test_support.h"
#include "json_test_support.h"
#include "sim/execute.h"
#include "sim/schedule.h"

using namespace memsim;

namespace {

const char* kFixtureDir = MEMSIM_SOURCE_DIR "/tests/data/torch_cpu";

using memsim_test::load_json;

// The fixture's training run as a scenario: its dtype, torch.optim for-loop, eager attention,
// an unlimited device without cuBLAS workspaces (a CPU run has none).
Scenario scenario_for(const nlohmann::json& c) {
  const std::string family = c["family"];
  std::string y = "model:\n  family: " + family + "\n";
  y += "  layers: " + std::to_string(c["layers"].get<int>()) + "\n";
  y += "  d_model: " + std::to_string(c["d_model"].get<int>()) + "\n";
  y += "  heads: " + std::to_string(c["heads"].get<int>()) + "\n";
  y += "  kv_heads: " + std::to_string(c["kv_heads"].get<int>()) + "\n";
  y += "  d_ff: " + std::to_string(c["d_ff"].get<int>()) + "\n";
  y += "  vocab: " + std::to_string(c["vocab"].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  const bool tied = c.value("tied", family == "hf-gpt2");  // HF GPT-2 ties; LLaMA may
  y += std::string("  tied_embeddings: ") + (tied ? "true" : "false") + "\n";
  y += "  attention: eager\n";
  y += "  dropout: " + std::to_string(c["dropout"].get<double>()) + "\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: " + c.value("dtype", std::string("fp32")) + "\n";
  y += "  autocast: " + c.value("autocast", std::string("none")) + "\n";  // forward-and-loss
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "hf-fixture.yaml");
}

// Requested bytes walked over the Program: live totals at marks, by kind and by the
// (phase, layer) of the allocation.
struct Walk {
  uint64_t forward_end_total = 0;
  std::map<TensorKind, uint64_t> forward_end_by_kind;
  std::map<int, uint64_t> forward_end_activations_by_layer;
  uint64_t step_peak = 0;
  std::string peak_op;
  int peak_layer = -1;
  Phase peak_phase = Phase::other;
  // Allocation sizes of the measured step, in order, by (phase, layer).
  std::map<std::pair<Phase, int>, std::vector<uint64_t>> allocs;
};

Walk walk(const Program& p) {
  Walk w;
  std::vector<uint8_t> live(p.tensors.size(), 0);
  std::vector<Phase> born_phase(p.tensors.size(), Phase::other);
  std::vector<int> born_layer(p.tensors.size(), -1);
  uint64_t cur = 0;
  bool measuring = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc) {
      cur += e.bytes;
      live[e.tensor] = 1;
      born_phase[e.tensor] = e.phase;
      born_layer[e.tensor] = e.layer;
      if (measuring) w.allocs[{e.phase, e.layer}].push_back(e.bytes);
      if (measuring && cur > w.step_peak) {
        w.step_peak = cur;
        w.peak_op = p.str(e.op);
        w.peak_layer = e.layer;
        w.peak_phase = e.phase;
      }
    } else if (e.type == EventType::free) {
      cur -= p.tensors[e.tensor].bytes;
      live[e.tensor] = 0;
    } else if (e.type == EventType::mark) {
      const std::string& name = p.str(static_cast<uint32_t>(e.bytes));
      if (name == "measured_step_begin") {
        measuring = true;
        w.step_peak = cur;
      }
      if (name == "forward_end" && measuring) {
        w.forward_end_total = cur;
        for (size_t t = 0; t < live.size(); ++t) {
          if (!live[t]) continue;
          const TensorKind k = p.tensors[t].kind;
          w.forward_end_by_kind[k] += p.tensors[t].bytes;
          const bool activation = k == TensorKind::activation || k == TensorKind::temporary ||
                                  k == TensorKind::loss;
          if (activation && born_phase[t] == Phase::forward)
            w.forward_end_activations_by_layer[born_layer[t]] += p.tensors[t].bytes;
        }
      }
    }
  }
  return w;
}

using memsim_test::rel;

}  // namespace

TEST_CASE("hf families match real PyTorch training steps (CPU fixtures)", "[hf]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kFixtureDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 8);
  std::printf("\n| fixture | forward-end real | predicted | error | step peak real | predicted | error | peak op (real / predicted) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---|\n");
  for (const auto& path : files) {
    const nlohmann::json fx = load_json(path);
    // The folder holds other families' CPU fixtures too.
    const std::string family = fx.value("/config/family"_json_pointer, std::string());
    if (family != "hf-gpt2" && family != "hf-llama") continue;
    const std::string name = fx["name"];
    INFO(name);
    const Scenario scenario = scenario_for(fx["config"]);
    const Program program = build_program(scenario);
    const Walk w = walk(program);

    // The allocator emulator agrees with the walk on requested bytes.
    SimulatedDevice device(scenario.device.capacity, scenario.device.cuda_context);
    ExecuteOptions options;
    options.record_by_kind = false;
    const Timeline t = execute(program, scenario.allocator, device, options);
    REQUIRE_FALSE(t.oom.has_value());

    const auto& fe = fx["marks"]["forward_end"];
    const uint64_t real_fe = fe["total"];
    const uint64_t real_peak = fx["peak_live_bytes"];
    std::printf("| %s | %llu | %llu | %+.3f%% | %llu | %llu | %+.3f%% | %s / %s (%s, layer %d) |\n",
                name.c_str(), static_cast<unsigned long long>(real_fe),
                static_cast<unsigned long long>(w.forward_end_total), 100 * rel(w.forward_end_total, real_fe),
                static_cast<unsigned long long>(real_peak), static_cast<unsigned long long>(w.step_peak),
                100 * rel(w.step_peak, real_peak), fx["peak_at"]["op"].get<std::string>().c_str(),
                w.peak_op.c_str(), to_string(w.peak_phase), w.peak_layer);

    // Itemised: parameters, gradients (none after zero_grad), optimizer state, buffers
    // and the batch must agree before the activations can.
    auto kind = [&](TensorKind k) {
      auto it = w.forward_end_by_kind.find(k);
      return it == w.forward_end_by_kind.end() ? uint64_t{0} : it->second;
    };
    CHECK(kind(TensorKind::parameter) == fe["parameters"].get<uint64_t>());
    CHECK(kind(TensorKind::gradient) == fe["gradients"].get<uint64_t>());
    CHECK(kind(TensorKind::optimizer_state) == fe["optimizer_state"].get<uint64_t>());
    CHECK(kind(TensorKind::input) == fe["inputs"].get<uint64_t>());
    CHECK(kind(TensorKind::other) == fe["buffers"].get<uint64_t>());
    CHECK(w.forward_end_total == real_fe);
    CHECK(std::fabs(rel(w.step_peak, real_peak)) < 0.02);

    // What each layer's forward leaves alive for backward (its saved tensors).
    for (const auto& [layer, bytes] : fe["activations_by_layer"].items()) {
      INFO("layer " << layer);
      const int l = std::stoi(layer);
      const auto it = w.forward_end_activations_by_layer.find(l);
      const uint64_t predicted = it == w.forward_end_activations_by_layer.end() ? 0 : it->second;
      CHECK(predicted == bytes.get<uint64_t>());
    }

    // Layer 0's forward allocates the same sizes in the same order; its backward
    // allocates the same sizes (the harness attributes backward ops to layers through
    // gradient hooks, whose boundaries are not exactly the autograd nodes' layers, so
    // only the multiset is compared).
    std::vector<uint64_t> real_fw, real_bw;
    for (const auto& ev : fx["layer0_forward_sequence"])
      if (ev[0] == "alloc") real_fw.push_back(ev[2].get<uint64_t>());
    for (const auto& ev : fx["layer0_backward_sequence"])
      if (ev[0] == "alloc") real_bw.push_back(ev[2].get<uint64_t>());
    const auto fw_it = w.allocs.find({Phase::forward, 0});
    const auto bw_it = w.allocs.find({Phase::backward, 0});
    REQUIRE(fw_it != w.allocs.end());
    REQUIRE(bw_it != w.allocs.end());
    CHECK(fw_it->second == real_fw);
    std::vector<uint64_t> sim_bw = bw_it->second;
    std::sort(sim_bw.begin(), sim_bw.end());
    std::sort(real_bw.begin(), real_bw.end());
    std::vector<uint64_t> only_sim, only_real;
    std::set_difference(sim_bw.begin(), sim_bw.end(), real_bw.begin(), real_bw.end(),
                        std::back_inserter(only_sim));
    std::set_difference(real_bw.begin(), real_bw.end(), sim_bw.begin(), sim_bw.end(),
                        std::back_inserter(only_real));
    std::string diff = "only predicted:";
    for (uint64_t b : only_sim) diff += " " + std::to_string(b);
    diff += "; only real:";
    for (uint64_t b : only_real) diff += " " + std::to_string(b);
    // Known difference, reported rather than failed: torch 1.13's InputBuffer::accumulate
    // always adds dense grads out of place (checked on a two-use tensor: `add` allocates
    // even when the buffered grad is solely owned), while PyTorch 2.x, which the runtime
    // emulates (aten-saved-tensors.md §E), adds into a solely owned dense buffer in
    // place. Per layer that is two (B,S,D) transients (the residual stream's grads) and,
    // for GPT-2, two (B,S,F) (new-GELU's input grads) that only the 1.13 fixtures show;
    // memsim's layer-0 backward allocations are the real ones less exactly those. The
    // step peaks still agree.
    INFO("layer 0 backward allocations differ: " << diff);
    CHECK_NOFAIL((only_sim.empty() && only_real.empty()));
  }
}
