// memsim optimize --objective time|memory: the configuration that fits a budget, over
// micro-batch x gradient accumulation at a fixed global batch and the optimizer
// implementation, each with its own checkpointing plan (issue #18 item 2, in part).
//
// Contract (search_configurations):
//  - Candidates: every micro-batch m of `micro_batches` (grad_accum = G / m),
//    ascending, times the optimizer implementations torch offers for the scenario's
//    optimizer (Adam / AdamW: for-loop, foreach, fused; any other: the scenario's own).
//  - Each candidate gets optimize_checkpointing's answer for the budget (the least-
//    recompute plan that fits, or the smallest peak) and, when it fits, the time model's
//    estimate of that plan's step (sim/analysis/step_time.h).
//  - Chosen: among fitting candidates whose step time is estimated, the least step time
//    (objective time) or the least peak reserved (objective memory), ties broken by the
//    other measure, then by candidate order. Without any estimate (a refused time model),
//    objective time falls back to memory and says so in `why`.
//  - Pareto: the fitting, estimated candidates no other one beats on both peak reserved and
//    step seconds (ties kept), by peak ascending.
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
  OptimizeResult result;  // its checkpointing plan and simulation
  StepTime time;          // of that plan's measured step (estimated only when it fits)
  bool pareto = false;
};

struct ConfigSearch {
  int64_t global_batch = 1;
  std::vector<ConfigCandidate> candidates;
  int chosen = -1;  // index into candidates; -1: nothing fits
  std::string why;  // one line: why the chosen point
};

ConfigSearch search_configurations(const Scenario& scenario, uint64_t budget, Objective objective,
                                   int64_t global_batch, std::vector<int64_t> micro_batches = {});

}  // namespace memsim
