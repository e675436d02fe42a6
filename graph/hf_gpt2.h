// Model family `hf-gpt2`: Hugging Face GPT2LMHeadModel in eager mode, written op by op
// against graph::Runtime.
//
// Mirrors transformers v4.44 (modeling_gpt2.py): Conv1D linears (addmm with bias, weight
// stored (in, out)), nn.LayerNorm (native_layer_norm: mean/rstd saved), NewGELU written
// as elementwise ops, learned positions wpe, lm_head tied to wte, GPT2Attention._attn
// (matmul q.k^T, / torch.full([], sqrt(hd)), torch.where with the per-layer `bias`
// buffer and a torch.full mask value, softmax, dropout, matmul with v, merge heads),
// use_cache=False. The loss is GPT2LMHeadModel's: logits[..., :-1, :].contiguous(),
// labels[..., 1:].contiguous(), CrossEntropyLoss (no upcast).
// Checked against real PyTorch (CPU) by tests/test_hf_fixtures.cpp.
//
// model.tied_embeddings false (not HF's GPT-2, but allowed) gives lm_head its own weight.
// Contract: construct() allocates parameters and buffers; forward(ids) emits the eager
// forward and returns the logits (B,S,V); loss(logits, labels) emits the loss.
// Python lifetimes are mirrored (inputs_embeds/position_embeds live until the
// transformer returns; a block's attn/mlp outputs until the block returns).
//
// Checkpointing (graph/checkpoint.h): the block loop runs through run_layers (HF
// checkpoints block.__call__ with the hidden states only); the candidate regions inside a
// block are the attention half (ln_1 + attn), the MLP half (ln_2 + mlp) and _attn
// (`selective`; its attn_weights output stays bound in GPT2Attention.forward). Checked
// against torch 1.13 on CPU by tests/test_checkpoint_fixtures.cpp.
//
// torch.autocast (set_autocast, graph/autocast.h; docs/autocast.md): Conv1D's addmm casts
// W, x and the bias (W and bias through the weight-cast cache) and returns bf16; the
// residual stream stays fp32 (bf16 branch + fp32 residual promotes), so LayerNorm runs
// in fp32 without casts; new-GELU's pow runs on an fp32 copy (CUDA's fp32 list) and
// promotes the rest of the activation to fp32; _attn's matmuls run on the bf16 q/k/v,
// the 0-d scale and mask value are bf16, softmax gets dtype=float32 (CUDA's
// fp32_set_opt_dtype) and `.type(value.dtype)` casts the probabilities back; the tied
// lm_head casts wte (cached); the loss's cross_entropy takes an fp32 copy of the logits.
// Checked against CPU autocast fixtures with CUDA's rules applied to pow and softmax
// (tests/test_hf_fixtures.cpp).
//
// LoRA / QLoRA (shape.lora, graph/lora.h): every parameter frozen, adapters on the
// targeted Conv1D modules (c_attn, attn.c_proj, c_fc, mlp.c_proj; PEFT's "c_proj" matches
// both); under QLoRA those four weights are NF4 (bitsandbytes Linear4bit with the bias
// kept in the compute dtype; the bias add is fused into the linear). Checked against
// torch 1.13 on CPU by tests/test_optim_lora_fixtures.cpp.
#pragma once

#include <vector>

#include "graph/hf_shape.h"
#include "graph/lora.h"
#include "graph/ops.h"

namespace memsim::graph {

class Autocast;  // graph/autocast.h

class HfGpt2Model {
 public:
  HfGpt2Model(Runtime& rt, const HfShape& shape) : rt_(rt), s_(shape), lora_(rt, s_) {}

  void construct();
  Tensor forward(const Tensor& ids);
  Tensor loss(const Tensor& logits, const Tensor& labels);
  Tensor block(int32_t layer, const Tensor& x);
  const HfShape& shape() const { return s_; }
  void set_autocast(Autocast* ac) { ac_ = ac; }

 private:
  struct LayerParams {
    int32_t ln1_w, ln1_b, attn_w, attn_b, aproj_w, aproj_b, ln2_w, ln2_b, fc_w, fc_b,
        mproj_w, mproj_b;
    Tensor causal_bias, masked_bias;  // buffers
    LoraAdapter ad[kGpt2Linears];
  };
  // Conv1D (NF4 under QLoRA) plus its LoRA adapter, if any.
  Tensor conv1d(const Tensor& x, int32_t w, int32_t b, int64_t d_in, int64_t d_out,
                const LoraAdapter& ad);
  Tensor ln(const Tensor& x, int32_t w, int32_t b);
  Tensor attention(const LayerParams& p, const Tensor& x);
  Tensor attn_core(const LayerParams& p, const Tensor& q, const Tensor& k, const Tensor& v,
                   Tensor& weights);
  Tensor mlp(const LayerParams& p, const Tensor& x);
  Tensor gelu_new(const Tensor& x);
  Tensor drop(const Tensor& x);
  Tensor gelu_new_autocast(const Tensor& x);
  bool autocast_on() const;
  // The element size of the activations the current op produces (low under autocast).
  uint64_t act_elem() const;

  Runtime& rt_;
  HfShape s_;
  LoraModules lora_;
  int32_t wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, lm_head_ = -1;  // lm_head_: untied only
  std::vector<LayerParams> layers_;
  Autocast* ac_ = nullptr;
};

}  // namespace memsim::graph
