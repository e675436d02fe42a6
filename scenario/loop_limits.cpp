// See scenario/loop_limits.h.
#include "scenario/loop_limits.h"

namespace memsim::scenario_detail {

int64_t read_loop_count(const Field& f, const std::string& key, int64_t min_value) {
  const int64_t value = read_int(f, key, min_value);
  const bool warmup = key == "step.warmup_steps";
  const int64_t limit = warmup ? kMaxWarmupSteps : kMaxGradAccum;
  if (value > limit) {
    fail(f.where, key,
         std::to_string(value) + " is more than the limit of " + std::to_string(limit) +
             (warmup ? " warm-up steps (the allocator reaches its steady state within two steps; "
                       "more only repeat the same events)"
                     : " micro-batches per step (accumulation repeats the same micro-step: the "
                       "peak is reached by the second one; more only repeat the same events)"));
  }
  return value;
}

}  // namespace memsim::scenario_detail
