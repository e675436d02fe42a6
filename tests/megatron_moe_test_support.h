// Shared by the Megatron-Core MoE tests (test_megatron_moe*.cpp): what is live at a mark of
// the megatron program, the activations at the forward's end, and whether a scenario runs
// to its end on its device without running out of memory.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>

#include "sim/analysis/layer_bytes.h"
#include "sim/megatron/megatron_step.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"

namespace memsim_test {

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
