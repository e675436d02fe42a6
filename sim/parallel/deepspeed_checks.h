// Which settings memsim models together with DeepSpeed ZeRO (parallel.sharding: deepspeed;
// sim/parallel/deepspeed_zero.h). The scenario reader (scenario/deepspeed_keys.h) already
// refused what no DeepSpeed run allows; this refuses what DeepSpeed allows but memsim does
// not model, by key.
#pragma once

#include "scenario/scenario.h"

namespace memsim {

// Throws ScenarioError "SOURCE: KEY: why".
void require_deepspeed_modelled(const Scenario& scenario);

}  // namespace memsim
