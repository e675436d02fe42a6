// The event budget (issue #20 item 4, hardening helper): a bound on the number of
// allocator events one Program may hold, checked before the builder reserves its event
// arrays or emits anything. Without it `batch.grad_accum: 50257` on a two-layer model ran
// for 90 s and grew to 10 GB before answering.
//
// The estimate is the scheduler's own reservation formula, an upper bound for every
// family: (step.warmup_steps + 1) steps x batch.grad_accum micro-batches x (340 events per
// layer + 1200) + 12 per layer, with the layers of one pipeline stage when
// parallel.pipeline > 1 (each stage is its own Program). Computed without overflow.
//
// Contract: check_event_budget() throws ScenarioError "SOURCE: KEY: ..." naming the key
// that drives the count (the largest of the loop counts and the layers), the estimate and
// kEventBudget, when the estimate exceeds it; otherwise does nothing. The budget sits far
// above every shipped scenario (cs336-xl with 5 warm-up steps estimates 105,120 events and
// emits 105,015) and below what a 2-core machine builds in about 15 s.
#pragma once

#include <cstdint>

#include "scenario/scenario.h"

namespace memsim {

inline constexpr uint64_t kEventBudget = uint64_t{1} << 25;  // 33,554,432 events

// The estimate above (saturating at UINT64_MAX).
uint64_t estimated_events(const Scenario& scenario);
void check_event_budget(const Scenario& scenario);

}  // namespace memsim
