#include "sim/analysis/parameter_count.h"

#include <string_view>

#include "graph/models/lora.h"
#include "graph/models/megatron.h"
#include "scenario/megatron_arch_name.h"
#include "scenario/model_architecture.h"
#include "scenario/pipeline_split.h"
#include "scenario/scenario_lora.h"
#include "sim/megatron/megatron_step.h"
#include "sim/parallel/zero_sharding.h"

namespace memsim {
namespace {

// The architecture the count follows: the scenario's for the Hugging Face families; the
// row a family's own model matches for cs336 (Llama's layout) and megatron (GPT-2's).
graph::DecoderArch counted_arch(const ModelConfig& m) {
  switch (m.family) {
    case ModelFamily::hf_llama:
    case ModelFamily::hf_gpt2: return m.arch;
    case ModelFamily::cs336: return default_architecture(ModelFamily::hf_llama).arch;
    case ModelFamily::megatron: {
      graph::DecoderArch a = default_architecture(ModelFamily::hf_gpt2).arch;
      a.moe = m.arch.moe;  // Megatron-Core MoE layers (graph/models/megatron_moe.cpp)
      // --swiglu and the bias flags as resolved by scenario/megatron_arch_keys.cpp (a
      // preset's ModelConfig was not through it: the GeLU GPT with biases).
      if (std::string_view(m.arch.architecture) == scenario_detail::kMegatronArchitecture) {
        a.mlp = m.arch.mlp;
        a.qkv_bias = m.arch.qkv_bias;
        a.o_bias = m.arch.o_bias;
        a.mlp_bias = m.arch.mlp_bias;
      }
      return a;
    }
  }
  return m.arch;
}

// A norm over n features: RMSNorm has a weight, LayerNorm a weight and a bias.
int64_t norm(const graph::DecoderArch& a, int64_t n) {
  return a.norm == graph::NormKind::layer ? 2 * n : n;
}

int64_t kv_heads(const ModelConfig& m) { return m.kv_heads > 0 ? m.kv_heads : m.heads; }

}  // namespace

int64_t layer_parameter_count(const ModelConfig& m) { return layer_parameter_count(m, 0); }

int64_t layer_parameter_count(const ModelConfig& m, int64_t layer) {
  const graph::DecoderArch a = counted_arch(m);
  const int64_t D = m.d_model, F = m.d_ff, hd = head_dim(m);
  const int64_t q = m.heads * hd, kv = kv_heads(m) * hd;
  int64_t n = D * q + 2 * D * kv + q * D;  // q, k, v, o
  if (a.qkv_bias) n += q + 2 * kv;
  if (a.o_bias) n += D;
  if (a.mla.enabled()) {
    // DeepseekV3Attention (graph/models/decoder_mla.cpp): q_a_proj + q_a_layernorm + q_b_proj
    // (or q_proj), kv_a_proj_with_mqa + kv_a_layernorm + kv_b_proj, o_proj; attention_bias
    // on q_a, kv_a and o.
    const graph::MlaSpec& ml = a.mla;
    const int64_t H = m.heads, qk = ml.qk_head_dim(), rq = ml.q_lora_rank, rkv = ml.kv_lora_rank;
    n = rq > 0 ? D * rq + norm(a, rq) + rq * H * qk : D * H * qk;
    n += D * (rkv + ml.qk_rope_head_dim) + norm(a, rkv) + rkv * H * (ml.qk_nope_head_dim + ml.v_head_dim);
    n += H * ml.v_head_dim * D;
    if (a.qkv_bias) n += (rq > 0 ? rq : 0) + rkv + ml.qk_rope_head_dim;
    if (a.o_bias) n += D;
  }
  switch (a.qk_norm) {
    case graph::QkNorm::none: break;
    case graph::QkNorm::head: n += norm(a, hd) * 2; break;
    case graph::QkNorm::full: n += norm(a, q) + norm(a, kv); break;
  }
  if (a.moe.layer_is_moe(layer)) {
    // mixture of experts (graph/models/decoder_moe.cpp): the router (E, D), the experts'
    // gate_up_proj (E, 2F, D) and down_proj (E, D, F); a shared expert's gate/up/down and
    // its (1, D) gate.
    const int64_t E = a.moe.experts, Fe = a.moe.expert_d_ff, Fs = a.moe.shared_d_ff;
    if (m.family == ModelFamily::megatron) {
      // Megatron-Core's MoELayer (graph/models/megatron_moe.cpp): router (E, D) + bias,
      // experts and shared experts (fc1 D x F + F, fc2 F x D + D; fc1 of 2F with --swiglu;
      // no biases with --disable-bias-linear).
      const int64_t g = a.mlp == graph::MlpKind::glu ? 2 : 1, b = a.mlp_bias ? 1 : 0;
      return n + E * D + b * E + E * ((g + 1) * D * Fe + b * (g * Fe + D)) +
             (Fs > 0 ? (g + 1) * D * Fs + b * (g * Fs + D) : 0) + 2 * norm(a, D);
    }
    n += E * D + 3 * E * D * Fe;
    // Qwen2-MoE's shared expert has a (1, D) gate; DeepSeek's shared_experts none.
    if (Fs > 0) n += 3 * D * Fs + (a.moe.code == graph::MoeRouterCode::deepseek_v3 || a.moe.code == graph::MoeRouterCode::deepseek_v2 ? 0 : D);
  } else if (a.mlp == graph::MlpKind::glu) {
    n += 3 * D * F + (a.mlp_bias ? 2 * F + D : 0);
  } else {
    n += 2 * D * F + (a.mlp_bias ? F + D : 0);
  }
  n += (a.placement == graph::NormPlacement::sandwich ? 4 : 2) * norm(a, D);
  return n;
}

int64_t embedding_parameter_count(const ModelConfig& m) {
  const graph::DecoderArch a = counted_arch(m);
  int64_t n = m.vocab * m.d_model;
  if (a.positions == graph::Positions::learned) n += m.context_length * m.d_model;
  return n;
}

int64_t head_parameter_count(const ModelConfig& m) {
  return norm(counted_arch(m), m.d_model) + (m.tied_embeddings ? 0 : m.vocab * m.d_model);
}

int64_t parameter_count(const ModelConfig& m) {
  int64_t layers = 0;
  for (int64_t l = 0; l < m.layers; ++l) layers += layer_parameter_count(m, l);
  return embedding_parameter_count(m) + layers + head_parameter_count(m);
}

int64_t trainable_parameter_count(const Scenario& s) {
  const ModelConfig& m = s.model;
  if (s.lora.rank <= 0) return parameter_count(m);
  const uint32_t mask = lora_target_mask(s.lora, m.family);
  const int64_t D = m.d_model, F = m.d_ff, hd = head_dim(m);
  const int64_t q = m.heads * hd, kv = kv_heads(m) * hd;
  // (in, out) of each linear module, in graph::LlamaLinear / Gpt2Linear order.
  std::vector<std::pair<int64_t, int64_t>> modules;
  if (m.family == ModelFamily::hf_gpt2) {
    modules = {{D, q + 2 * kv}, {q, D}, {D, F}, {F, D}};
  } else {
    modules = {{D, q}, {D, kv}, {D, kv}, {q, D}, {D, F}, {D, F}, {F, D}};
  }
  // Modules the architecture does not have get no adapter (graph/models/decoder.cpp skips them,
  // as PEFT finds no module of that name): q/k/v with a fused qkv_proj, gate/up with a
  // fused gate_up_proj, gate with a plain MLP.
  std::vector<bool> present(modules.size(), true);
  if (m.family == ModelFamily::hf_llama) {
    const graph::DecoderArch& a = m.arch;
    if (a.fused_qkv) present[0] = present[1] = present[2] = false;
    if (a.mlp == graph::MlpKind::glu && a.fused_gate_up) present[4] = present[5] = false;
    if (a.mlp == graph::MlpKind::plain) present[4] = false;
  }
  // Multi-head latent attention (DeepSeek-V2 / V3): q/k/v do not exist; its projections are
  // graph::MlaLinear's bits 9-12 (q_a, q_b, kv_a_with_mqa, kv_b), q_proj (q_lora_rank null)
  // and o_proj (H x v_head_dim wide input).
  std::vector<std::pair<uint32_t, std::pair<int64_t, int64_t>>> mla;
  if (m.family == ModelFamily::hf_llama && m.arch.mla.enabled()) {
    const graph::MlaSpec& ml = m.arch.mla;
    const int64_t H = m.heads, qk = ml.qk_head_dim(), rq = ml.q_lora_rank, rkv = ml.kv_lora_rank;
    present[1] = present[2] = false;
    if (rq > 0) {
      present[0] = false;
      mla.push_back({9u, {D, rq}});
      mla.push_back({10u, {rq, H * qk}});
    } else {
      modules[0] = {D, H * qk};
    }
    mla.push_back({11u, {D, rkv + ml.qk_rope_head_dim}});
    mla.push_back({12u, {rkv, H * (ml.qk_nope_head_dim + ml.v_head_dim)}});
    modules[3] = {H * ml.v_head_dim, D};
  }
  int64_t total = 0;
  const graph::MoeSpec& moe = m.arch.moe;
  for (int64_t l = 0; l < m.layers; ++l) {
    for (const auto& [bit, io] : mla)
      if ((mask >> bit) & 1u) total += s.lora.rank * (io.first + io.second);
    const bool sparse = m.family == ModelFamily::hf_llama && moe.layer_is_moe(l);
    for (size_t i = 0; i < modules.size(); ++i) {
      if (!present[i] || !((mask >> i) & 1u)) continue;
      int64_t in = modules[i].first, out = modules[i].second;
      if (sparse && i >= 4) {
        // A MoE layer has no dense MLP: gate/up/down_proj match only a shared expert
        // (Qwen2-MoE, shared_d_ff wide; graph/models/decoder_moe.cpp construct_moe).
        const int64_t S = moe.shared_d_ff;
        if (S == 0) continue;
        in = i == 6 ? S : D;
        out = i == 6 ? D : S;
      }
      total += s.lora.rank * (in + out);
    }
    // lora.target_parameters (graph/models/moe_param_lora.h): per MoE layer and targeted 3-D
    // parameter, PEFT's ParamWrapper adds lora_A (r*E, in) and lora_B (out, r*E).
    if (!sparse) continue;
    const int64_t rE = s.lora.rank * moe.experts, Fe = moe.expert_d_ff;
    if ((mask >> 7) & 1u) total += rE * (D + 2 * Fe);  // gate_up_proj (E, 2F, D)
    if ((mask >> 8) & 1u) total += rE * (Fe + D);      // down_proj (E, D, F)
  }
  return total;
}

int64_t parameter_count_per_rank(const Scenario& s, int pipeline_stage) {
  const ParallelConfig& p = s.parallel;
  const ModelConfig& m = s.model;
  if (m.family == ModelFamily::megatron) {
    const int64_t v = p.pipeline_schedule == PipelineSchedule::interleaved ? p.virtual_stages : 1;
    const PipelineSplit split = pipeline_split(s);  // uneven splits too (scenario/pipeline_split.h)
    Scenario chunk = s;
    int64_t n = 0;
    for (int64_t c = 0; c < v; ++c) {
      const ChunkLayers layers = chunk_layers(split, pipeline_stage, c);
      chunk.model.layers = layers.count;
      graph::MegatronShape shape = megatron_shape(chunk);
      shape.layer_offset = layers.offset;  // a MoE layer by its global index
      const int64_t virtual_stage = c * p.pipeline + pipeline_stage;
      shape.pre_process = virtual_stage == 0;
      shape.post_process = virtual_stage == p.pipeline * v - 1;
      n += graph::megatron_parameter_count(shape);
    }
    return n;
  }
  if (p.sharding == Sharding::fsdp) {
    // One FSDP unit per layer plus the root (embeddings, final norm, untied head), each
    // flat parameter padded to a multiple of the data-parallel size.
    const int64_t d = p.data;
    const auto shard = [d](int64_t numel) {
      return static_cast<int64_t>(padded_numel(static_cast<uint64_t>(numel), d)) / d;
    };
    int64_t n = shard(embedding_parameter_count(m) + head_parameter_count(m));
    for (int64_t l = 0; l < m.layers; ++l) n += shard(layer_parameter_count(m, l));
    return n;
  }
  return parameter_count(m);
}

}  // namespace memsim
