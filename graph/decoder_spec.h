// A Hugging Face decoder described by data: which shared modules (graph/decoder.h) a
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
  bool logits_upcast = true;      // logits.float() before the loss (Llama); GPT-2: none
  ModelCode code = ModelCode::llama;
  // GPT-2's resid_pdrop / embd_pdrop: dropout on the attention and MLP outputs and on the
  // embeddings (model.dropout); Llama-likes only drop attention probabilities.
  bool residual_dropout = false;

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
  a.logits_upcast = false;
  a.code = ModelCode::gpt2;
  a.residual_dropout = true;
  return a;
}

}  // namespace memsim::graph
