#include "sim/serve/served_model.h"

#include <stdexcept>

#include "graph/models/decoder_spec.h"

namespace memsim::serve {

namespace {

// "FILE:LINE: KEY: why", or "--set KEY: why" for an override (scenario/yaml_fields.h's form).
[[noreturn]] void refuse(const std::string& where, const std::string& key, const std::string& why) {
  throw ScenarioError(where == "--set" ? "--set " + key + ": " + why : where + ": " + key + ": " + why);
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The vLLM model classes whose layers this file and vllm_profile_run.cpp follow:
// LlamaForCausalLM (llama, and phi3: vLLM's Phi3ForCausalLM is a LlamaForCausalLM),
// MistralForCausalLM (= Llama), Qwen2ForCausalLM, Qwen3ForCausalLM.
bool modelled_architecture(const std::string& a) {
  return a == "llama" || a == "mistral" || a == "qwen2" || a == "qwen3" || a == "phi3";
}

}  // namespace

ServedModel served_model(const Scenario& s) {
  const ServeConfig& c = s.serve;
  const ModelConfig& mc = s.model;
  const std::string model_at = s.source;
  ServedModel m;
  if (mc.family != ModelFamily::hf_llama)
    refuse(model_at, "model.family",
           std::string("memsim serve models Hugging Face decoders as vLLM/SGLang load them "
                       "(family hf-llama and its architecture rows), not '") +
               to_string(mc.family) + "'");
  m.architecture = mc.arch.architecture;
  if (!modelled_architecture(m.architecture))
    refuse(model_at, "model.architecture",
           "the serving engines' model code for '" + m.architecture +
               "' is not modelled (memsim serve covers llama, mistral, qwen2, qwen3, phi3; "
               "docs/serve.md says why the others differ)");
  if (mc.arch.impl != graph::ModelImpl::hf)
    refuse(model_at, "model.implementation",
           "memsim serve loads the Hugging Face checkpoint layout; use model.implementation: hf");
  m.layers = mc.layers;
  m.d_model = mc.d_model;
  m.heads = mc.heads;
  m.kv_heads = mc.kv_heads > 0 ? mc.kv_heads : mc.heads;
  m.head_dim = mc.arch.head_dim > 0 ? mc.arch.head_dim : mc.d_model / mc.heads;
  m.d_ff = mc.d_ff;
  m.vocab = mc.vocab;
  m.context = mc.context_length;
  m.rotary_dim = mc.arch.rotary_dim > 0 ? mc.arch.rotary_dim : m.head_dim;
  m.tied = mc.tied_embeddings;
  m.qkv_bias = mc.arch.qkv_bias;
  m.o_bias = mc.arch.o_bias;
  m.mlp_bias = mc.arch.mlp_bias;
  m.qk_norm = mc.arch.qk_norm == graph::QkNorm::head;
  m.elem = dtype_bytes(s.precision.params);
  m.quant = c.quantization;
  m.tp = c.tensor_parallel;
  const std::string tp_at = c.where_of("serve.tensor_parallel", s.source);
  // vllm/config.py ParallelConfig / ModelConfig.verify_with_parallel_config.
  if (m.heads % m.tp != 0)
    refuse(tp_at, "serve.tensor_parallel",
           "Total number of attention heads (" + std::to_string(m.heads) +
               ") must be divisible by tensor parallel size (" + std::to_string(m.tp) + ").");
  try {
    m.kv_heads_rank = kv_heads_per_rank(m.kv_heads, m.tp);
  } catch (const std::invalid_argument& e) {
    refuse(tp_at, "serve.tensor_parallel", e.what());
  }
  if (m.d_ff % m.tp != 0)
    refuse(tp_at, "serve.tensor_parallel",
           "intermediate_size " + std::to_string(m.d_ff) + " is not divisible by " +
               std::to_string(m.tp) + " (MergedColumnParallelLinear)");
  // vllm/model_executor/layers/vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE 64.
  m.padded_vocab = round_up(m.vocab, 64);
  if (m.padded_vocab % m.tp != 0)
    refuse(tp_at, "serve.tensor_parallel",
           "the padded vocabulary " + std::to_string(m.padded_vocab) + " is not divisible by " +
               std::to_string(m.tp) + " (VocabParallelEmbedding)");
  m.q_heads_rank = m.heads / m.tp;
  m.d_ff_rank = m.d_ff / m.tp;
  m.vocab_rank = m.padded_vocab / m.tp;
  m.kv_elem = c.kv_cache_dtype == KvCacheDtype::automatic ? m.elem : 1;
  m.kv.reserve(static_cast<size_t>(m.layers));
  for (int64_t l = 0; l < m.layers; ++l) {
    KvLayer k;
    k.kv_heads = m.kv_heads_rank;
    k.head_dim = m.head_dim;
    k.elem_bytes = m.kv_elem;
    k.window = mc.arch.layer_slides(l) ? mc.arch.sliding_window : 0;
    m.kv.push_back(k);
  }
  return m;
}

namespace {

// One decoder linear of `out` x `in` on this rank, `shards` logical weights fused in it.
void add_linear(std::vector<WeightTensor>& t, const ServedModel& m, const std::string& name,
                int64_t out, int64_t in, int64_t shards) {
  const auto n = static_cast<uint64_t>(out) * static_cast<uint64_t>(in);
  switch (m.quant) {
    case WeightQuant::none:
      t.push_back({name + ".weight", n * static_cast<uint64_t>(m.elem)});
      return;
    case WeightQuant::fp8:
      // Fp8LinearMethod (per-tensor, static activation scale): fp8 weight; after
      // process_weights_after_loading one max weight_scale and one input_scale (fp32).
      t.push_back({name + ".weight", n});
      t.push_back({name + ".weight_scale", 4});
      t.push_back({name + ".input_scale", 4});
      return;
    case WeightQuant::int8:
      // compressed-tensors W8A8 int8, per-channel weight scales, dynamic per-token input.
      t.push_back({name + ".weight", n});
      t.push_back({name + ".weight_scale", static_cast<uint64_t>(out) * 4});
      return;
    case WeightQuant::int4: {
      // AWQ 4-bit, group 128: qweight int32 [in, out/8], qzeros int32 [in/128, out/8],
      // scales fp16 [in/128, out] (Marlin's repack keeps these sizes).
      const auto groups = static_cast<uint64_t>((in + 127) / 128);
      t.push_back({name + ".qweight", n / 2});
      t.push_back({name + ".qzeros", groups * static_cast<uint64_t>(out) / 2});
      t.push_back({name + ".scales", groups * static_cast<uint64_t>(out) * 2});
      return;
    }
    case WeightQuant::nf4: {
      // bitsandbytes NF4: codes packed two per byte; vLLM dequantizes the double-quantized
      // absmax at load (fp32 per 64-value block), one per logical shard.
      t.push_back({name + ".weight", (n + 1) / 2});
      const uint64_t per_shard = n / static_cast<uint64_t>(shards);
      for (int64_t i = 0; i < shards; ++i)
        t.push_back({name + ".absmax" + std::to_string(i), (per_shard + 63) / 64 * 4});
      return;
    }
  }
}

}  // namespace

std::vector<WeightTensor> vllm_weight_tensors(const ServedModel& m) {
  std::vector<WeightTensor> t;
  const auto e = static_cast<uint64_t>(m.elem);
  const auto d = static_cast<uint64_t>(m.d_model);
  t.push_back({"model.embed_tokens.weight", static_cast<uint64_t>(m.vocab_rank) * d * e});
  const int64_t qkv_out = (m.q_heads_rank + 2 * m.kv_heads_rank) * m.head_dim;
  const int64_t q_in = m.q_heads_rank * m.head_dim;
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    add_linear(t, m, p + ".self_attn.qkv_proj", qkv_out, m.d_model, 3);
    if (m.qkv_bias) t.push_back({p + ".self_attn.qkv_proj.bias", static_cast<uint64_t>(qkv_out) * e});
    if (m.qk_norm) {
      t.push_back({p + ".self_attn.q_norm.weight", static_cast<uint64_t>(m.head_dim) * e});
      t.push_back({p + ".self_attn.k_norm.weight", static_cast<uint64_t>(m.head_dim) * e});
    }
    add_linear(t, m, p + ".self_attn.o_proj", m.d_model, q_in, 1);
    if (m.o_bias) t.push_back({p + ".self_attn.o_proj.bias", d * e});  // RowParallel: full bias
    add_linear(t, m, p + ".mlp.gate_up_proj", 2 * m.d_ff_rank, m.d_model, 2);
    if (m.mlp_bias) t.push_back({p + ".mlp.gate_up_proj.bias", static_cast<uint64_t>(2 * m.d_ff_rank) * e});
    add_linear(t, m, p + ".mlp.down_proj", m.d_model, m.d_ff_rank, 1);
    if (m.mlp_bias) t.push_back({p + ".mlp.down_proj.bias", d * e});
    t.push_back({p + ".input_layernorm.weight", d * e});
    t.push_back({p + ".post_attention_layernorm.weight", d * e});
  }
  t.push_back({"model.norm.weight", d * e});
  if (!m.tied) t.push_back({"lm_head.weight", static_cast<uint64_t>(m.vocab_rank) * d * e});
  // get_rope() caches one RotaryEmbedding for all layers: cos_sin_cache
  // [max_position_embeddings, rotary_dim] in the model dtype (a buffer, on the GPU).
  t.push_back({"rotary_emb.cos_sin_cache",
               static_cast<uint64_t>(m.context) * static_cast<uint64_t>(m.rotary_dim) * e});
  return t;
}

uint64_t weights_bytes(const std::vector<WeightTensor>& tensors) {
  uint64_t total = 0;
  for (const WeightTensor& w : tensors) total += (w.bytes + 511) / 512 * 512;  // kMinBlockSize
  return total;
}

}  // namespace memsim::serve
