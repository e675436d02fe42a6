// Shared by the tests that compare a simulated training step with a torch CPU fixture
// (tools/fixtures/gen_torch_cpu_fixtures.py, gen_arch_fixtures.py: requested bytes of
// every aten op's storages, no allocator rounding): the walk over the Program and the
// comparison itself (forward-end bytes by kind and by layer exactly, the step's peak
// within 2%, layer 0's forward allocation sizes in order exactly, its backward
// allocations as a multiset, reported).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "real_run_test_support.h"
#include "scenario/scenario.h"
#include "sim/step/execute.h"

namespace memsim_test {

using namespace memsim;

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

inline Walk walk(const Program& p) {
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


inline void print_fixture_table_header() {
  std::printf("\n| fixture | forward-end real | predicted | error | step peak real | predicted | error | peak op (real / predicted) |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---|\n");
}

// Compares `program`, simulated from `scenario`, with fixture `fx`; prints a table row.
// torch113_add > 0: the real step's peak is where torch 1.13's engine adds two grads out of
// place (2.x, which memsim emulates, adds in place): the real peak must then exceed the
// predicted one by exactly that tensor's bytes, instead of the 2% bound.
inline void compare_with_fixture(const nlohmann::json& fx, const Scenario& scenario,
                                 const Program& program, uint64_t torch113_add = 0) {
  const std::string name = fx["name"];
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
  if (torch113_add > 0) {
    CHECK(fx["peak_at"]["op"].get<std::string>() == "add");
    CHECK(real_peak == w.step_peak + torch113_add);
  } else {
    CHECK(std::fabs(rel(w.step_peak, real_peak)) < 0.02);
  }

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

}  // namespace memsim_test
