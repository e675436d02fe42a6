// memsim optimize --objective time|memory: the configuration that fits a budget, over
// micro-batch x gradient accumulation at a fixed global batch, the optimizer
// implementation, 8-bit optimizers, loss chunking, expandable segments and activation
// offload, each with its own checkpointing plan (issue #18 item 2).
//
// Contract (search_configurations):
//  - Grid: every micro-batch m of `micro_batches` (grad_accum = G / m), ascending, times
//    the optimizer implementations torch offers for the scenario's optimizer (Adam /
//    AdamW: for-loop, foreach, fused; any other: the scenario's own).
//  - Axes tried one at a time on every micro-batch, with the scenario's own optimizer
//    implementation (`axis` names the change; each only where memsim models it for the
//    scenario, asked of require_modelled, else not listed):
//      "8-bit"                bitsandbytes AdamW8bit / Adam8bit for torch AdamW / Adam
//      "loss chunked:8"       torchtune's chunked output + CEWithChunkedOutputLoss, 8 chunks
//                             (hf-* whose loss is the model's or a torch cross entropy)
//      "expandable segments"  PYTORCH_CUDA_ALLOC_CONF expandable_segments:True
//      "offload:N"            save_on_cpu around the first N layers, no checkpointing
//                             (graph/offload.h): the least N that fits (bisection over N,
//                             each simulated; all layers when none fits)
//  - Each grid and axis candidate but offload gets optimize_checkpointing's answer for the
//    budget (the least-recompute plan that fits, or the smallest peak) and, when it fits,
//    the time model's estimate of that plan's step (sim/analysis/step_time.h).
//  - Chosen: among fitting candidates whose step time is estimated, the least step time
//    (objective time) or the least peak reserved (objective memory), ties broken by the
//    other measure, then by candidate order. Without any estimate (a refused time model),
//    objective time falls back to memory and says so in `why`. Objective time never
//    answers "nothing fits" while a candidate fits: fitting candidates without an estimate
//    (8-bit optimizers have no kernel table) are chosen by memory when no estimated one fits.
//  - Pareto: the fitting, estimated candidates no other one beats on both peak reserved and
//    step seconds (ties kept).
//  - `micro_batches` (empty: every divisor of G) must each divide G; the caller checks
//    (the command line names --micro-batches / --global-batch when they do not).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scenario/scenario.h"
#include "sim/analysis/step_time.h"
#include "sim/search/optimize.h"

namespace memsim {

enum class Objective { time, memory };

struct ConfigCandidate {
  int64_t micro_batch = 1, grad_accum = 1;
  OptimizerImpl optimizer = OptimizerImpl::foreach;
  OptimizerType optimizer_type = OptimizerType::adamw;
  LossConfig loss;
  bool expandable_segments = false;
  std::string axis;       // the single axis changed from the grid point ("" = grid point)
  OptimizeResult result;  // its checkpointing plan (or offload) and simulation
  StepTime time;          // of that plan's measured step (estimated only when it fits)
  uint64_t host_offload_bytes = 0;  // offload candidates: pinned host peak
  bool pareto = false;
};
// The scenario a candidate describes (its batch, optimizer, loss, allocator, checkpoint).
Scenario candidate_scenario(const Scenario& base, const ConfigCandidate& c);

struct ConfigSearch {
  int64_t global_batch = 1;
  std::vector<ConfigCandidate> candidates;
  int chosen = -1;  // index into candidates; -1: nothing fits
  std::string why;  // one line: why the chosen point
};

ConfigSearch search_configurations(const Scenario& scenario, uint64_t budget, Objective objective,
                                   int64_t global_batch, std::vector<int64_t> micro_batches = {});

}  // namespace memsim
