// Reading the deepspeed section of a scenario and the DeepSpeed JSON config it may name
// (internal to the scenario loader; the keys are documented in docs/scenario-format.md,
// the model in docs/deepspeed.md).
//
// Contract:
//  - Without parallel.sharding: deepspeed, any deepspeed.* key is an error naming it.
//  - With it: parallel.zero must be 1, 2 or 3, given in the scenario or by the JSON's
//    zero_optimization.stage (both given: they must agree). The family must be hf-llama,
//    hf-gpt2 or cs336 (megatron: refused). parallel.data > 1.
//  - deepspeed.config: FILE (relative to the scenario's folder; --set: to the working
//    directory) is read as DeepSpeed would (json.load): a file that does not parse is
//    an error naming the file and the position. Its memory knobs fill DeepSpeedConfig;
//    the scenario's own deepspeed.* keys then override them. Keys that change memory
//    and that memsim does not model are refused by their JSON path ("FILE:
//    zero_optimization.zero_quantized_weights: ..."); keys that change no GPU/host
//    memory (logging, scheduler, lr) are accepted. "auto" is filled as transformers'
//    HfTrainerDeepSpeedConfig fills it: reduce_bucket_size = hidden^2,
//    stage3_prefetch_bucket_size = 0.9 hidden^2, stage3_param_persistence_threshold =
//    10 hidden, bf16/fp16.enabled and the batch sizes from the scenario; any other
//    memory key set to "auto" is refused by name.
//  - bf16.enabled / fp16.enabled must agree with precision.params (neither: fp32).
//  - The JSON's optimizer section (Adam / AdamW) sets optimizer.type and impl fused
//    (DeepSpeed's FusedAdam; CPUAdam with offload_optimizer); without one, an unset
//    optimizer.impl is fused too (docs/deepspeed.md says why).
//  - Combinations no DeepSpeed run allows are errors naming the keys: FSDP keys with
//    deepspeed, offload_param below stage 3, stage3_* knobs below stage 3, an
//    offload_param without offload_optimizer (DeepSpeed asserts), zero.Init below stage 3.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

// Fills s.deepspeed (and s.parallel.zero, s.optimizer where the JSON says) after the
// other sections were built.
void read_deepspeed(const Doc& d, Scenario& s);

}  // namespace memsim::scenario_detail
