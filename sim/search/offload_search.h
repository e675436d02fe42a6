// The activation-offload axis of `memsim optimize --objective` (issue #18 item 2; the
// offload model: graph/offload.h, docs/offload.md).
//
// Contract: least_offload(scenario, script, budget) simulates `offload:N` (save_on_cpu
// around the first N layers, no checkpointing: scenario/scenario_checkpoint.h) on an
// allocator that may use `budget` bytes and returns the least N whose run fits, found by
// bisection over N = 1..L (offloading one more layer never adds device memory: its saved
// tensors leave the device, only one node's unpacked copies come back at a time). When
// even N = L does not fit, the result is offload of every layer, fits false, simulated
// without a limit (its peak is what it would need). The result carries the run's
// analysis, its time-model estimate and the pinned host peak; `simulations` counts runs.
#pragma once

#include <cstdint>

#include "sim/analysis/step_time.h"
#include "sim/search/optimize.h"

namespace memsim {

struct OffloadFit {
  OptimizeResult result;  // checkpoint = offload:N, plan = nothing checkpointed
  StepTime time;          // estimated only when it fits
  uint64_t host_offload_bytes = 0;
  int simulations = 0;
};

OffloadFit least_offload(const Scenario& scenario, const TrainingScript& script, uint64_t budget);

}  // namespace memsim
