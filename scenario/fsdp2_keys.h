// Reading the keys of parallel.sharding: fsdp2 (internal to the scenario loader; the keys
// are documented in docs/scenario-format.md, the model in docs/fsdp2.md).
//
// Contract (read_fsdp2, called once parallel.sharding is fsdp2):
//  - parallel.reshard_after_forward: true (default) | false | N. N must divide the shard
//    group (parallel.data / parallel.replicate), as fully_shard's
//    _get_post_forward_mesh_info requires; N = 1 reads as false and N = the shard group
//    as true (what torch does with them); otherwise reshard_after_forward_ranks = N.
//  - parallel.replicate: R >= 1 dividing parallel.data (HSDP: a (R, data / R) mesh).
//  - parallel.fsdp_mixed_precision: MixedPrecisionPolicy.param_dtype (none | bf16 | fp16);
//    parallel.reduce_dtype: its reduce_dtype (fp32 | bf16 | fp16; absent = None);
//    parallel.fsdp_output_dtype: its output_dtype (none | bf16 | fp16 | fp32; absent = None).
//  - parallel.cpu_offload: CPUOffloadPolicy(); parallel.fsdp_init: gpu | cpu (cpu: the
//    model is built on the meta device or the CPU and only the shards reach the GPU).
//  - parallel.accelerate_version: none (default: the loop's own fully_shard calls) or the
//    Accelerate release that prepared the model, "1.6" to "1.15" (MAJOR.MINOR[.PATCH]),
//    stored as 100 * major + minor; older or newer releases and an int
//    reshard_after_forward with it are errors (sim/parallel/fsdp2_layout.h has the grouping).
//  - parallel.zero is refused (FSDP2 has no ZeRO-stage switch: reshard_after_forward
//    is the knob); parallel.zero is set to 3 internally (parameters sharded at rest).
// reject_fsdp2_keys: parallel.replicate / parallel.reduce_dtype / parallel.fsdp_output_dtype /
// parallel.accelerate_version
// with another sharding are errors. Errors name the key and where it was set.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void read_fsdp2(const Doc& d, ParallelConfig& p);
void reject_fsdp2_keys(const Doc& d, const ParallelConfig& p);

}  // namespace memsim::scenario_detail
