// Reading parallel.sharding, parallel.reshard_after_forward, parallel.fsdp_init,
// parallel.cpu_offload, parallel.fsdp_mixed_precision, parallel.fsdp_backward_prefetch,
// parallel.fsdp_sync_module_states and parallel.gradient_as_bucket_view (internal to the scenario loader; the keys are
// documented in docs/scenario-format.md).
//
// Contract: parallel.sharding is none | fsdp | deepspeed. With fsdp, parallel.zero ends
// up 3 (FULL_SHARD, reshard_after_forward true, the default) or 2 (SHARD_GRAD_OP,
// reshard_after_forward false); an explicit parallel.zero must agree (2 or 3) and sets
// reshard_after_forward when that key is absent. reshard_after_forward, fsdp_init,
// cpu_offload, fsdp_mixed_precision, fsdp_backward_prefetch (backward_pre | no_prefetch;
// backward_post refused) and fsdp_sync_module_states without fsdp are errors. Errors name the key and
// where it was set.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void read_sharding(const Doc& d, ParallelConfig& p);

}  // namespace memsim::scenario_detail
