// The torchtitan keys precision.float8, precision.float8_all_gather and
// precision.float8_precompute_scale (torchao float8 training: tensorwise, rowwise,
// rowwise_with_gw_hp modelled, docs/float8.md). Internal to the scenario loader;
// docs/torchtitan-recipes.md and docs/scenario-format.md describe it. (parallel.context,
// context parallelism, is read by scenario/context_parallel_keys.h once parallel.* is known.)
//
// Contract: float8 without a bf16 compute dtype fails first, naming the keys; float8 with
// parallel.sharding fsdp2 is refused unless precision.float8_all_gather is true;
// precision.float8: tensorwise / rowwise / rowwise_with_gw_hp is accepted (into
// s.precision.float8) for the hf-llama llama row with bf16 parameters on one GPU or DDP,
// with checkpoint.policy none, full or sac-layer:N; everything else with it set (other
// rows, autocast, LoRA, compile, sac-op and the other policies, sharding, parallel.context
// > 1) is refused by key. precision.float8_all_gather: true (torchtitan's
// enable_fsdp_float8_all_gather) needs tensorwise and parallel.sharding fsdp2 and then
// also accepts fp32 parameters under parallel.fsdp_mixed_precision bf16;
// precision.float8_precompute_scale: true needs it (both into s.precision; the FSDP2
// side's refusals are sim/parallel/fsdp2_checks.h's).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void check_torchtitan_keys(const Doc& d, Scenario& s);  // sets s.precision.float8

}  // namespace memsim::scenario_detail
