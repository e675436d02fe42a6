// Which keys `memsim sweep --max KEY` may search (issue #20 item 4, hardening helper).
// --max assumes that memory grows with KEY and bisects up to 2^40 for the first value
// that does not fit. A loop count does not grow memory: step.warmup_steps repeats whole
// steps and batch.grad_accum micro-steps, and the allocator reaches its steady state
// within two of either, so the search never met a failure and ran until the key's limit
// (scenario/loop_limits.h) or the event budget (sim/step/event_budget.h) stopped it.
//
// Contract: max_key_refusal(key) is "" for a key --max may search, else the reason it
// may not (the caller refuses with it, exit 2).
#pragma once

#include <string>

namespace memsim {

std::string max_key_refusal(const std::string& key);

}  // namespace memsim
