// lora.target_parameters (issue #15, LoRA on the routed experts): PEFT's
// LoraConfig(target_parameters=[...]) (PEFT >= 0.17.0, huggingface/peft f3b97c37 "Allow LoRA to
// target nn.Parameter"; read at 5d602fdb, 0.20.1.dev0: src/peft/tuners/lora/layer.py
// ParamWrapper, _LoraParameterProxy; tuners_utils.py _inject_parameters), the only way PEFT
// adapts transformers 5.x's 3-D expert weights (Qwen3MoeExperts.gate_up_proj / down_proj are
// nn.Parameters, not nn.Linear). graph/models/moe_param_lora.h models what it runs.
//
// Accepted: a list (or one comma-separated string) of gate_up_proj and/or down_proj, each
// optionally prefixed `experts.` or `mlp.experts.` (PEFT matches a parameter's key or a
// `.`-separated suffix of it, so all three select every MoE layer's parameter); stored in
// LoraConfig::targets as mlp.experts.gate_up_proj / mlp.experts.down_proj (lora_target_mask's
// bits 7 and 8). lora.targets may then be absent (PEFT's target_modules None).
//
// Modelled on one GPU, under torch DDP and under FSDP2 (docs/moe.md "With DDP and FSDP2"), on
// every hf-llama MoE row, DeepSeek-V3 / V2 included (their 5.17 experts are the same module).
//
// Refused, exit 1 naming FILE:LINE and the key: any other name; a model without routed
// experts (model.moe) or not of the hf-llama family (Megatron's MoE); lora.dropout != 0
// (ParamWrapper raises); model.moe.experts_implementation batched_mm / grouped_mm,
// precision.autocast with 16-bit parameters or adapters, checkpoint.policy other than none /
// full / custom [mlp] (those three in every mode: reentrant or not, early stop or not),
// checkpoint.offload, parallel.sharding fsdp (FSDP1: huggingface/peft#3080), ZeRO / DeepSpeed,
// parallel.tensor / pipeline / context > 1 and torch.compile with it (not checked against a
// run: docs/moe.md).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim {

// Whether memsim models this checkpointing with lora.target_parameters: none, or
// torch.utils.checkpoint around every decoder layer (full) or around each layer's MLP half
// (custom [mlp]): use_reentrant False to the region's end and True (as
// tests/data/torch_cpu_moe_lora/*_ckpt_*.json measured), or False with torch >= 2.1's early
// stop (argued from the source, docs/moe.md; its structure checked by tests/test_moe_lora.cpp).
// Also asked by the step (sim/step/schedule.cpp) after a plan search rebuilt the section.
bool lora_target_parameters_checkpoint_modelled(const CheckpointConfig& c);
// Whether memsim models this parallelism with lora.target_parameters: one GPU, torch DDP
// (parallel.data > 1, no sharding, no ZeRO) or FSDP2 (parallel.sharding fsdp2) without
// context, tensor or pipeline parallelism (docs/moe.md "With DDP and FSDP2"). Also asked by
// the step after a plan search rebuilt the section.
bool lora_target_parameters_parallel_modelled(const ParallelConfig& p);

}  // namespace memsim

namespace memsim::scenario_detail {

// Reads lora.target_parameters into s.lora.targets (after lora.*, model.*, precision.*,
// checkpoint.* were read into s) and refuses what is not modelled with it.
void read_lora_target_parameters(const Doc& d, Scenario& s);
// The refusals that need parallel.* and compile.* (read later): called after them.
void check_lora_target_parameters(const Doc& d, const Scenario& s);

}  // namespace memsim::scenario_detail
