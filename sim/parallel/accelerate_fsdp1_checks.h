// What memsim models of Accelerate's FSDP1 bf16 path (HF Trainer bf16=True with
// fsdp_version 1: precision.autocast together with parallel.fsdp_mixed_precision under
// parallel.sharding: fsdp; sim/parallel/accelerate_amp.h, docs/fsdp-accelerate.md).
//
// Contract: require_accelerate_fsdp1_modelled(s), for a scenario with sharding fsdp,
// precision.autocast and parallel.fsdp_mixed_precision all set, returns when the scenario
// is Accelerate's policy in HF Trainer's step and throws ScenarioError naming the key
// otherwise (FILE: KEY: why). bf16 (HF Trainer bf16=True) runs without a scaler; fp16
// (fp16=True) with Accelerate's ShardedGradScaler (precision.grad_scaler: true,
// sim/step/grad_scaler.h), on a model loaded in fp32. Refused: a param_dtype other than the
// autocast dtype, the scaler's presence other than as Accelerate makes it
// (precision.grad_scaler), a loop computing the loss after the
// model returns (step.keep_output), loss.impl, families and architectures other than
// transformers' Llama / Mistral / Qwen2, autocast_region other than forward-and-loss,
// autocast_cache false, CPU offload, and activation checkpointing with transformers 4.x
// (its checkpoint wraps the FSDP-wrapped layer from the outside, whose recompute passes
// through FSDP's forward hooks: not modelled). A model loaded in 16 bits (Accelerate's
// upcast, sim/parallel/accelerate_amp.h accelerate_fsdp1_upcast): bf16 is modelled; fp16
// is refused (precision.params), and so is use_orig_params with reshard_after_forward false
// (parallel.reshard_after_forward: its bf16 shards would outlive the forward).
//
// require_sync_module_states_modelled(s): parallel.fsdp_sync_module_states (the plugin's
// sync_module_states, HF Trainer's default) is modelled where every buffer and parameter
// broadcast has one dtype (sim/parallel/fsdp_sync_states.h buckets one dtype): transformers'
// decoder rows (model.family hf-llama, model.implementation hf: fp32 rotary buffers only)
// with fp32 parameters and adapters, or bf16-loaded parameters on Accelerate's upcast path
// (fp32 buffers and bf16 parameters: per-dtype buckets); refused by key otherwise.
#pragma once

#include "scenario/scenario.h"

namespace memsim {

void require_accelerate_fsdp1_modelled(const Scenario& s);
void require_sync_module_states_modelled(const Scenario& s);

}  // namespace memsim
