// Shared by the Megatron-Core MoE tests (test_megatron_moe*.cpp): a fixture chain's events
// normalised for comparison, what is live at a mark of the megatron program, the activations at the forward's end, and whether a scenario runs
// to its end on its device without running out of memory.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/analysis/layer_bytes.h"
#include "sim/megatron/megatron_step.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"

namespace memsim_test {

// A chain's (alloc?, bytes) events as allocations in order, each followed by the sorted byte
// sizes of the frees before the next allocation: the torch fixtures see frees at their next
// op, in no particular order, and frees with no allocation between them leave an allocator
// the same (test_megatron_moe_act.cpp, test_megatron_moe_nograd.cpp).
inline std::vector<std::string> normalise(const std::vector<std::pair<bool, uint64_t>>& ev) {
  std::vector<std::string> out;
  std::vector<uint64_t> frees;
  auto flush = [&] {
    if (frees.empty()) return;
    std::sort(frees.begin(), frees.end());
    std::string f = "free";
    for (uint64_t b : frees) f += " " + std::to_string(b);
    out.push_back(f);
    frees.clear();
  };
  for (const auto& [alloc, bytes] : ev) {
    if (alloc) {
      flush();
      out.push_back("alloc " + std::to_string(bytes));
    } else {
      frees.push_back(bytes);
    }
  }
  flush();
  return out;
}

inline memsim::LiveBytes live_at(const memsim::Scenario& s, const char* mark) {
  const memsim::Program p = memsim::build_megatron_program(s);
  memsim::LiveBytes live = memsim::live_bytes_at_mark(p, mark);
  REQUIRE(live.found_mark);
  return live;
}

inline uint64_t activations_at_forward_end(const memsim::Scenario& s) {
  return live_at(s, "forward_end").by_kind[int(memsim::TensorKind::activation)];
}

inline bool runs(const memsim::Scenario& s) {
  const memsim::Program program = memsim::build_program(s);
  memsim::SimulatedDevice device(s.device.capacity, s.device.cuda_context);
  const memsim::Timeline t = memsim::execute(program, s.allocator, device);
  return !t.oom.has_value() && !t.allocated.empty();
}

}  // namespace memsim_test
