// A Hugging Face decoder described by data: which shared modules (graph/models/decoder.h) a
// model's layers are made of. One row of this struct is a model architecture
// (transformers' model_type); the scenario reader fills it from a preset, from a
// config.json (scenario/hf_config) or from model.* keys.
//
// Contract: plain data, no behaviour. Every knob names the transformers code it stands
// for; a value's default is what LlamaForCausalLM (transformers v4.45) does, so a
// default-constructed DecoderArch is Llama. Knobs change only which ops run and their
// sizes, never the numbers a kernel computes (memsim has no weights).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace memsim::graph {

// The normalisation module.
enum class NormKind : uint8_t {
  rms,           // LlamaRMSNorm: x.float(), pow, mean, rsqrt, *, .to(dtype), weight *
  rms_one_plus,  // GemmaRMSNorm: x.float(), ..., * (1 + weight.float()), .type_as(x)
  layer,         // nn.LayerNorm with bias (native_layer_norm; GPT-2)
};

// Where a layer's norms sit.
enum class NormPlacement : uint8_t {
  pre,       // x + attn(norm1(x)); x + mlp(norm2(x))                          (Llama)
  post,      // x + norm1(attn(x)); x + norm2(mlp(x))                           (OLMo-2)
  sandwich,  // x + norm2(attn(norm1(x))); x + norm4(mlp(norm3(x)))             (Gemma-2/3)
};

// RMSNorm on queries and keys before RoPE.
enum class QkNorm : uint8_t {
  none,
  head,  // per head over head_dim, after the view (Qwen3, Gemma-3: q_norm / k_norm)
  full,  // over the whole projection output, before the view (OLMo-2)
};

enum class MlpKind : uint8_t {
  glu,    // down(act(gate(x)) * up(x))                        (SwiGLU, GeGLU)
  plain,  // fc2(act(fc1(x)))                                  (GPT-2)
};

enum class Activation : uint8_t {
  silu,       // F.silu (saves its input)
  gelu_tanh,  // gelu_pytorch_tanh: F.gelu(approximate="tanh"), one op (Gemma)
  gelu,       // F.gelu exact, one op
  gelu_new,   // GPT-2's NewGELUActivation, written as elementwise ops
};

enum class Positions : uint8_t {
  rotary,   // RoPE tables computed per forward (LlamaRotaryEmbedding)
  learned,  // a learned position table added to the embeddings (GPT-2's wpe)
};

// How a projection is written.
enum class LinearKind : uint8_t {
  linear,  // nn.Linear: mm without bias, addmm with one (weight stored (out, in))
  conv1d,  // transformers' Conv1D: addmm(bias, x, W) with W stored (in, out) (GPT-2)
};

// The attention core of eager attention.
enum class EagerCore : uint8_t {
  additive_mask,  // scores / sqrt(hd) + causal_mask (float), softmax(fp32)  (Llama)
  where_buffer,   // scores / full(sqrt(hd)), where(bias buffer, ., min), softmax (GPT-2)
};

// The transformers model code the forward follows (module registration order, the
// embedding/mask/position preamble, the residual adds and local lifetimes).
enum class ModelCode : uint8_t {
  llama,  // LlamaModel / LlamaDecoderLayer (and the Llama-lineage models): `residual + h`,
          // each branch output dies at its add; norms registered after attention and MLP
  gpt2,   // GPT2Model / GPT2Block: `h + residual`, the branch outputs live until the block
          // returns; ln_1, attn, ln_2, mlp registered in that order
};

// --- Placement: where a model's transformers code puts the same pieces (each names the
// version and function it comes from; docs/decoder-modules.md §4). Memory-visible.

enum class RopeAt : uint8_t {
  model,  // one (cos, sin) table per forward, passed to every layer (Llama v4.45)
  layer,  // every attention computes its own after the projections (Gemma, Mistral, Phi-3)
};
enum class MaskBuild : uint8_t {
  triu,     // full, triu, arange > cache_position in place (Llama v4.45)
  exclude,  // full, exclude = arange > cache_position [| window], mul_ (Mistral, Qwen3)
};
enum class SlidingAt : uint8_t {
  mask,   // the window is folded into the one causal mask (Mistral, Qwen3)
  layer,  // each sliding layer builds tril(ones_like) + where over the mask (Gemma-2/3)
};
enum class QkNormAt : uint8_t {
  view,        // on q_proj(x).view(B,S,h,hd), before the transpose; v_proj after (Qwen3)
  transposed,  // on the (B,h,S,hd) view after all three projections (Gemma-3)
};
enum class EmbedScaleAt : uint8_t {
  model,      // `hidden = inputs_embeds * normalizer` in the model (Gemma/Gemma-2 v4.45)
  embedding,  // inside the embedding module; the raw embedding dies at once (Gemma-3)
};
enum class LogitsFloat : uint8_t {
  forward,  // logits.float() in ForCausalLM.forward (Llama v4.45)
  loss,     // in the loss function (ForCausalLMLoss, v4.47+)
  none,     // never (StableLM, GPT-2)
};
enum class CausalLoss : uint8_t {
  shift,  // logits[..., :-1, :].contiguous(), labels[..., 1:] (v4.45)
  pad,    // labels padded by one, logits used whole (ForCausalLMLoss v4.49+)
};
enum class SandwichOrder : uint8_t {
  gemma2,  // input, pre_feedforward, post_feedforward, post_attention
  gemma3,  // input, post_attention, pre_feedforward, post_feedforward
};

// Whose model code the row runs (model.implementation; graph/models/decoder_impl.cpp,
// docs/implementations.md): the same architecture written by another training stack
// allocates and saves other tensors. hf is transformers' (everything above); the others
// replace the prologue, the norms, RoPE, the attention around its kernel, the head and
// the loss call site, and are Llama rows only (scenario/arch_checks.cpp refuses the rest).
enum class ModelImpl : uint8_t {
  hf,          // transformers (the knobs and placements of this file)
  torchtitan,  // torchtitan/models/llama3/model/model.py (5077be6e): nn.RMSNorm, complex
               // RoPE on a freqs_cis buffer, SDPA is_causal, cross_entropy(pred.float())
  torchtune,   // torchtune/modules (v0.6.1): cached RoPE, fp32 RMSNorm, the chunked output
               // (8) with CEWithChunkedOutputLoss
  litgpt,      // litgpt/model.py (v0.5.13) with finetune/full.py under Fabric: fused qkv,
               // cached cos/sin, its fp32 RMSNorm, chunked_cross_entropy (decoder_litgpt.cpp)
};

// --- Mixture of experts (graph/models/decoder_moe.cpp, docs/moe.md; issue #15) ------------

// The router's score function over the (tokens, experts) logits.
enum class MoeScore : uint8_t {
  softmax,  // softmax in fp32 (every HF MoE row here)
  sigmoid,  // sigmoid in fp32 (DeepSeek-V3's scores: MoeRouterCode::deepseek_v3 adds its group-limited choice)
};
// How the router's transformers code is written (memory-visible: which tensors it keeps).
enum class MoeRouterCode : uint8_t {
  qwen,     // Qwen2Moe/Qwen3Moe/OlmoeTopKRouter (5.17): router_probs = softmax(logits,
            // dtype=float), topk, [/= sum], .to(router_logits.dtype); the raw logits returned
  mixtral,  // MixtralTopKRouter (5.17): router_probs = softmax(logits.float()); the raw logits
            // are returned (and recorded for the aux loss); always renormalised, fp32 weights
  deepseek_v3,  // DeepseekV3TopkRouter.forward (transformers 5.17.0: routes itself): fp32
                // F.linear, sigmoid, + e_score_correction_bias, n_group / topk_group
                // group-limited top-k, gather, [/ (sum + 1e-20)], * routed_scaling_factor
                // (graph/models/decoder_moe_deepseek.cpp)
  deepseek_v2,  // DeepseekV2TopkRouter.forward (transformers 5.17.0): fp32 F.linear, softmax,
                // greedy top-k or group_limited_greedy (group max, masked_fill 0.0, top-k),
                // * routed_scaling_factor; no renormalisation, no bias buffer
                // (graph/models/decoder_moe_deepseek_v2.cpp)
};
// Which expert code runs (config._experts_implementation, transformers v5 integrations/moe.py).
enum class ExpertsImpl : uint8_t {
  eager,       // the loop over the experts that got tokens
  batched_mm,  // every (token, slot) gathers its expert's weights: bmm on (T*K) weight copies
  grouped_mm,  // argsort by expert, torch._grouped_mm on the 3-D weights
};
// moe.routing: the assumption that replaces the data-dependent router choice.
enum class MoeRouting : uint8_t {
  balanced,    // T*K slots spread evenly: floor(T*K/E) each, the first (T*K mod E) experts +1
  worst_case,  // every token to the same top_k experts (0..K-1): T each, the rest none
  skew,        // Zipf-like: expert e gets a share (e+1)^-alpha, capped at T (see moe_routing.h)
  counts,      // measured tokens per expert (one list for every layer, or one per MoE layer)
};

struct MoeSpec {
  int64_t experts = 0;             // 0: a dense model (everything below is unused)
  int64_t top_k = 0;
  int64_t expert_d_ff = 0;         // each routed expert's intermediate size
  int64_t shared_d_ff = 0;         // the shared expert's intermediate size (0: none); Qwen2-MoE's
                                   // shared_expert with its sigmoid shared_expert_gate
  int64_t first_dense_layers = 0;  // layers < this keep the dense MLP (d_ff)
  int64_t sparse_step = 1;         // Qwen-MoE decoder_sparse_step: layer l is MoE when (l+1) % step == 0
  std::vector<uint8_t> dense_layers;  // Qwen-MoE mlp_only_layers (1 = dense), empty: none
  MoeScore score = MoeScore::softmax;
  bool norm_topk = true;           // renormalise the top-k weights to sum 1
  MoeRouterCode code = MoeRouterCode::qwen;
  bool output_router_logits = false;  // the aux load-balancing loss (load_balancing_loss_func)
  ExpertsImpl impl = ExpertsImpl::eager;
  MoeRouting routing = MoeRouting::balanced;
  double skew_alpha = 0.0;
  // routing counts: experts entries (every MoE layer) or moe_layers x experts, row-major.
  std::vector<int64_t> counts;
  // DeepSeek-V3 (MoeRouterCode::deepseek_v3; docs/deepseek.md): the experts in n_group
  // groups, top-2 sums choose topk_group of them per token. shared_d_ff is then
  // DeepseekV3MoE's ungated shared_experts MLP (moe_intermediate_size x n_shared_experts),
  // run after the routed experts and added out of place.
  int64_t n_group = 1, topk_group = 1;
  // DeepSeek-V2 (MoeRouterCode::deepseek_v2): topk_method group_limited_greedy (each group's
  // score is its max; false: greedy, a plain top-k over the softmax).
  bool group_limited = false;

  bool layer_is_moe(int64_t l) const {
    if (experts <= 0 || l < first_dense_layers) return false;
    if (l >= 0 && static_cast<size_t>(l) < dense_layers.size() && dense_layers[l] != 0) return false;
    return sparse_step <= 1 || (l + 1) % sparse_step == 0;
  }
};

// Multi-head latent attention (DeepSeek-V2/V3; graph/models/decoder_mla.cpp,
// docs/deepseek.md): kv_lora_rank 0 = none (the q/k/v projections above).
struct MlaSpec {
  int64_t q_lora_rank = 0;  // 0: q_proj (config q_lora_rank null); else q_a_proj, norm, q_b_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = true;  // DeepseekV3Config.rope_interleave: apply_rotary_pos_emb_interleave
  // DeepSeek-V2 as transformers 5.17.0 writes it (decoder_mla.cpp): the model's complex64
  // freqs_cis table and apply_rotary_emb (view_as_complex products), and expand_kv's
  // new_empty + two slice copy_s for the key (CopySlices in backward) instead of torch.cat.
  bool v2_code = false;
  bool enabled() const { return kv_lora_rank > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

struct DecoderArch {
  // transformers' model_type this row stands for ("llama", "qwen2", "gemma2", ...).
  const char* architecture = "llama";
  int64_t head_dim = 0;           // 0: d_model / heads (config.json head_dim otherwise)
  Positions positions = Positions::rotary;
  int64_t rotary_dim = 0;         // 0: head_dim (partial_rotary_factor otherwise)
  bool embed_scale = false;       // Gemma: inputs_embeds * sqrt(d_model) (a 0-d normalizer)
  NormKind norm = NormKind::rms;
  NormPlacement placement = NormPlacement::pre;
  QkNorm qk_norm = QkNorm::none;
  LinearKind linear = LinearKind::linear;
  EagerCore eager_core = EagerCore::additive_mask;
  bool qkv_bias = false;          // q/k/v projections have a bias (attention_bias, Qwen2)
  bool o_bias = false;            // o_proj has a bias (attention_bias for Llama-likes)
  bool fused_qkv = false;         // one qkv projection, split after (Phi-3 qkv_proj, GPT-2 c_attn)
  MlpKind mlp = MlpKind::glu;
  Activation act = Activation::silu;
  bool mlp_bias = false;
  bool fused_gate_up = false;     // one gate_up projection, chunked after (Phi-3)
  double attn_softcap = 0.0;      // attn_logit_softcapping (Gemma-2): / c, tanh, * c; 0 = none
  double final_softcap = 0.0;     // final_logit_softcapping (Gemma-2): the same on the logits
  int64_t sliding_window = 0;     // 0: none; else the window of the sliding layers
  // Which layers slide (1) when sliding_window > 0; empty = every layer (Mistral).
  std::vector<uint8_t> sliding_layers;
  ModelCode code = ModelCode::llama;
  // GPT-2's resid_pdrop / embd_pdrop: dropout on the attention and MLP outputs and on the
  // embeddings (model.dropout); Phi-3's resid_attn/resid_mlp dropout on the two branch
  // outputs; Llama-likes only drop attention probabilities.
  bool residual_dropout = false;

  // Placement (docs/decoder-modules.md §4; defaults: Llama v4.45 as measured).
  RopeAt rope = RopeAt::model;
  bool rope_mul_fused = false;     // cos = emb.cos() * s (Qwen3): never two raw tables at once
  bool rope_local = false;         // Gemma-3: a second model-level table for sliding layers
  bool attn_rope_buffer = false;   // an unused per-attention rotary module (v4.45 Llama,
                                   // Qwen2, StableLM): one inv_freq buffer per layer
  MaskBuild mask = MaskBuild::triu;
  bool mask_target_s = false;      // the causal mask is (S, S) (Gemma-2/3), not (S, S+1)
  bool mask_window_local = false;  // Qwen3: the window's (S,T) bool is a named local
  bool mask_add_inplace = false;   // `attn_weights += causal_mask` (Phi-3, StableLM)
  SlidingAt sliding_at = SlidingAt::mask;
  bool attn_scale_mul = false;     // scores * scaling (Gemma, Qwen3): op name only
  bool attn_function = false;      // eager_attention_forward (v4.50+): repeat_kv inside, the
                                   // caller's k/v names keep the pre-repeat tensors
  bool sdpa_gqa = false;           // sdpa_attention_forward passes enable_gqa=True instead of
                                   // repeat_kv when there is no mask and head_dim <= 256
                                   // (transformers 5.x, integrations/sdpa_attention.py)
  bool masking_utils = false;      // the training forward builds its position ids and masks with
                                   // transformers 5.x masking_utils (graph/models/decoder_mask_v5.h)
  QkNormAt qk_norm_at = QkNormAt::view;
  EmbedScaleAt embed_scale_at = EmbedScaleAt::model;
  bool attn_out_kept = false;      // StableLM: the attention output lives through the MLP
  LogitsFloat logits_float = LogitsFloat::forward;
  CausalLoss loss = CausalLoss::shift;
  SandwichOrder sandwich_order = SandwichOrder::gemma3;
  ModelImpl impl = ModelImpl::hf;  // model.implementation
  MoeSpec moe;                     // model.moe / a MoE config.json (experts 0: dense)
  MlaSpec mla;                     // a DeepSeek config.json's latent attention (0: none)

  bool layer_slides(int64_t l) const {
    if (sliding_window <= 0) return false;
    if (sliding_layers.empty()) return true;
    return l >= 0 && static_cast<size_t>(l) < sliding_layers.size() && sliding_layers[l] != 0;
  }
};

// transformers' GPT2LMHeadModel (v4.44): LayerNorm, Conv1D with biases, fused c_attn,
// learned positions, NewGELU, the where-masked _attn, resid/embd dropout, no upcast.
inline DecoderArch gpt2_arch() {
  DecoderArch a;
  a.architecture = "gpt2";
  a.positions = Positions::learned;
  a.norm = NormKind::layer;
  a.linear = LinearKind::conv1d;
  a.eager_core = EagerCore::where_buffer;
  a.qkv_bias = a.o_bias = a.mlp_bias = true;
  a.fused_qkv = true;
  a.mlp = MlpKind::plain;
  a.act = Activation::gelu_new;
  a.logits_float = LogitsFloat::none;
  a.code = ModelCode::gpt2;
  a.residual_dropout = true;
  return a;
}

}  // namespace memsim::graph
