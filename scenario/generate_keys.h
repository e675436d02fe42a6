// Issue #17 item 1 (generation): the `generate:` section and step.kind generate's rules.
//
// Keys (docs/scenario-format.md): generate.prompt_len (>= 1), generate.new_tokens (>= 1),
// generate.cache (dynamic | static | quantized:int8 | quantized:int4 | quantized:int2 |
// offloaded; default dynamic), generate.residual_length / generate.q_group_size (the quantized
// cache's cache_config: scenario/generate_quant_keys.cpp), generate.logits_to_keep (>= 0; default 1, what generate() passes a model whose
// forward takes it; 0 = every position's logits), generate.cache_classes (v4.45 | v5;
// default v4.45: which transformers release's cache_utils classes).
//
// With step.kind generate, batch.seq_len becomes prompt_len + new_tokens (checked against an
// explicit model.context_length) and batch.micro_batch is the number of prompts. Refused by
// key (exit 1, "FILE:LINE: KEY: why"), because generation does not use them or memsim does
// not model them with a KV cache (docs/generate.md lists the reasons):
//  - training-only settings given explicitly: batch.seq_len, batch.grad_accum, optimizer.*,
//    loss.*, checkpoint.*, lora.*, step.warmup_steps / zero_grad / keep_output / measure /
//    compile*, precision.master_weights, precision.autocast (generate runs the model in its
//    weights' dtype), precision.float8, parallel.* other than the defaults, deepspeed.*
//    (their defaults are not used: no optimizer is built, nothing is checkpointed);
//  - model.family other than hf-llama (GPT-2's v4.44 attention keeps a legacy tuple cache;
//    cs336 and megatron have no generate()), model.implementation other than hf, the MoE
//    rows (model.moe: transformers 5.x's code, which v4.45's generate() loop never ran),
//    architectures whose sliding layers build their own masks (gemma2, gemma3_text: their
//    v4.45 cache is HybridCache) unless generate.cache_classes is v5 with a dynamic or
//    offloaded cache;
//  - generate.cache quantized:int8 (QuantizedCache's HQQ backend) with the v4.45 cache classes
//    (its config's device / compute_dtype); a quantized cache whose q_group_size does not divide
//    kv_heads x head_dim, or with v5 classes on a model with sliding layers (5.x raises);
//    offloaded with generate.cache_classes v4.45 (v4.45's OffloadedCache; v5's
//    DynamicCache(offloading=True) is modelled); static with SDPA (the masked SDPA path's
//    .contiguous() copies);
//  - generate.cache_classes v5 (5.x's layered caches: sliding layers bounded to the window,
//    the lazy StaticLayer, DynamicCache(offloading=True)) with a static cache when a layer slides (StaticSlidingWindowLayer), with SDPA when a layer
//    slides, or a window below 2.
// generate.* given without step.kind generate is refused too.
//
// Contract: read_generate leaves Scenario::generate at its defaults unless step.kind is
// generate; every message names the key and the line it came from.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

// step.kind is generate (read before the batch section, which then has no seq_len of its own).
bool generate_requested(const Doc& d);
// The generate section and the refusals above; sets batch.seq_len and context_length.
void read_generate(const Doc& d, Scenario& s);
// generate.residual_length and generate.q_group_size (the quantized cache's cache_config) and
// their refusals (scenario/generate_quant_keys.cpp).
void read_quantized_cache(const Doc& d, Scenario& s);

}  // namespace memsim::scenario_detail

namespace memsim {
// For a Scenario changed after loading (memsim compare's policies, optimize's candidates):
// with step.kind generate, a checkpoint policy, LoRA or multi-GPU settings are refused by
// key (ScenarioError "SOURCE: KEY: why") instead of being ignored.
void require_generate_modelled(const Scenario& s);
}  // namespace memsim
