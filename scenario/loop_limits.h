// Limits on the scenario keys that are loop counts (issue #20 item 4, hardening helper):
// step.warmup_steps (training steps before the measured one) and batch.grad_accum
// (micro-batches per step). Each repeats the same events, so its memory reaches a steady
// state after one or two repetitions, while the time and the Program's size grow with
// it; an absurd value (9223372036854775807 warm-up steps) used to overflow the event
// estimate and loop for ever growing memory.
//
// Contract: read_loop_count() reads an integer >= min_value and at most the key's limit
// (kMaxWarmupSteps, kMaxGradAccum); a larger value is an error "FILE:LINE: KEY: N is more
// than the limit of M ..." that names the limit and why. The simulator's event budget
// (sim/step/event_budget.h) bounds the product with the model's size.
#pragma once

#include <cstdint>
#include <string>

#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

inline constexpr int64_t kMaxWarmupSteps = 1000;
inline constexpr int64_t kMaxGradAccum = 16384;

// The integer of f, >= min_value, at most the limit of `key` (one of the two above).
int64_t read_loop_count(const Field& f, const std::string& key, int64_t min_value);

}  // namespace memsim::scenario_detail
