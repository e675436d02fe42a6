// The torchtitan key precision.float8 (torchao float8 training: tensorwise, rowwise,
// rowwise_with_gw_hp modelled, docs/float8.md). Internal to the scenario loader;
// docs/torchtitan-recipes.md and docs/scenario-format.md describe it. (parallel.context,
// context parallelism, is read by scenario/context_parallel_keys.h once parallel.* is known.)
//
// Contract: float8 without a bf16 compute dtype fails first, naming the keys; float8 with
// parallel.sharding fsdp2 is refused as "not yet"; precision.float8: tensorwise / rowwise /
// rowwise_with_gw_hp is accepted (into s.precision.float8) for the hf-llama llama row with
// bf16 parameters on one GPU or DDP, with checkpoint.policy none, full or sac-layer:N;
// everything else with it set (other rows, autocast, LoRA, compile, sac-op and the other
// policies, sharding, parallel.context > 1) is refused by key.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void check_torchtitan_keys(const Doc& d, Scenario& s);  // sets s.precision.float8

}  // namespace memsim::scenario_detail
