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

// The MoE rows whose vLLM model classes are Llama-shaped attention + a FusedMoE block:
// MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM.
bool is_moe_architecture(const std::string& a) {
  return a == "mixtral" || a == "qwen2_moe" || a == "qwen3_moe" || a == "olmoe";
}

// The vLLM model classes whose layers this file and vllm_profile_run.cpp follow:
// LlamaForCausalLM (llama, and phi3: vLLM's Phi3ForCausalLM is a LlamaForCausalLM),
// MistralForCausalLM (= Llama), Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM,
// Gemma3ForCausalLM (text), the FusedMoE rows above and DeepseekV2ForCausalLM /
// DeepseekV3ForCausalLM (MLA + FusedMoE with grouped top-k; read_deepseek).
bool is_deepseek_architecture(const std::string& a) { return a == "deepseek_v2" || a == "deepseek_v3"; }

bool modelled_architecture(const std::string& a) {
  return a == "llama" || a == "mistral" || a == "qwen2" || a == "qwen3" || a == "phi3" ||
         is_moe_architecture(a) || a == "gemma2" || a == "gemma3_text" || is_deepseek_architecture(a);
}

// The FusedMoE block of a MoE row (fused_moe.h): sizes per rank and the splits vLLM refuses.
void read_moe(const Scenario& s, ServedModel& m, const std::string& tp_at, bool& any_dense) {
  const graph::MoeSpec& spec = s.model.arch.moe;
  const ServeConfig& c = s.serve;
  if (c.quantization != WeightQuant::none)
    refuse(c.where_of("serve.quantization", s.source), "serve.quantization",
           "quantized experts (FusedMoE's fp8 / int8 / AWQ / bitsandbytes methods and their "
           "scales) are not modelled for MoE models; serve them unquantized (none)");
  if (m.architecture == "olmoe" && m.tp > 1)
    refuse(tp_at, "serve.tensor_parallel",
           "OLMoE's q_norm / k_norm normalise the whole projection, so vLLM all-gathers q and k "
           "under tensor parallelism; that path is not modelled (tensor_parallel 1 is)");
  if ((m.architecture == "qwen2_moe" || is_deepseek_architecture(m.architecture)) && m.tp > spec.experts)
    refuse(tp_at, "serve.tensor_parallel",
           "Tensor parallel size " + std::to_string(m.tp) + " is greater than the number of experts " +
               std::to_string(spec.experts) + ".");
  m.moe.experts = spec.experts;
  m.moe.top_k = spec.top_k;
  m.moe.d_ff = spec.expert_d_ff;
  m.moe.shared_d_ff = spec.shared_d_ff;
  m.moe.renormalize = spec.norm_topk;
  m.moe.chunk_size = c.fused_moe_chunk_size;
  if (m.moe.d_ff % m.tp != 0)
    refuse(tp_at, "serve.tensor_parallel",
           "the experts' intermediate size " + std::to_string(m.moe.d_ff) + " is not divisible by " +
               std::to_string(m.tp) + " (FusedMoE: assert intermediate_size % tp_size == 0)");
  if (m.moe.shared_d_ff % m.tp != 0)
    refuse(tp_at, "serve.tensor_parallel",
           "shared_expert_intermediate_size " + std::to_string(m.moe.shared_d_ff) +
               " is not divisible by " + std::to_string(m.tp) + " (MergedColumnParallelLinear)");
  m.moe.d_ff_rank = m.moe.d_ff / m.tp;
  m.moe.shared_d_ff_rank = m.moe.shared_d_ff / m.tp;
  m.moe_layer.assign(static_cast<size_t>(m.layers), 0);
  any_dense = false;
  for (int64_t l = 0; l < m.layers; ++l) {
    m.moe_layer[static_cast<size_t>(l)] = spec.layer_is_moe(l) ? 1 : 0;
    any_dense = any_dense || !spec.layer_is_moe(l);
  }
  m.qk_norm_full = s.model.arch.qk_norm == graph::QkNorm::full;
}

// DeepSeek-V2 / V3 (vllm/model_executor/models/deepseek_v2.py at 002d6073; deepseek_mla.h):
// the MLA dimensions per rank, the grouped top-k router and ungated shared experts of
// DeepseekV2MoE, and the RoPE cache of get_rope(qk_rope_head_dim, ...) (a yarn
// rope_scaling becomes "deepseek_yarn", DeepseekScalingRotaryEmbedding).
void read_deepseek(const Scenario& s, ServedModel& m) {
  const ModelConfig& mc = s.model;
  const graph::MlaSpec& spec = mc.arch.mla;
  if (!spec.enabled())
    refuse(s.source, "model.architecture",
           "'" + m.architecture + "' without kv_lora_rank: vLLM serves DeepSeek-V2/V3 configs with "
           "multi-head latent attention (give the model's config.json)");
  m.mla.q_lora_rank = spec.q_lora_rank;
  m.mla.kv_lora_rank = spec.kv_lora_rank;
  m.mla.qk_nope = spec.qk_nope_head_dim;
  m.mla.qk_rope = spec.qk_rope_head_dim;
  m.mla.v_head = spec.v_head_dim;
  m.mla.heads_rank = m.heads / m.tp;
  m.rotary_dim = spec.qk_rope_head_dim;
  const graph::MoeSpec& moe = mc.arch.moe;
  m.moe.grouped = true;
  m.moe.n_group = moe.n_group;
  m.moe.topk_group = moe.topk_group;
  m.moe.sigmoid = moe.score == graph::MoeScore::sigmoid || moe.code == graph::MoeRouterCode::deepseek_v3;
  m.moe.correction_bias = moe.code == graph::MoeRouterCode::deepseek_v3;  // topk_method noaux_tc
  m.moe.shared_gate = false;
  if (m.moe.correction_bias && (moe.n_group > 32 || moe.top_k > 32))
    refuse(s.source, "model.hf_config",
           "n_group " + std::to_string(moe.n_group) + " / num_experts_per_tok " + std::to_string(moe.top_k) +
               ": above 32 vLLM routes a correction-biased model with the unfused grouped_topk, "
               "whose buffers are not modelled (the fused kernel's are)");
  // get_rope caches one table: max_position_embeddings rows without scaling; with yarn
  // ("deepseek_yarn") original_max_position_embeddings x factor rows. memsim takes
  // max_position_embeddings for both: every published DeepSeek-V2 / V2-Lite / V3 config has
  // 4096 x 40 = 163,840 = max_position_embeddings (docs/serve.md "DeepSeek-V2 / V3").
  const std::string& type = mc.rope_scaling_type;
  if (!type.empty() && type != "default" && type != "yarn")
    refuse(s.source, "model.hf_config",
           "rope_scaling type '" + type + "' on DeepSeek: vLLM's cache for it is not modelled "
           "(none and yarn, vLLM's deepseek_yarn, are)");
  m.rope_rows = m.context;
}


// Gemma-2 / Gemma-3 text (vllm/model_executor/models/gemma2.py, gemma3.py at 004dc924):
// the sandwich norms, GeluAndMul, the final soft-cap and Gemma-3's RoPE caches. get_rope
// caches one RotaryEmbedding per (head_size, rotary_dim, max_position, base, rope_scaling):
// Gemma-3's local layers use rope_local_base_freq without scaling, its global layers
// rope_theta with the config's rope_scaling, so two caches; a linear scaling's cache holds
// max_position x factor rows (LinearScalingRotaryEmbedding._compute_cos_sin_cache).
void read_gemma(const Scenario& s, ServedModel& m) {
  const ModelConfig& mc = s.model;
  m.gemma = true;
  m.gemma3 = m.architecture == "gemma3_text";
  if (mc.arch.act != graph::Activation::gelu_tanh)
    refuse(s.source, "model.activation",
           "vLLM's Gemma MLP is GeluAndMul(approximate=\"tanh\") only (gelu_pytorch_tanh)");
  if (mc.arch.placement != graph::NormPlacement::sandwich || mc.arch.norm != graph::NormKind::rms_one_plus)
    refuse(s.source, "model.architecture",
           "vLLM's Gemma-2/3 layers have four GemmaRMSNorm (sandwich) norms; other placements are not its model code");
  m.final_softcap = mc.arch.final_softcap;
  if (!m.gemma3) return;
  const std::string& type = mc.rope_scaling_type;
  if (type.empty() || type == "default") {
    m.rope_rows = m.context;
  } else if (type == "linear") {
    m.rope_rows = static_cast<int64_t>(static_cast<double>(m.context) * mc.rope_scaling_factor);
  } else {
    refuse(s.source, "model.hf_config",
           "rope_scaling type '" + type + "' on Gemma-3: vLLM's cache for it is not modelled "
           "(default and linear are)");
  }
  m.local_rope_rows = m.context;
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
               "' is not modelled (memsim serve covers llama, mistral, qwen2, qwen3, phi3, gemma2, "
               "gemma3_text, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3; "
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
  bool any_dense = true;
  if (is_moe_architecture(m.architecture) || (is_deepseek_architecture(m.architecture) && mc.arch.moe.experts > 0))
    read_moe(s, m, tp_at, any_dense);
  if (any_dense && m.d_ff % m.tp != 0)
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
  m.rope_rows = m.context;
  if (m.architecture == "gemma2" || m.architecture == "gemma3_text") read_gemma(s, m);
  if (is_deepseek_architecture(m.architecture)) read_deepseek(s, m);
  m.kv_elem = c.kv_cache_dtype == KvCacheDtype::automatic ? m.elem : 1;
  m.kv.reserve(static_cast<size_t>(m.layers));
  for (int64_t l = 0; l < m.layers; ++l) {
    KvLayer k;
    k.kv_heads = m.kv_heads_rank;
    k.head_dim = m.head_dim;
    k.elem_bytes = m.kv_elem;
    k.window = mc.arch.layer_slides(l) ? mc.arch.sliding_window : 0;
    if (m.mla.enabled()) {  // MLAAttentionSpec: one latent "head", the same on every rank
      k.kv_heads = 1;
      k.head_dim = m.mla.latent();
      k.mla = true;
    }
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

// The Llama-lineage self_attn of one layer on this rank (QKVParallelLinear, optional q/k
// norms, RowParallelLinear o_proj).
void add_attention_weights(std::vector<WeightTensor>& t, const ServedModel& m, const std::string& a) {
  const auto e = static_cast<uint64_t>(m.elem);
  const auto d = static_cast<uint64_t>(m.d_model);
  const int64_t qkv_out = (m.q_heads_rank + 2 * m.kv_heads_rank) * m.head_dim;
  const int64_t q_in = m.q_heads_rank * m.head_dim;
  add_linear(t, m, a + ".qkv_proj", qkv_out, m.d_model, 3);
  if (m.qkv_bias) t.push_back({a + ".qkv_proj.bias", static_cast<uint64_t>(qkv_out) * e});
  if (m.qk_norm) {
    t.push_back({a + ".q_norm.weight", static_cast<uint64_t>(m.head_dim) * e});
    t.push_back({a + ".k_norm.weight", static_cast<uint64_t>(m.head_dim) * e});
  }
  if (m.qk_norm_full) {  // OLMoE: RMSNorm(hidden_size), RMSNorm(kv_heads x head_dim), replicated
    t.push_back({a + ".q_norm.weight", static_cast<uint64_t>(m.heads * m.head_dim) * e});
    t.push_back({a + ".k_norm.weight", static_cast<uint64_t>(m.kv_heads * m.head_dim) * e});
  }
  add_linear(t, m, a + ".o_proj", m.d_model, q_in, 1);
  if (m.o_bias) t.push_back({a + ".o_proj.bias", d * e});  // RowParallel: full bias
}

}  // namespace

std::vector<WeightTensor> vllm_weight_tensors(const ServedModel& m) {
  std::vector<WeightTensor> t;
  const auto e = static_cast<uint64_t>(m.elem);
  const auto d = static_cast<uint64_t>(m.d_model);
  t.push_back({"model.embed_tokens.weight", static_cast<uint64_t>(m.vocab_rank) * d * e});
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    if (m.mla.enabled())
      add_mla_attention_weights(t, m.mla, p + ".self_attn", m.d_model, m.elem);
    else
      add_attention_weights(t, m, p + ".self_attn");
    if (m.layer_is_moe(l)) {
      add_fused_moe_weights(t, m.moe, p + ".mlp", m.d_model, m.elem);
    } else {
      add_linear(t, m, p + ".mlp.gate_up_proj", 2 * m.d_ff_rank, m.d_model, 2);
      if (m.mlp_bias) t.push_back({p + ".mlp.gate_up_proj.bias", static_cast<uint64_t>(2 * m.d_ff_rank) * e});
      add_linear(t, m, p + ".mlp.down_proj", m.d_model, m.d_ff_rank, 1);
      if (m.mlp_bias) t.push_back({p + ".mlp.down_proj.bias", d * e});
    }
    t.push_back({p + ".input_layernorm.weight", d * e});
    t.push_back({p + ".post_attention_layernorm.weight", d * e});
    if (m.gemma) {
      t.push_back({p + ".pre_feedforward_layernorm.weight", d * e});
      t.push_back({p + ".post_feedforward_layernorm.weight", d * e});
    }
  }
  t.push_back({"model.norm.weight", d * e});
  if (!m.tied) t.push_back({"lm_head.weight", static_cast<uint64_t>(m.vocab_rank) * d * e});
  // get_rope() caches one RotaryEmbedding for all layers: cos_sin_cache
  // [max_position_embeddings, rotary_dim] in the model dtype (a buffer, on the GPU).
  t.push_back({"rotary_emb.cos_sin_cache",
               static_cast<uint64_t>(m.rope_rows) * static_cast<uint64_t>(m.rotary_dim) * e});
  if (m.local_rope_rows > 0)  // Gemma-3's local layers: a second get_rope key
    t.push_back({"rotary_emb_local.cos_sin_cache",
                 static_cast<uint64_t>(m.local_rope_rows) * static_cast<uint64_t>(m.rotary_dim) * e});
  // Gemma: register_buffer("normalizer", torch.tensor(hidden_size ** 0.5)), a 0-d tensor in
  // the model dtype moved to the GPU with the model.
  if (m.gemma) t.push_back({"model.normalizer", e});
  return t;
}

uint64_t weights_bytes(const std::vector<WeightTensor>& tensors) {
  uint64_t total = 0;
  for (const WeightTensor& w : tensors) total += (w.bytes + 511) / 512 * 512;  // kMinBlockSize
  return total;
}

}  // namespace memsim::serve
