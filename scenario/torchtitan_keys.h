// The torchtitan keys parallel.context (context parallelism: read, not modelled yet) and
// precision.float8 (torchao float8 training: tensorwise, rowwise, rowwise_with_gw_hp
// modelled, docs/float8.md). Internal to the scenario loader; docs/torchtitan-recipes.md and
// docs/scenario-format.md describe them.
//
// Contract: a combination no real stack allows fails first, naming the keys (context
// parallelism whose 2N does not divide batch.seq_len, or with eager attention; float8
// without a bf16 compute dtype); float8 with parallel.sharding fsdp2 is refused as "not
// yet"; precision.float8: tensorwise / rowwise / rowwise_with_gw_hp is accepted (into
// s.precision.float8) for the hf-llama llama row with bf16 parameters on one GPU or DDP,
// with checkpoint.policy none, full or sac-layer:N; everything else with it set (other
// rows, autocast, LoRA, compile, sac-op and the other policies, sharding) is refused by
// key; anything with parallel.context > 1 is refused as not modelled. parallel.context: 1
// (torchtitan's default, no context parallelism) is accepted.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void check_torchtitan_keys(const Doc& d, Scenario& s);  // sets s.precision.float8

}  // namespace memsim::scenario_detail
