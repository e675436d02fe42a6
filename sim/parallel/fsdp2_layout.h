// Which fully_shard calls a stack makes over the Llama model, for sim/parallel/fsdp2.h.
//
// Default (the hf rows without parallel.accelerate_version; FSDP2's basic recipe, close to
// torchtitan's apply_fsdp before
// 83e69410, which also kept the last block gathered and resharded the root):
// fully_shard(block) for every block, then fully_shard(model) with reshard_after_forward
// left at its default, so the root (the embeddings, the final norm, the LM head) stays
// gathered from its pre-forward to the end of backward; the model is built on the GPU
// unless parallel.fsdp_init: cpu.
//
// torchtune (model.implementation torchtune; pytorch/torchtune v0.6.1,
// a6290a5b40758f13bca61c386bc8756a49ef417e): recipes/full_finetune_distributed.py
// _setup_model builds the model on the meta device, applies activation checkpointing to each
// TransformerSelfAttentionLayer, then torchtune/training/_distributed.py shard_model:
// fully_shard(m, reshard_after_forward=cfg.fsdp_reshard_after_forward,
// offload_policy=CPUOffloadPolicy() if fsdp_cpu_offload) for every module, bottom-up
// (reversed(named_modules())), that get_shard_conditions accepts (a name "...layers.<i>",
// or a name in custom_sharded_layers: the llama3 configs give ['tok_embeddings',
// 'output']), then the same fully_shard(model) for the root. No MixedPrecisionPolicy: the
// parameters are in the recipe dtype. rope_init() allocates the RoPE cache on the GPU, then
// load_from_full_model_state_dict (_DISTRIBUTED_STATE_DICT_API_IS_AVAILABLE is False in
// v0.6.1) does, per state-dict entry, full_tensor.to(dtype).to(device) and
// distribute_tensor (rank 0's chunk as the scatter output), the full copy dropped when the
// loop rebinds its name; model.load_state_dict(assign=True) makes the shards the
// parameters. train() starts with training.cleanup_before_training() (gc.collect,
// empty_cache, reset_peak_memory_stats).
// lora_finetune_distributed (lora.rank > 0) shards the same way; its configs give no
// custom_sharded_layers (the root keeps tok_embeddings and output), the adapters come from
// LoRALinear.to_empty before the base load, and every base weight is frozen.
// Accelerate (parallel.accelerate_version; huggingface/accelerate utils/fsdp_utils.py
// fsdp2_prepare_model, HF Trainer's FSDP2 path): fully_shard(layer, **fsdp2_kwargs) on every
// module the auto-wrap policy picks (transformer_based_wrap: the decoder layers,
// _no_split_modules), with fsdp2_kwargs["reshard_after_forward"] = the plugin's
// (parallel.reshard_after_forward, default True), then:
//  - v1.6.0 to v1.13.0 (v1.7.0 line 654, v1.13.0 line 697): fully_shard(model, **fsdp2_kwargs),
//    the plugin's reshard_after_forward passed to the root explicitly. torch 2.11's
//    _lazy_init keeps the root gathered only for the default None
//    (_auto_reshard_after_forward; docs/fsdp2.md "torch 2.11 against the version
//    modelled"), so with True the root (embeddings, final norm, lm_head) reshards after
//    forward and is gathered again by its pre-backward: root_reshards.
//  - v1.14.0 on (PR #4015, 60b5c258; v1.14.0 beb0672a lines 751-774; the same at 16cb6eb8,
//    1.15.0.dev0): before the root,
//    fully_shard(get_input_embeddings(), **fsdp2_kwargs) unless the input and output
//    embeddings share their weight, then fully_shard([final norm, lm_head],
//    reshard_after_forward=False) (_find_final_norm: the last child of
//    getattr(model, base_model_prefix) whose class name has "Norm": model.norm), then
//    fully_shard(model) without reshard_after_forward (the root, holding no parameter, keeps
//    the default). That is torchtitan's grouping with the embedding resharding as the
//    blocks do. On a PeftModel (lora.rank > 0) _find_final_norm finds no norm
//    (base_model_prefix and getattr(peft_model, "model") resolve through PEFT's __getattr__
//    to the CausalLM, whose children are model and lm_head): the tail is [lm_head] alone,
//    frozen, its post-backward once its input's gradient is complete; the root keeps
//    model.norm (docs/fsdp2.md "LoRA under 1.14"). With tied embeddings the tail is
//    [final norm, embed_tokens] (norm first, gathered at the embedding, post-forwarded after
//    the norm, kept), and lm_head.weight, which that call left the original parameter,
//    becomes the root's: a second gathered copy and gradient of the tied matrix, its shard
//    the embedding's after Accelerate's re-tie (scenario/accelerate_tied_head.h;
//    docs/fsdp2.md "Tied embeddings under 1.14").
// When a block's post-backward runs is not a layout question: sim/parallel/fsdp2.h (every
// layout: once the block's input gradient is complete, RegisterPostBackwardFunction).
#pragma once

#include "scenario/accelerate_tied_head.h"
#include "scenario/scenario.h"

namespace memsim {

struct Fsdp2Layout {
  bool separate_embedding = false;  // fully_shard(model.tok_embeddings / model.model.embed_tokens)
  bool separate_output = false;     // fully_shard(model.output / model.lm_head)
  // fully_shard(model, reshard_after_forward=True) given explicitly: torch 2.11's
  // _lazy_init honours it for the root (only the default None keeps the root gathered).
  bool root_reshards = false;
  // The meta-device build and load_from_full_model_state_dict (full copy, chunk, drop),
  // then cleanup_before_training's empty_cache.
  bool torchtune_load = false;
  // torchtune's output runs once per logits chunk (eight calls, per-call hooks); torchtitan's once.
  bool output_per_call = false;
  // torchtitan, Accelerate >= 1.14: the final norm is in the output's group
  // (fully_shard([norm, output])).
  bool norm_with_output = false;
  // torchtitan: the [norm, output] group keeps its parameters after forward unless the
  // policy is "always" (memsim: the blocks' parallel.reshard_after_forward never gives it);
  // Accelerate >= 1.14 always passes reshard_after_forward=False to it.
  bool output_keeps_after_forward = false;
  // lora_finetune_distributed (lora.rank > 0; recipes/lora_finetune_distributed.py @a6290a5b
  // lines 479-511): each LoRALinear's to_empty gives the adapters their shards after
  // shard_model, before the base state dict (which has no adapter) loads.
  bool lora_to_empty = false;
  // Accelerate >= 1.14 with tied embeddings (scenario/accelerate_tied_head.h): the
  // embedding's group is [model.norm, model.embed_tokens] (the final norm first, as listed),
  // gathered at the embedding, its post-forward after the norm (its last module) and kept
  // gathered; the root's parameter is lm_head.weight, whose shard is the embedding's.
  bool norm_with_embedding = false;
  bool embedding_keeps_after_forward = false;
  bool head_shares_embedding_shard = false;
};

inline Fsdp2Layout fsdp2_layout(const Scenario& s) {
  Fsdp2Layout l;
  if (const int32_t v = s.parallel.accelerate_version; v != 0) {  // hf rows (fsdp2_checks.cpp)
    if (v < 114) {
      l.root_reshards = s.parallel.reshard_after_forward;
    } else if (s.model.tied_embeddings) {  // scenario/accelerate_tied_head.h
      l.separate_embedding = true;
      l.norm_with_embedding = true;
      l.embedding_keeps_after_forward = true;  // reshard_after_forward=False
      l.head_shares_embedding_shard = true;
    } else {  // transformers' Llama family
      l.separate_embedding = true;
      l.separate_output = true;
      // A PeftModel (lora.rank > 0): _find_final_norm finds no norm, so the tail is
      // [lm_head] alone and the final norm stays in the root.
      l.norm_with_output = s.lora.rank == 0;
      l.output_keeps_after_forward = true;  // reshard_after_forward=False
    }
    return l;
  }
  if (s.model.arch.impl == graph::ModelImpl::torchtitan) {
    l.separate_embedding = true;
    l.separate_output = true;
    l.norm_with_output = true;
    l.output_keeps_after_forward = true;  // "default" and "never" (scenario/torchtitan_fsdp2_keys.h)
    return l;
  }
  if (s.model.arch.impl != graph::ModelImpl::torchtune) return l;
  l.output_per_call = true;
  l.separate_embedding = s.recipe.shard_tok_embeddings;
  l.separate_output = s.recipe.shard_output;
  l.root_reshards = s.parallel.reshard_after_forward;
  l.torchtune_load = true;
  l.lora_to_empty = s.lora.rank > 0;
  return l;
}

}  // namespace memsim
