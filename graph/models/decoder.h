// The Hugging Face decoder families (`hf-llama`, `hf-gpt2` and every architecture row of
// graph/models/decoder_spec.h), written op by op against graph::Runtime from one shared module
// library: a model is a DecoderArch row, not a copy of another model's code.
//
// The modules mirror transformers' code (v4.44-4.45 for Llama and GPT-2; each knob's
// source in docs/decoder-modules.md) with use_cache=False:
//  - embedding (decoder.cpp): embed_tokens; Gemma's `* normalizer` (sqrt(D), a CPU 0-d
//    scalar: no device bytes); GPT-2's learned positions (wpe) and embd dropout.
//  - masks and positions (decoder.cpp): for eager attention with an additive mask,
//    _update_causal_mask's (S, S+1) float mask (full, triu, arange > cache_position in
//    place, expand) living until the model returns; with SDPA is_causal instead. RoPE's
//    cos/sin (1, S, rotary_dim) computed once per forward under no_grad. GPT-2's per-layer
//    bool `bias` buffers for its where-masked core.
//  - norms (decoder_modules.cpp): LlamaRMSNorm, GemmaRMSNorm ((1 + w) in fp32), LayerNorm
//    with bias; pre, post (OLMo-2) and sandwich (Gemma-2/3) placement (decoder.cpp).
//  - projections (decoder_modules.cpp): nn.Linear (mm; addmm with a bias), Conv1D
//    (addmm, W stored (in, out)), each with its LoRA adapter and NF4 base under QLoRA.
//  - attention (decoder_attention.cpp): separate or fused q/k/v, biases, q/k RMSNorm per
//    head or over the projection, RoPE (rotate_half), repeat_kv, eager cores (additive
//    mask or GPT-2's where on its buffer, optional logit soft-capping) or SDPA kernels
//    (flash, mem-efficient), merge heads, o_proj.
//  - MLP (decoder_modules.cpp): GLU (SwiGLU, GeGLU; fused gate_up) or fc-act-fc (GPT-2's
//    NewGELU written as elementwise ops), biases.
//  - head and loss (decoder.cpp): final norm, lm_head tied or untied, final-logit
//    soft-capping, logits.float() where the code upcasts, the shifted cross entropy.
//  - losses outside the head (decoder_losses.cpp; loss.impl, docs/losses.md): torchtune's
//    chunked output and Liger-Kernel's patched forward with its fused linear cross entropy.
// Python lifetimes are mirrored (a frame's locals die at return in declaration order;
// expression temporaries right after their consumer). Checked against real PyTorch (CPU
// stand-ins, tests/test_hf_fixtures.cpp and tests/test_decoder_arch.cpp) and H100 traces
// (tests/test_h100_runs.cpp).
//
// Checkpointing (graph/checkpoint.h): the decoder loop runs through run_layers with the
// tensors HF's checkpoint call passes (causal mask, cache_position, cos, sin), so `full`
// is gradient_checkpointing_enable(); the candidate regions inside a layer are the
// attention half (its norms + self_attn), the MLP half (its norms + mlp) and the
// attention core.
//
// torch.autocast (set_autocast, graph/autocast.h; docs/autocast.md): projections cast
// their weights through the weight-cast cache, the residual stream stays fp32, softmax
// gets dtype=float32, the loss takes an fp32 copy (hf-gpt2) or logits.float() (Llama).
//
// Contract: construct() allocates parameters and buffers; forward(ids) emits the forward
// and returns the logits (B,S,V); loss(logits, labels) emits the causal-LM loss.
#pragma once

#include <string>
#include <vector>

#include "graph/models/hf_shape.h"
#include "graph/models/lora.h"
#include "graph/ops/ops.h"

namespace memsim::graph {

class Autocast;  // graph/autocast.h
class KvCache;   // graph/models/kv_cache.h

// The parameter names of a non-HF stack's Llama modules (model.implementation; decoder_impl.cpp).
struct StackParamNames {
  const char *wq, *wk, *wv, *wo, *w1, *w2, *w3, *attn_norm, *ffn_norm;
};

class DecoderModel {
 public:
  DecoderModel(Runtime& rt, const HfShape& shape) : rt_(rt), s_(shape), lora_(rt, s_) {}

  void construct();
  Tensor forward(const Tensor& ids);
  // The loop dropped its output name: torchtune's model also lets go of the chunk list it
  // returned (the other rows hold nothing of their output).
  void drop_output() { chunks_.clear(); }
  Tensor loss(const Tensor& logits, const Tensor& labels);
  // The losses computed outside the ForCausalLM head (loss.impl; docs/losses.md). The
  // base model's last hidden state (after the final norm: ForCausalLM's `outputs[0]`);
  // head_w is set to the handle the head projects with (lm_head.weight, or the tied
  // embedding's lm_head use).
  Tensor forward_hidden(const Tensor& ids, Tensor& head_w);
  // torchtune's TransformerDecoder.chunked_output: `[output(c) for c in
  // h.tensor_split(chunks, dim=1)]` (graph/models/chunked_loss.h): per chunk a slice view
  // of the hidden state (SliceBackward0), copied by F.linear's reshape when B > 1 and it
  // is not contiguous (no copy under autocast: the cast's output is contiguous), the
  // head projection and final-logit soft-capping; no logits.float() (the loss upcasts).
  // The (B*S_i, V) chunks in order; seq_pieces receives the S_i.
  std::vector<Tensor> forward_chunked(const Tensor& ids, int64_t chunks,
                                      std::vector<uint64_t>& seq_pieces);
  // Liger-Kernel's patched ForCausalLM.forward in training with labels (lce_forward and
  // LigerForCausalLMLoss, graph/ops/ops_liger.h): the hidden state, labels padded with
  // -100 and shifted (two int64 temporaries), the fused linear cross entropy on
  // hidden.view(-1, D) with the head weight (and final_logit_softcapping, which the
  // kernel applies in registers). No logits. Returns the loss; the hidden state dies here.
  Tensor forward_liger(const Tensor& ids, const Tensor& labels);
  const HfShape& shape() const { return s_; }
  // torch.autocast region owner (graph/autocast.h); nullptr = never.
  void set_autocast(Autocast* ac) { ac_ = ac; }
  // FSDP1 MixedPrecision(buffer_dtype=...) at the root's lazy init (the caller's timing:
  // pytorch/pytorch @00ae0bc9 torch/distributed/fsdp/_runtime_utils.py
  // _cast_buffers_to_dtype_and_device, `buffer.data = buffer.to(dtype)`): every rotary
  // inv_freq buffer gets a new `elem`-byte copy and its fp32 storage is freed, in
  // _get_buffers_and_dtypes_for_computation's order (FSDP states bottom-up: the last
  // layer's first, the root's last). From then on each rotary forward's
  // `self.inv_freq[None, :, None].float()` is a new fp32 copy (rope_tables).
  void cast_rotary_buffers(uint64_t elem);

  // --- generation (decoder_generate.cpp; issue #17, sim/step/generate.h) -----------------
  // What HF generate passes one forward of a ForCausalLM (LlamaForCausalLM.forward v4.45
  // with a cache): the (B, mask_len) int64 attention mask, the StaticCache's 4-D mask that
  // prepare_inputs_for_generation built (else null), position_ids (B, S) and
  // cache_position (S) (owned by the loop), num_logits_to_keep (0: every position).
  struct GenerateInputs {
    int64_t mask_len = 0;
    const Tensor* mask4d = nullptr;
    const Tensor* position_ids = nullptr;
    const Tensor* cache_position = nullptr;
    int64_t logits_to_keep = 1;
  };
  // The cache the attentions update (nullptr: training, no cache).
  void set_cache(KvCache* cache) { cache_ = cache; }
  // This forward's query length and the key length the attention sees (hf_shape.h keys),
  // with position_ids of `batch` rows.
  void set_generate_step(int64_t seq, int64_t keys);
  // One forward of generate: the logits (B, keep, V), fp32 where the row upcasts in forward.
  Tensor forward_generate(const Tensor& ids, const GenerateInputs& in);
  // _prepare_4d_causal_attention_mask_with_cache_position over a 2-D attention mask of
  // `mask_len` columns: the (B, 1, S, target) mask in the model's dtype (v4.45 Llama; the
  // exclude variant of Mistral v4.45 / Qwen3 v4.51 for MaskBuild::exclude).
  // fold_window false: a full-attention layer type's mask (generate.cache_classes v5) in a
  // model whose other layers fold the window into theirs.
  Tensor generate_mask(uint64_t target, uint64_t mask_len, bool fold_window = true);

 private:
  // A projection module: weight (and bias) parameter ids, its LoRA slot (bit of
  // HfLora::targets; -1: never adapted).
  struct Proj {
    int32_t w = -1, b = -1;
    int64_t in = 0, out = 0;
    int32_t lora = -1;
  };
  // Norm slots of a layer (by placement): pre = {input, post_attention}; post =
  // {post_attention, post_feedforward}; sandwich = all four.
  enum NormSlot { kInputNorm, kPostAttnNorm, kPreFfNorm, kPostFfNorm, kNormSlots };
  struct Norm {
    int32_t w = -1, b = -1;  // b: LayerNorm only
  };
  struct LayerParams {
    Proj q, k, v, qkv, o, gate, up, gate_up, down;
    Tensor inv_freq;  // a per-attention rotary module's buffer (RopeAt::layer, attn_rope_buffer)
    Norm norm[kNormSlots];
    Norm q_norm, k_norm;
    Tensor causal_bias, masked_bias;  // GPT-2's buffers (EagerCore::where_buffer)
    LoraAdapter ad[kLoraSlots];  // by LlamaLinear / MlaLinear
    // A mixture-of-experts layer (DecoderArch::moe; decoder_moe.cpp): the router's
    // (E, D) weight, the experts' 3-D gate_up_proj (E, 2F, D) and down_proj (E, D, F),
    // Qwen2-MoE's shared expert (gate/up/down as p.gate/p.up/p.down) and its (1, D) gate.
    bool moe = false;
    int32_t router = -1, experts_gate_up = -1, experts_down = -1;
    // lora.target_parameters (graph/models/moe_param_lora.h): ParamWrapper's lora_A / lora_B
    // on gate_up_proj (0) and down_proj (1).
    LoraAdapter experts_ad[2];
    Proj shared_gate_proj;
    Tensor score_bias;  // DeepSeek-V3's e_score_correction_bias buffer (E fp32)
    // Multi-head latent attention (DecoderArch::mla; decoder_mla.cpp): q_a_proj / q_b_proj
    // (or p.q as q_proj), kv_a_proj_with_mqa / kv_b_proj, their RMSNorms; p.o is o_proj.
    Proj q_a, q_b, kv_a, kv_b;
    Norm q_a_norm, kv_a_norm;
  };
  const DecoderArch& arch() const { return s_.arch; }

  // --- construction (decoder.cpp) ---
  Proj add_proj(uint64_t out, uint64_t in, const std::string& prefix, const char* module,
                bool bias, int32_t lora);
  Norm add_norm(uint64_t width, const std::string& prefix, const char* module);
  const std::string& param_name(const std::string& prefix, const char* module, const char* suffix);
  void add_adapters();
  void add_experts_adapters(LayerParams& p, const std::string& prefix);  // decoder_moe.cpp
  Tensor add_inv_freq();  // a rotary module's inv_freq buffer, built on the device

  // --- masks and rotary tables (decoder.cpp) ---
  Tensor causal_mask();
  // One (cos, sin) table under no_grad: `scaled` multiplies by attention_scaling (the
  // model-level LlamaRotaryEmbedding; GemmaRotaryEmbedding in the attention does not).
  void rope_tables(bool scaled, Tensor& cos, Tensor& sin);
  // DeepseekV2RotaryEmbedding.forward's complex64 freqs_cis (decoder_mla.cpp).
  Tensor rope_table_complex();
  uint64_t mask_keys() const { return s_.seq + (arch().mask_target_s ? 0 : 1); }

  // --- modules (decoder_modules.cpp) ---
  // x is LinearInput::folded (an N-D activation) unless a block set linear_input_.
  Tensor project(const Tensor& x, const LayerParams& p, const Proj& pr);
  // rows 0: the whole batch (s_.rows()).
  Tensor lm_linear(const Tensor& x, int32_t w, int64_t d_in, int64_t d_out, uint64_t rows = 0);
  Tensor norm(const Tensor& x, const Norm& n, uint64_t rows, uint64_t width);
  // A q/k norm on a projection output (low under autocast: rms_norm's in_elem).
  Tensor qk_norm(const Tensor& x, const Norm& n, uint64_t rows, uint64_t width);
  Tensor rms_norm(const Tensor& x, int32_t w, uint64_t rows, uint64_t in_elem = 0);
  Tensor gemma_rms_norm(const Tensor& x, int32_t w, uint64_t rows, uint64_t width);
  Tensor mlp(const LayerParams& p, const Tensor& x);
  Tensor activation(const Tensor& x);
  Tensor gelu_new(const Tensor& x);
  Tensor gelu_new_autocast(const Tensor& x);
  Tensor drop(const Tensor& x);        // residual / embedding dropout (GPT-2)
  Tensor softcap(Tensor x);            // / c, tanh, * c (x moved in: freed after / c)

  // --- mixture of experts (decoder_moe.cpp; docs/moe.md) ---
  void construct_moe(LayerParams& p, const std::string& prefix);
  // The sparse MoE block on the normed (B,S,D) hidden states: router, experts, shared
  // expert; returns the block's (B,S,D) output.
  Tensor moe_block(int32_t l, const LayerParams& p, const Tensor& x);
  // The router: fills the fp32 top-k weights (T,K) and the int64 indices (T,K); returns
  // what the router hands back as router_logits (recorded for the aux loss).
  Tensor moe_router(const LayerParams& p, const Tensor& x, Tensor& weights, Tensor& indices);
  // F.linear(a, W[expert]) of the eager experts under autocast (decoder_moe.cpp).
  Tensor expert_linear_autocast(const Tensor& a, const Tensor& w_view, uint64_t rows, uint64_t d_in,
                                uint64_t d_out, double flops);
  Tensor moe_experts_eager(const LayerParams& p, const Tensor& x, const Tensor& indices,
                           const Tensor& weights, const std::vector<int64_t>& counts);
  Tensor moe_experts_batched(const LayerParams& p, const Tensor& x, const Tensor& indices,
                             const Tensor& weights);
  Tensor moe_experts_grouped(const LayerParams& p, const Tensor& x, const Tensor& indices,
                             const Tensor& weights);
  // DeepSeek-V3 (decoder_moe_deepseek.cpp; docs/deepseek.md): DeepseekV3MoE's registration
  // (experts, gate with its bias buffer, shared_experts), its router, and its block.
  void construct_moe_deepseek(LayerParams& p, const std::string& prefix);
  Tensor moe_router_deepseek(const LayerParams& p, const Tensor& x, Tensor& weights, Tensor& indices);
  Tensor moe_block_deepseek(int32_t l, const LayerParams& p, const Tensor& x);
  // DeepseekV2TopkRouter (transformers 5.17.0; decoder_moe_deepseek_v2.cpp).
  Tensor moe_router_deepseek_v2(const LayerParams& p, const Tensor& x, Tensor& weights, Tensor& indices);
  // load_balancing_loss_func over the recorded router outputs; adds coef * aux to `loss`.
  Tensor moe_aux_loss(const Tensor& loss);
  int64_t moe_layer_index(int32_t l) const;  // l's rank among the MoE layers

  // --- attention (decoder_attention.cpp) ---
  Tensor attention(const LayerParams& p, const Tensor& x, const Tensor& mask, const Tensor& cos,
                   const Tensor& sin);
  void project_qkv(const LayerParams& p, const Tensor& x, Tensor& q, Tensor& k, Tensor& v,
                   Tensor& keep);
  // eager_attention_forward / sdpa_attention_forward (v4.50+): repeat_kv, the core and
  // transpose(1, 2).contiguous() in one function (the `selective` region).
  Tensor attention_function(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);
  Tensor core(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);
  // F.scaled_dot_product_attention on the fused kernel of s_.attention (flash or
  // mem-efficient), with autocast's casts of q/k/v when it is on.
  Tensor sdpa_kernel(const Tensor& q, const Tensor& k, const Tensor& v, double flops);
  Tensor attention_gpt2(const LayerParams& p, const Tensor& x);
  // DeepseekV3Attention and DeepseekV2Attention as transformers 5.17.0 writes them
  // (multi-head latent attention; decoder_mla.cpp). For DeepSeek-V2 `cos` is the complex
  // table (rope_table_complex) and `sin` is unused.
  void construct_mla(LayerParams& p, const std::string& prefix);
  Tensor attention_mla(const LayerParams& p, const Tensor& x, const Tensor& mask, const Tensor& cos,
                       const Tensor& sin);
  Tensor where_core(const LayerParams& p, const Tensor& q, const Tensor& k, const Tensor& v,
                    Tensor& weights);

  // --- layers (decoder.cpp) ---
  Tensor layer(int32_t l, const Tensor& x, const std::vector<Tensor>& extra);
  Tensor block_gpt2(int32_t l, const Tensor& x);
  Tensor attn_half(int32_t l, const std::vector<Tensor>& in);
  Tensor mlp_half(int32_t l, const std::vector<Tensor>& in);
  Tensor gpt2_hidden(const Tensor& ids, Tensor& head_w);
  Tensor gpt2_head(const Tensor& hidden, const Tensor& head_w, uint64_t rows);
  Tensor head_projection(const Tensor& hidden, const Tensor& head_w, uint64_t rows);
  Tensor logits_head(const Tensor& hidden, const Tensor& head_w, uint64_t rows);

  // --- other stacks' model code (decoder_impl.cpp; model.implementation) ---
  bool titan() const;
  uint64_t freqs_bytes() const;
  void construct_titan();
  // Both stacks' Llama parameters, named by `names` (decoder_impl.cpp).
  void add_stack_parameters(const StackParamNames& names);
  Tensor forward_titan(const Tensor& ids);
  Tensor attention_titan(const LayerParams& p, const Tensor& x);
  Tensor loss_titan(const Tensor& logits, const Tensor& labels);
  bool tune() const;
  void construct_tune();
  Tensor forward_tune(const Tensor& ids);
  Tensor attention_tune(const LayerParams& p, const Tensor& x);
  Tensor tune_rms_norm(const Tensor& x, int32_t w, uint64_t rows);
  Tensor loss_tune(const Tensor& labels);  // CEWithChunkedOutputLoss (the model's default loss)
  // LitGPT (decoder_litgpt.cpp): GPT, Block, CausalSelfAttention, RMSNorm, LLaMAMLP.
  bool litgpt() const;
  uint64_t lit_cache_elem() const;  // the element size of the cos/sin buffers after setup
  void construct_litgpt();
  void lit_rope_cache(uint64_t len, uint64_t cast_elem);
  Tensor forward_litgpt(const Tensor& ids);
  Tensor attention_litgpt(const LayerParams& p, const Tensor& x);
  Tensor lit_rms_norm(const Tensor& x, int32_t w, uint64_t rows);
  Tensor mlp_litgpt(const LayerParams& p, const Tensor& x);
  Tensor loss_litgpt(const Tensor& logits);
  // LitGPT LoRA (finetune/lora.py): the lm_head_chunk_size=128 list and its loss.
  static constexpr uint64_t kLitHeadChunk = 128;
  Tensor lit_chunked_head(Tensor h);
  Tensor lit_lora_loss();

  bool autocast_on() const;
  uint64_t act_elem() const;  // the element size the current op produces (low under autocast)

  Runtime& rt_;
  HfShape s_;
  Autocast* ac_ = nullptr;
  LoraModules lora_;
  // What project()'s x is (graph/ops/linear_input.h): flat inside the MoE block, whose
  // router, shared expert and shared gate read hidden_states.view(-1, D).
  LinearInput linear_input_ = LinearInput::folded;
  int32_t embed_ = -1, wpe_ = -1, lm_head_ = -1;
  Norm final_norm_;
  std::vector<LayerParams> layers_;
  Tensor inv_freq_, inv_freq_local_;
  uint64_t inv_freq_elem_ = 4;  // the inv_freq buffers' dtype (cast_rotary_buffers)
  Tensor freqs_cis_;  // torchtitan's complex64 RoPE table (decoder_impl.cpp)
  Tensor rope_theta_, rope_cache_;  // torchtune's RotaryPositionalEmbeddings buffers
  std::vector<Tensor> chunks_;      // torchtune's chunked output (forward returns chunks_[0])
  Tensor ignore_labels_;            // torchtune recipe's ignore_labels_cache (B, 1) int64
  Tensor lit_cos_, lit_sin_;        // LitGPT's non-persistent cos/sin buffers
  std::string name_;  // param_name's buffer
  // output_router_logits: each MoE layer's router output, held by the model output until
  // the loss has used them (decoder_moe.cpp).
  std::vector<Tensor> router_logits_;
  // Generation: the cache the attentions update, and whether the key/value it returned
  // last are dense (B, KV, T, hd) tensors (kv_cache.h).
  KvCache* cache_ = nullptr;
  bool kv_dense_ = false;
  bool one_query() const { return cache_ != nullptr && s_.seq == 1; }
  // Context parallelism: the modelled rank's ring output is contiguous (B,H,L,hd), so the
  // attention's transpose(1, 2).contiguous() copies it (graph/ops/ops_ring.h
  // ring_output_contiguous: a rank whose last ring step is partial).
  bool ring_copies_output() const { return s_.cp > 1 && s_.cp_rank + 1 < s_.cp; }
  // The decoder layer's `self_attn_weights` (v4.50+ attention functions return the
  // probabilities; the layer keeps them until it returns). Set by layer() around its
  // attention half; never written by a re-run in backward.
  Tensor* layer_weights_ = nullptr;
};

}  // namespace memsim::graph
