// The torchtitan keys that memsim reads but does not model yet: parallel.context (context
// parallelism) and precision.float8 (torchao float8 training). Internal to the scenario
// loader; docs/torchtitan-recipes.md and docs/scenario-format.md describe them.
//
// Contract: a combination no real stack allows fails first, naming the keys (context
// parallelism whose 2N does not divide batch.seq_len, or with eager attention; float8
// without a bf16 compute dtype); float8 with parallel.sharding fsdp2 is refused as "not
// yet"; anything else with parallel.context > 1 or precision.float8 set is refused as not
// modelled. parallel.context: 1 (torchtitan's default, no context parallelism) is accepted.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void check_torchtitan_keys(const Doc& d, const Scenario& s);

}  // namespace memsim::scenario_detail
