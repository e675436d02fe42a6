// Model family `hf-llama`: Hugging Face LlamaForCausalLM, written op by op against
// graph::Runtime.
//
// Mirrors transformers v4.45 (modeling_llama.py) with use_cache=False:
//  - LlamaModel: embed_tokens; cache_position = arange(S); for eager attention
//    _update_causal_mask builds a (S, S+1) float mask (full, triu, arange > cache_position
//    in place, expand) that lives until the model returns (SDPA with no padding mask
//    passes is_causal instead: no mask); LlamaRotaryEmbedding computes cos/sin (1, S, hd)
//    once per forward from inv_freq under no_grad (position_ids.float(), matmul, cat, cos,
//    sin, * attention_scaling).
//  - LlamaRMSNorm as written: to(float32), pow(2).mean(-1, keepdim), * rsqrt(var + eps),
//    weight * hidden.to(input_dtype).
//  - LlamaAttention eager: q/k/v nn.Linear (no bias) = mm, view + transpose, RoPE with
//    rotate_half (q*cos + cat(-x2, x1)*sin), repeat_kv (expand + reshape: a copy when
//    kv_heads < heads), matmul(q, k^T) / sqrt(hd) + mask, softmax(dtype=float32).to(dtype),
//    dropout, matmul with v, transpose.contiguous(), o_proj.
//    LlamaSdpaAttention: the same up to repeat_kv, then F.scaled_dot_product_attention
//    (flash or mem-efficient kernel, is_causal), transpose.contiguous() (no copy), o_proj.
//  - LlamaMLP: down(silu(gate(x)) * up(x)); lm_head (tied to embed_tokens when
//    model.tied_embeddings, as Llama 3.2 1B/3B do); logits.float().
//  - Loss (LlamaForCausalLM): shift_logits = logits[..., :-1, :].contiguous(), shifted
//    labels, CrossEntropyLoss on the fp32 logits.
// Checked against real PyTorch (CPU, eager) by tests/test_hf_fixtures.cpp; the SDPA
// kernels cannot be checked there (torch 1.13 has no F.scaled_dot_product_attention).
//
// Checkpointing (graph/checkpoint.h): the decoder loop runs through run_layers with the
// tensors HF's checkpoint call passes (causal mask, cache_position / position_ids, cos and
// sin), so `full` is gradient_checkpointing_enable(); the candidate regions inside a layer
// are the attention half (input_layernorm + self_attn), the MLP half
// (post_attention_layernorm + mlp) and the attention core (eager: matmul .. matmul; SDPA:
// the kernel call). HF passes use_reentrant=True by default (transformers >= 4.35):
// scenario key checkpoint.reentrant. Checked against torch 1.13 on CPU, both modes, by
// tests/test_checkpoint_fixtures.cpp.
//
// LoRA / QLoRA (shape.lora, graph/lora.h): every parameter frozen, adapters on the
// targeted decoder linears (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj);
// under QLoRA those seven weights are NF4. Checked against torch 1.13 on CPU by
// tests/test_optim_lora_fixtures.cpp.
#pragma once

#include <vector>

#include "graph/hf_shape.h"
#include "graph/lora.h"
#include "graph/ops.h"

namespace memsim::graph {

class Autocast;  // graph/autocast.h

class HfLlamaModel {
 public:
  HfLlamaModel(Runtime& rt, const HfShape& shape) : rt_(rt), s_(shape), lora_(rt, s_) {}

  void construct();
  Tensor forward(const Tensor& ids);
  Tensor loss(const Tensor& logits, const Tensor& labels);
  const HfShape& shape() const { return s_; }
  // torch.autocast region owner (graph/autocast.h); eager attention only. nullptr = never.
  void set_autocast(Autocast* ac) { ac_ = ac; }

 private:
  struct LayerParams {
    int32_t q, k, v, o, gate, up, down, ln1, ln2;
    LoraAdapter ad[kLlamaLinears];
  };
  // One LlamaDecoderLayer; extra = {causal_mask, cache_position, cos, sin}.
  Tensor layer(int32_t l, const Tensor& x, const std::vector<Tensor>& extra);
  Tensor linear(const Tensor& x, int32_t w, int64_t d_in, int64_t d_out);
  // A decoder linear: the base layer (NF4 under QLoRA) plus its LoRA adapter, if any.
  Tensor proj(const Tensor& x, const LayerParams& p, LlamaLinear which, int32_t w, int64_t d_in,
              int64_t d_out);
  Tensor rmsnorm(const Tensor& x, int32_t w);
  Tensor attention(const LayerParams& p, const Tensor& x, const Tensor& mask,
                   const Tensor& cos, const Tensor& sin);
  Tensor mlp(const LayerParams& p, const Tensor& x);
  Tensor eager_core(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);

  bool autocast_on() const;

  Runtime& rt_;
  HfShape s_;
  Autocast* ac_ = nullptr;
  LoraModules lora_;
  int32_t embed_ = -1, norm_ = -1, lm_head_ = -1;
  std::vector<LayerParams> layers_;
  Tensor inv_freq_;
};

}  // namespace memsim::graph
