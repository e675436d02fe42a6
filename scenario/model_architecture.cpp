#include "scenario/model_architecture.h"

#include "scenario/transformers_version.h"

#include <algorithm>

namespace memsim {
namespace {

using graph::Activation;
using graph::CausalLoss;
using graph::DecoderArch;
using graph::EmbedScaleAt;
using graph::LogitsFloat;
using graph::MaskBuild;
using graph::MlpKind;
using graph::NormKind;
using graph::NormPlacement;
using graph::QkNorm;
using graph::QkNormAt;
using graph::RopeAt;
using graph::SandwichOrder;
using graph::SlidingAt;

// A DecoderArch written as a list of differences from Llama, so each row below reads as
// data: Arch("gemma").norm(NormKind::rms_one_plus).embed_scale()...
struct Arch {
  DecoderArch a;
  explicit Arch(const char* name) { a.architecture = name; }
  explicit Arch(const DecoderArch& base) : a(base) {}
  // The knobs (scenario keys).
  Arch& norm(NormKind v) { a.norm = v; return *this; }
  Arch& placement(NormPlacement v) { a.placement = v; return *this; }
  Arch& qk_norm(QkNorm v) { a.qk_norm = v; return *this; }
  Arch& act(Activation v) { a.act = v; return *this; }
  Arch& embed_scale() { a.embed_scale = true; return *this; }
  Arch& qkv_bias() { a.qkv_bias = true; return *this; }
  Arch& fused_qkv() { a.fused_qkv = true; return *this; }
  Arch& fused_gate_up() { a.fused_gate_up = true; return *this; }
  Arch& softcap(double attn, double final) { a.attn_softcap = attn; a.final_softcap = final; return *this; }
  Arch& window(int64_t w) { a.sliding_window = w; return *this; }
  // Placement: where the model's transformers code puts the same pieces
  // (docs/decoder-modules.md §4 and §5, as the torch_cpu_arch fixtures measured them).
  Arch& rope_per_layer() { a.rope = RopeAt::layer; return *this; }
  Arch& rope_mul_fused() { a.rope_mul_fused = true; return *this; }
  Arch& rope_local() { a.rope_local = true; return *this; }
  Arch& attn_rope_buffer() { a.attn_rope_buffer = true; return *this; }
  Arch& mask_exclude() { a.mask = MaskBuild::exclude; return *this; }
  Arch& mask_target_s() { a.mask_target_s = true; return *this; }
  Arch& mask_add_inplace() { a.mask_add_inplace = true; return *this; }
  Arch& sliding_per_layer() { a.sliding_at = SlidingAt::layer; return *this; }
  Arch& attn_scale_mul() { a.attn_scale_mul = true; return *this; }
  Arch& attn_function() { a.attn_function = true; return *this; }
  Arch& qk_norm_transposed() { a.qk_norm_at = QkNormAt::transposed; return *this; }
  Arch& embed_scale_in_embedding() { a.embed_scale_at = EmbedScaleAt::embedding; return *this; }
  Arch& logits_float(LogitsFloat v) { a.logits_float = v; return *this; }
  Arch& loss_pad() { a.loss = CausalLoss::pad; return *this; }
  Arch& sandwich_order(SandwichOrder v) { a.sandwich_order = v; return *this; }
  // transformers 5.x's placements of the dense parts (the same list model.transformers: 5
  // applies, scenario/transformers_version.cpp): the MoE rows model v5's expert code, and a
  // v4 attention around a v5 MoE block would be a model no release ran.
  Arch& v5_layout() {
    scenario_detail::apply_v5_layout(a);
    return *this;
  }
  // A mixture-of-experts row (docs/moe.md): the router's code and the config class's
  // norm_topk_prob default; the sizes come from the config.json or model.moe.
  Arch& moe(graph::MoeRouterCode code, bool norm_topk) {
    a.moe.code = code;
    a.moe.norm_topk = norm_topk;
    if (code == graph::MoeRouterCode::deepseek_v3) a.moe.score = graph::MoeScore::sigmoid;
    return *this;
  }
  operator DecoderArch() const { return a; }  // NOLINT: the table's rows convert
};

SlidingRule all_layers() { return {}; }
SlidingRule every_other() { return {SlidingRule::Kind::every_other, 0, 0, {}}; }
SlidingRule pattern(int64_t n, int64_t m) { return {SlidingRule::Kind::pattern, n, m, {}}; }

constexpr auto kLlama = ModelFamily::hf_llama;
constexpr auto kGpt2 = ModelFamily::hf_gpt2;
using S = SlidingSource;

// Defaults are the transformers config classes' (v4.45-v5): tie_word_embeddings, head_dim,
// the activation, the Gemma-2/3 sliding windows. Which layers slide, with a window:
//  - gemma2: layer_types, else layer i slides when (i + 1) % 2 != 0, i.e. layers 0, 2, 4...
//    (transformers models/gemma2/modular_gemma2.py, Gemma2Config; v4.45's Gemma2Attention:
//    sliding_window if not bool(layer_idx % 2), the same layers);
//  - gemma3_text: layer_types, else layer i slides when (i + 1) % sliding_window_pattern
//    != 0: with the default pattern 6, five local layers then one global
//    (models/gemma3/configuration_gemma3.py, "5:1 attention pattern");
//  - qwen2 / qwen3: layer_types, else sliding_window only when use_sliding_window, on the
//    layers i >= max_window_layers (models/qwen2/configuration_qwen2.py __post_init__);
//  - mistral / phi3: sliding_window (null = none) on every layer.
// The placement columns follow docs/decoder-modules.md §5 (transformers v4.45; OLMo-2
// v4.47, Gemma-3 v4.50, Qwen3 v4.51). llama and granite keep the default struct, which is
// what the hf-llama family has always simulated (no unused per-attention rotary buffer).
const std::vector<ArchitectureRow>& rows() {
  static const std::vector<ArchitectureRow> table = {
      {"llama", kLlama, Arch("llama"), all_layers(), false, 0, 0, "hidden_act", true, true, false,
       false, S::none, "LlamaForCausalLM"},
      {"mistral", kLlama, Arch("mistral").rope_per_layer().mask_exclude(), all_layers(), false, 0,
       4096, "hidden_act", false, false, false, false, S::every_layer, "MistralForCausalLM"},
      // Qwen2Attention: q/k/v Linear(bias=True), o_proj bias=False, whatever the config says.
      {"qwen2", kLlama, Arch("qwen2").qkv_bias().attn_rope_buffer(), all_layers(), false, 0, 4096,
       "hidden_act", false, false, false, false, S::qwen, "Qwen2ForCausalLM"},
      {"qwen3", kLlama,
       Arch("qwen3").qk_norm(QkNorm::head).rope_mul_fused().mask_exclude().attn_scale_mul()
           .attn_function().logits_float(LogitsFloat::loss).loss_pad(),
       all_layers(), false, 128, 4096, "hidden_act", true, false, false, false, S::qwen,
       "Qwen3ForCausalLM"},
      {"gemma", kLlama,
       Arch("gemma").norm(NormKind::rms_one_plus).embed_scale().act(Activation::gelu_tanh)
           .rope_per_layer().attn_scale_mul(),
       all_layers(), true, 256, 0, "hidden_activation", true, false, false, false, S::none,
       "GemmaForCausalLM"},
      {"gemma2", kLlama,
       Arch("gemma2").norm(NormKind::rms_one_plus).embed_scale().act(Activation::gelu_tanh)
           .placement(NormPlacement::sandwich).softcap(50.0, 30.0).window(4096)
           .rope_per_layer().mask_target_s().sliding_per_layer().attn_scale_mul()
           .sandwich_order(SandwichOrder::gemma2),
       every_other(), true, 256, 4096, "hidden_activation", true, false, true, false,
       S::alternate, "Gemma2ForCausalLM"},
      {"gemma3_text", kLlama,
       Arch("gemma3_text").norm(NormKind::rms_one_plus).embed_scale().act(Activation::gelu_tanh)
           .placement(NormPlacement::sandwich).qk_norm(QkNorm::head).window(4096)
           .rope_local().mask_target_s().sliding_per_layer().attn_scale_mul().attn_function()
           .qk_norm_transposed().embed_scale_in_embedding().logits_float(LogitsFloat::loss)
           .loss_pad(),
       pattern(5, 1), true, 256, 4096, "hidden_activation", true, false, true, false,
       S::pattern, "Gemma3ForCausalLM (text)"},
      {"phi3", kLlama,
       Arch("phi3").fused_qkv().fused_gate_up().rope_per_layer().mask_add_inplace(),
       all_layers(), false, 0, 0, "hidden_act", false, false, false, true, S::every_layer,
       "Phi3ForCausalLM"},
      {"olmo2", kLlama,
       Arch("olmo2").placement(NormPlacement::post).qk_norm(QkNorm::full).rope_per_layer()
           .logits_float(LogitsFloat::loss),
       all_layers(), false, 0, 0, "hidden_act", true, false, false, false, S::none,
       "Olmo2ForCausalLM"},
      // Granite's embedding/residual/attention/logits multipliers are scalars.
      {"granite", kLlama, Arch("granite"), all_layers(), false, 0, 0, "hidden_act", true, true,
       false, false, S::none, "GraniteForCausalLM"},
      // Mixture-of-experts rows (docs/moe.md; transformers v5's fused experts): the dense
      // parts are their lineage's modules (Mixtral: Mistral; Qwen2/3-MoE: Qwen2/3; OLMoE: Llama
      // with OLMo's q/k norms over the whole projection) in 5.x's placements, as the MoE
      // block is 5.x's; experts, top_k and the expert
      // sizes come from the config.json (scenario/hf_config.cpp) or model.moe.
      {"mixtral", kLlama,
       Arch("mixtral").v5_layout().moe(graph::MoeRouterCode::mixtral, true),
       all_layers(), false, 0, 0, "hidden_act", false, false, false, false, S::every_layer,
       "MixtralForCausalLM (v5 MixtralSparseMoeBlock)"},
      {"qwen2_moe", kLlama,
       Arch("qwen2_moe").qkv_bias().v5_layout().moe(graph::MoeRouterCode::qwen, false),
       all_layers(), false, 0, 4096, "hidden_act", false, false, false, false, S::qwen,
       "Qwen2MoeForCausalLM (v5)"},
      {"qwen3_moe", kLlama,
       Arch("qwen3_moe").qk_norm(QkNorm::head).v5_layout().moe(graph::MoeRouterCode::qwen, false),
       all_layers(), false, 128, 4096, "hidden_act", true, false, false, false, S::qwen,
       "Qwen3MoeForCausalLM (v5)"},
      {"olmoe", kLlama, Arch("olmoe").qk_norm(QkNorm::full).v5_layout().moe(graph::MoeRouterCode::qwen, false),
       all_layers(), false, 0, 0, "hidden_act", true, false, false, false, S::none,
       "OlmoeForCausalLM (v5)"},
      // DeepSeek-V3 (docs/deepseek.md): multi-head latent attention (its sizes from the
      // config.json only) and DeepseekV3MoE (sigmoid router with group-limited choice,
      // ungated shared experts, first_k_dense_replace dense layers), 5.x's code.
      {"deepseek_v3", kLlama, Arch("deepseek_v3").v5_layout().moe(graph::MoeRouterCode::deepseek_v3, true),
       all_layers(), false, 0, 0, "hidden_act", true, false, false, false, S::none,
       "DeepseekV3ForCausalLM (v5)"},
      // DeepSeek-V2 / V2-Lite (docs/deepseek.md "DeepSeek-V2"): DeepseekV2Attention (the same
      // latent projections, complex RoPE, expand_kv's slice copies) and DeepseekV2Moe
      // (softmax router, greedy or group-limited top-k, ungated shared experts), 5.17's code.
      {"deepseek_v2", kLlama, Arch("deepseek_v2").v5_layout().moe(graph::MoeRouterCode::deepseek_v2, false),
       all_layers(), false, 0, 0, "hidden_act", true, false, false, false, S::none,
       "DeepseekV2ForCausalLM (v5)"},
      // graph::gpt2_arch(): LayerNorm, Conv1D with biases, fused c_attn, plain MLP with
      // NewGELU, learned positions, the where-masked core, residual/embedding dropout, no
      // fp32 logits.
      {"gpt2", kGpt2, Arch(graph::gpt2_arch()), all_layers(), true, 0, 0, "activation_function",
       false, false, false, false, S::none, "GPT2LMHeadModel"},
  };
  return table;
}

}  // namespace

std::vector<uint8_t> resolve_sliding(const SlidingRule& rule, int64_t layers) {
  using K = SlidingRule::Kind;
  if (rule.kind == K::all) return {};
  if (rule.kind == K::list) return rule.layers;
  std::vector<uint8_t> out(static_cast<size_t>(std::max<int64_t>(layers, 0)), 0);
  for (int64_t l = 0; l < layers; ++l) {
    bool slides = false;
    switch (rule.kind) {
      case K::every_other: slides = l % 2 == 0; break;
      case K::pattern: slides = rule.n + rule.m > 0 && l % (rule.n + rule.m) < rule.n; break;
      case K::from_layer: slides = l >= rule.n; break;
      default: break;
    }
    out[static_cast<size_t>(l)] = slides ? 1 : 0;
  }
  return out;
}

std::string describe_sliding(const SlidingRule& rule) {
  using K = SlidingRule::Kind;
  switch (rule.kind) {
    case K::all: return "all";
    case K::every_other: return "every-other";
    case K::pattern: return std::to_string(rule.n) + ":" + std::to_string(rule.m);
    case K::from_layer: return "layers >= " + std::to_string(rule.n);
    case K::list: {
      std::string s = "[";
      for (size_t i = 0; i < rule.layers.size(); ++i) s += (i ? "," : "") + std::to_string(rule.layers[i]);
      return s + "]";
    }
  }
  return "?";
}

const std::vector<ArchitectureRow>& architecture_rows() { return rows(); }

const ArchitectureRow* find_architecture(std::string_view name) {
  for (const ArchitectureRow& r : rows())
    if (name == r.name) return &r;
  return nullptr;
}

const ArchitectureRow& default_architecture(ModelFamily family) {
  return *find_architecture(family == ModelFamily::hf_gpt2 ? "gpt2" : "llama");
}

std::string architecture_list() {
  std::string s;
  for (const ArchitectureRow& r : rows()) s += (s.empty() ? "" : ", ") + std::string(r.name);
  return s;
}

const std::vector<std::pair<std::string, graph::QkNorm>>& qk_norm_names() {
  static const std::vector<std::pair<std::string, QkNorm>> names = {
      {"none", QkNorm::none}, {"head", QkNorm::head}, {"full", QkNorm::full}};
  return names;
}

const std::vector<std::pair<std::string, graph::NormKind>>& norm_names() {
  static const std::vector<std::pair<std::string, NormKind>> names = {
      {"rms", NormKind::rms}, {"gemma-rms", NormKind::rms_one_plus}, {"layer", NormKind::layer}};
  return names;
}

const std::vector<std::pair<std::string, graph::NormPlacement>>& norm_placement_names() {
  static const std::vector<std::pair<std::string, NormPlacement>> names = {
      {"pre", NormPlacement::pre}, {"post", NormPlacement::post},
      {"sandwich", NormPlacement::sandwich}};
  return names;
}

const std::vector<std::pair<std::string, graph::MlpKind>>& mlp_names() {
  static const std::vector<std::pair<std::string, MlpKind>> names = {{"glu", MlpKind::glu},
                                                                     {"plain", MlpKind::plain}};
  return names;
}

const std::vector<std::pair<std::string, graph::Activation>>& activation_names() {
  static const std::vector<std::pair<std::string, Activation>> names = {
      {"silu", Activation::silu}, {"gelu-tanh", Activation::gelu_tanh},
      {"gelu", Activation::gelu}, {"gelu-new", Activation::gelu_new}};
  return names;
}

int64_t head_dim(const ModelConfig& m) {
  if (m.arch.head_dim > 0) return m.arch.head_dim;
  return m.heads > 0 ? m.d_model / m.heads : 0;
}

}  // namespace memsim
