// Which settings parallel.sharding: fsdp2 models (sim/parallel/fsdp2.h); the rest are
// refused by key (ScenarioError "SOURCE: KEY: why").
//
// Refused: one GPU (parallel.data 1) and a shard group of one rank (parallel.replicate =
// parallel.data: fully_shard's world-size-1 path); parallel.fsdp_mixed_precision with
// precision.params other than fp32; precision.autocast with an autocast_region spanning
// backward (whole-step, whole-run), fp16 autocast (GradScaler) or float8_all_gather
// (autocast over fp32 unsharded parameters is modelled: they are leaves, cached as on one
// GPU; docs/fsdp2.md "Autocast over FSDP2"). precision.autocast together with
// parallel.fsdp_mixed_precision is modelled only as Accelerate's FSDP2 bf16 path
// (sim/parallel/accelerate_amp.h): param_dtype = autocast dtype, parallel.reduce_dtype set
// to it, parallel.fsdp_output_dtype set to it, HF Trainer's loop (the loss in the model's
// forward: step.keep_output loss, the model's own loss), transformers' llama / mistral /
// qwen2 code without experts, autocast_region forward-and-loss with the cache on, no
// context parallelism, no CPU offload; anything else is refused by the key that differs;
// precision.master_weights; 8-bit optimizers and Adafactor (their kernels / factored state
// over DTensor shards are not modelled); QLoRA (lora.base_dtype nf4) and LoRA with
// parallel.fsdp_mixed_precision.
// parallel.fsdp_output_dtype (MixedPrecisionPolicy.output_dtype, Accelerate >= 1.8's policy)
// only equal to the layers' compute dtype (fsdp_mixed_precision, else precision.params: each
// layer's own output cast is then a no-op), in HF Trainer's loop, without autocast over fp32
// parameters, context parallelism or step.compile.
// parallel.accelerate_version (not none): transformers' models only (model.implementation
// hf, family hf-llama / hf-gpt2); from 1.8 no precision.autocast (Accelerate never autocasts
// an FSDP2 model there), before 1.8 precision.autocast required with
// parallel.fsdp_mixed_precision (1.6 / 1.7 always wrap forward in it); from 1.14 hf-llama
// only, no tied embeddings (the [norm, embed_tokens] tail's hooks) and no LoRA (PEFT
// changes what _find_final_norm finds): not modelled.
// With precision.float8_all_gather: reshard_after_forward N (torch raises
// NotImplementedError), cpu_offload, model.moe, optimizer.in_backward with
// float8_precompute_scale, and a Float8Linear out-features the shard group does not divide
// (parallel.data).
#pragma once

#include "scenario/scenario.h"

namespace memsim {

void require_fsdp2_modelled(const Scenario& scenario);

}  // namespace memsim
