// model.implementation torchtitan with parallel.sharding fsdp2: torchtitan's own Llama
// code under its apply_fsdp (sim/parallel/fsdp2_layout.h has the source,
// docs/implementations.md "torchtitan under FSDP2"). Internal to the scenario loader.
//
// Contract: a no-op unless both are set. Then parallel.fsdp_init is cpu (torchtitan builds
// on the meta device; an explicit gpu is refused), parallel.reshard_after_forward is
// fsdp_reshard_after_forward: true = "default" (tok_embeddings and the blocks reshard,
// [norm, output] stays gathered), false = "never"; an integer is refused, and so are
// parallel.context (context parallelism over torchtitan's own code), the float8
// all-gather and checkpoint.offload_activations, each by its key (exit 1).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void read_torchtitan_sharding(const Doc& d, Scenario& s);

}  // namespace memsim::scenario_detail
