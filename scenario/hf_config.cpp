#include "scenario/hf_config.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "scenario/yaml_fields.h"

namespace memsim {
namespace {

using json = nlohmann::json;

const char* kMoeHint = "not yet modelled (mixture-of-experts)";

// transformers' ACT2FN names memsim has an op sequence for.
const std::vector<std::pair<std::string, graph::Activation>>& hf_activations() {
  static const std::vector<std::pair<std::string, graph::Activation>> names = {
      {"silu", graph::Activation::silu},
      {"swish", graph::Activation::silu},
      {"gelu_pytorch_tanh", graph::Activation::gelu_tanh},
      {"gelu", graph::Activation::gelu},
      {"gelu_new", graph::Activation::gelu_new}};
  return names;
}

// rope_scaling / rope_parameters types whose only effect is on the frequencies: the
// inverse-frequency buffer stays head_dim/2 floats (longrope's short/long factors and
// llama3's smoothing are per-frequency numbers too); none allocates per-position tables.
// "su" and "yarn" are Phi-3's old names for longrope.
const std::vector<std::string>& rope_types() {
  static const std::vector<std::string> names = {"default", "linear", "dynamic", "yarn",
                                                 "longrope", "su", "llama3"};
  return names;
}

std::string line_col(const std::string& text, size_t byte, size_t* column = nullptr) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  if (column) *column = col;
  return std::to_string(line);
}

class Reader {
 public:
  Reader(const json& j, const std::string& text, const std::string& source)
      : j_(j), text_(text), source_(source) {}

  // SOURCE:LINE of where `key` ("rope_scaling.rope_type" for a nested one) is written.
  std::string where(const std::string& key) const {
    size_t from = 0;
    size_t pos = std::string::npos;
    size_t start = 0;
    while (start <= key.size()) {
      const size_t dot = std::min(key.find('.', start), key.size());
      pos = find_key(key.substr(start, dot - start), from);
      if (pos == std::string::npos) return source_ + ":1";
      from = pos + 1;
      start = dot + 1;
    }
    return source_ + ":" + line_col(text_, pos);
  }

  [[noreturn]] void fail(const std::string& key, const std::string& message) const {
    throw ScenarioError(where(key) + ": " + key + ": " + message);
  }

  // The value, or nullptr when the key is absent or null (transformers' None: the default).
  const json* get(const std::string& key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return get(key) != nullptr; }
  // Written in the file, null or not.
  bool present(const std::string& key) const { return j_.find(key) != j_.end(); }

  static std::string shown(const json& v) {
    std::string s = v.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return s;
  }

  int64_t integer_value(const std::string& key, const json& v, int64_t min) const {
    const std::string what = min == 1 ? "a positive integer" : min == 0 ? "a non-negative integer"
                                                                         : "an integer";
    if (!v.is_number_integer()) fail(key, "expected " + what + ", got " + shown(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(key, "expected " + what + ", got " + shown(v) + " (does not fit in 64 bits)");
    const int64_t n = v.get<int64_t>();
    if (n < min) fail(key, "expected " + what + ", got " + shown(v));
    return n;
  }
  int64_t integer(const std::string& key, int64_t min) const {
    const json* v = get(key);
    if (!v) fail(key, "required (" + std::string(min >= 1 ? "a positive integer" : "an integer") + ")");
    return integer_value(key, *v, min);
  }
  std::optional<int64_t> opt_integer(const std::string& key, int64_t min) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    return integer_value(key, *v, min);
  }
  bool boolean(const std::string& key, bool fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(key, "expected true or false, got " + shown(*v));
    return v->get<bool>();
  }
  std::optional<double> opt_number(const std::string& key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) fail(key, "expected a number, got " + shown(*v));
    return v->get<double>();
  }
  std::optional<std::string> opt_string(const std::string& key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail(key, "expected a string, got " + shown(*v));
    return v->get<std::string>();
  }

 private:
  // Byte offset of `"key"` followed by ':' at or after `from`, or npos.
  size_t find_key(const std::string& key, size_t from) const {
    const std::string quoted = "\"" + key + "\"";
    for (size_t pos = text_.find(quoted, from); pos != std::string::npos;
         pos = text_.find(quoted, pos + 1)) {
      size_t after = pos + quoted.size();
      while (after < text_.size() && std::isspace(static_cast<unsigned char>(text_[after]))) ++after;
      if (after < text_.size() && text_[after] == ':') return pos;
    }
    return std::string::npos;
  }

  const json& j_;
  const std::string& text_;
  const std::string& source_;
};

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

bool is_deepseek(const std::string& model_type) {
  return model_type == "deepseek_v3" || model_type == "deepseek_v2";
}

// Keys whose effect memsim does not model: refused by name, whatever the model_type.
bool is_moe_row(const std::string& model_type) {
  for (const char* t : {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "deepseek_v2"})
    if (model_type == t) return true;
  return false;
}

// The mixture-of-experts keys of MixtralConfig / Qwen2MoeConfig / Qwen3MoeConfig / OlmoeConfig
// (transformers v5, with each class's defaults) into m.arch.moe (docs/moe.md).
void read_moe_config(const Reader& r, const std::string& type, ModelConfig& m) {
  graph::MoeSpec& moe = m.arch.moe;
  const bool mixtral = type == "mixtral";
  const char* experts_key = mixtral ? "num_local_experts" : "num_experts";
  moe.experts = r.opt_integer(experts_key, 1).value_or(mixtral ? 8 : type == "olmoe" ? 64 : 60);
  moe.top_k = r.opt_integer("num_experts_per_tok", 1).value_or(mixtral || type == "olmoe" ? (mixtral ? 2 : 8) : 4);
  if (moe.top_k > moe.experts)
    r.fail("num_experts_per_tok", std::to_string(moe.top_k) + " exceeds " + experts_key + " " +
                                      std::to_string(moe.experts));
  // Mixtral and OLMoE size every expert with intermediate_size; Qwen-MoE has its own key.
  moe.expert_d_ff = mixtral || type == "olmoe" ? m.d_ff : r.integer("moe_intermediate_size", 1);
  moe.norm_topk = mixtral ? true : r.boolean("norm_topk_prob", moe.norm_topk);
  if (type == "qwen2_moe") moe.shared_d_ff = r.opt_integer("shared_expert_intermediate_size", 0).value_or(0);
  if (type == "qwen2_moe" || type == "qwen3_moe") {
    moe.sparse_step = r.opt_integer("decoder_sparse_step", 1).value_or(1);
    if (const json* v = r.get("mlp_only_layers")) {
      if (!v->is_array()) r.fail("mlp_only_layers", "expected a list of layer indices, got " + Reader::shown(*v));
      if (!v->empty()) moe.dense_layers.assign(static_cast<size_t>(m.layers), 0);
      for (const json& i : *v) {
        if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= m.layers)
          r.fail("mlp_only_layers", "expected layer indices in [0, " + std::to_string(m.layers) +
                                        "), got " + Reader::shown(i));
        moe.dense_layers[static_cast<size_t>(i.get<int64_t>())] = 1;
      }
    }
  }
  if (const auto jitter = r.opt_number("router_jitter_noise"); jitter && *jitter != 0.0)
    r.fail("router_jitter_noise", "the router's multiplicative jitter (empty_like + uniform_ in "
                                  "training) is not modelled; set it to 0");
  if (r.has("clip_qkv")) r.fail("clip_qkv", "OLMoE's clamp of q/k/v is not modelled; set it to null");
  // The auxiliary load-balancing loss (graph/models/decoder_moe.cpp moe_aux_loss).
  moe.output_router_logits = r.boolean("output_router_logits", false);
}

// DeepseekV3Config (transformers v5, its defaults where a key is absent) into m.arch.mla and
// m.arch.moe (docs/deepseek.md). transformers' DeepseekV3 builds MoE layers from
// first_k_dense_replace on (moe_layer_freq is the remote code's: refused unless 1), the
// sigmoid / noaux_tc router only, and no multi-token-prediction layer (num_nextn_predict_layers'
// weights are dropped on load: not built).
void read_deepseek_v2_config(const Reader& r, ModelConfig& m);

void read_deepseek_config(const Reader& r, ModelConfig& m) {
  if (r.opt_string("model_type").value_or("") == "deepseek_v2") return read_deepseek_v2_config(r, m);
  graph::MlaSpec& mla = m.arch.mla;
  mla.q_lora_rank = r.present("q_lora_rank") ? r.opt_integer("q_lora_rank", 1).value_or(0) : 1536;
  mla.kv_lora_rank = r.opt_integer("kv_lora_rank", 1).value_or(512);
  mla.qk_nope_head_dim = r.opt_integer("qk_nope_head_dim", 1).value_or(128);
  mla.qk_rope_head_dim = r.opt_integer("qk_rope_head_dim", 1).value_or(64);
  mla.v_head_dim = r.opt_integer("v_head_dim", 1).value_or(128);
  mla.rope_interleave = r.boolean("rope_interleave", true);
  if (mla.qk_rope_head_dim % 2 != 0)
    r.fail("qk_rope_head_dim", "RoPE needs an even size, got " + std::to_string(mla.qk_rope_head_dim));
  // The attention's head size is qk_head_dim; RoPE's tables are qk_rope_head_dim wide
  // (DeepseekV3Config sets head_dim = qk_rope_head_dim for the rotary module).
  m.arch.head_dim = mla.qk_head_dim();
  m.arch.rotary_dim = mla.qk_rope_head_dim;
  if (m.kv_heads != m.heads)
    r.fail("num_key_value_heads", std::to_string(m.kv_heads) + " differs from num_attention_heads " +
                                      std::to_string(m.heads) +
                                      ": multi-head latent attention has a key/value head per query head");
  graph::MoeSpec& moe = m.arch.moe;
  moe.experts = r.opt_integer("n_routed_experts", 1).value_or(256);
  moe.top_k = r.opt_integer("num_experts_per_tok", 1).value_or(8);
  if (moe.top_k > moe.experts)
    r.fail("num_experts_per_tok", std::to_string(moe.top_k) + " exceeds n_routed_experts " + std::to_string(moe.experts));
  moe.expert_d_ff = r.opt_integer("moe_intermediate_size", 1).value_or(2048);
  moe.shared_d_ff = moe.expert_d_ff * r.opt_integer("n_shared_experts", 1).value_or(1);
  moe.first_dense_layers = r.opt_integer("first_k_dense_replace", 0).value_or(3);
  moe.n_group = r.opt_integer("n_group", 1).value_or(8);
  moe.topk_group = r.opt_integer("topk_group", 1).value_or(4);
  if (moe.experts % moe.n_group != 0 || moe.experts / moe.n_group < 2)
    r.fail("n_group", std::to_string(moe.n_group) + " groups do not split n_routed_experts " +
                          std::to_string(moe.experts) + " into groups of at least 2 (top-2 group scores)");
  if (moe.topk_group > moe.n_group)
    r.fail("topk_group", std::to_string(moe.topk_group) + " exceeds n_group " + std::to_string(moe.n_group));
  moe.norm_topk = r.boolean("norm_topk_prob", true);
  if (auto f = r.opt_integer("moe_layer_freq", 1); f && *f != 1)
    r.fail("moe_layer_freq", "transformers' DeepseekV3 makes every layer from first_k_dense_replace on "
                             "a MoE layer (moe_layer_freq is DeepSeek's remote code only): set it to 1");
  if (auto s = r.opt_string("scoring_func"); s && *s != "sigmoid")
    r.fail("scoring_func", "'" + *s + "': transformers' DeepseekV3 router is sigmoid only");
  if (auto s = r.opt_string("topk_method"); s && *s != "noaux_tc")
    r.fail("topk_method", "'" + *s + "': transformers' DeepseekV3 router is noaux_tc (group-limited "
                          "top-k with e_score_correction_bias) only");
  if (r.boolean("output_router_logits", false))
    r.fail("output_router_logits", "DeepseekV3ForCausalLM computes no auxiliary load-balancing loss");
}

// DeepseekV2Config (transformers 5.17.0's defaults where a key is absent; its __post_init__
// sets head_dim = qk_rope_head_dim for the rotary module) into m.arch.mla and m.arch.moe
// (docs/deepseek.md "DeepSeek-V2"). 5.17's DeepseekV2TopkRouter reads topk_method (greedy or
// group_limited_greedy), n_group, topk_group and routed_scaling_factor, and neither
// norm_topk_prob, scoring_func nor the aux-loss keys: norm_topk_prob is ignored as
// transformers ignores it; scoring_func other than softmax (what the router computes) and
// moe_layer_freq != 1 (DeepSeek's remote code only) are refused.
void read_deepseek_v2_config(const Reader& r, ModelConfig& m) {
  graph::MlaSpec& mla = m.arch.mla;
  mla.v2_code = true;
  mla.q_lora_rank = r.present("q_lora_rank") ? r.opt_integer("q_lora_rank", 1).value_or(0) : 1536;
  mla.kv_lora_rank = r.opt_integer("kv_lora_rank", 1).value_or(512);
  mla.qk_nope_head_dim = r.opt_integer("qk_nope_head_dim", 1).value_or(128);
  mla.qk_rope_head_dim = r.opt_integer("qk_rope_head_dim", 1).value_or(64);
  mla.v_head_dim = r.opt_integer("v_head_dim", 1).value_or(128);
  mla.rope_interleave = false;
  // apply_rotary_emb views the rope slices of q and of kv_a_proj_with_mqa's output as complex:
  // view_as_complex needs even strides and offsets (torch raises otherwise).
  for (auto [key, v] : {std::pair{"qk_rope_head_dim", mla.qk_rope_head_dim},
                        std::pair{"qk_nope_head_dim", mla.qk_nope_head_dim},
                        std::pair{"kv_lora_rank", mla.kv_lora_rank}})
    if (v % 2 != 0)
      r.fail(key, std::to_string(v) + " is odd: apply_rotary_emb's view_as_complex of the rope slice "
                  "needs an even size and offset");
  if (m.d_model % m.heads != 0)
    r.fail("num_attention_heads", std::to_string(m.heads) + " heads do not divide hidden_size " +
                                      std::to_string(m.d_model) + " (DeepseekV2Config.validate_architecture)");
  m.arch.head_dim = mla.qk_head_dim();
  m.arch.rotary_dim = mla.qk_rope_head_dim;
  if (m.kv_heads != m.heads)
    r.fail("num_key_value_heads", std::to_string(m.kv_heads) + " differs from num_attention_heads " +
                                      std::to_string(m.heads) +
                                      ": multi-head latent attention has a key/value head per query head");
  if (r.boolean("mlp_bias", false))
    r.fail("mlp_bias", "biases on DeepseekV2MLP's projections are not modelled; set it to false");
  graph::MoeSpec& moe = m.arch.moe;
  moe.experts = r.opt_integer("n_routed_experts", 1).value_or(64);
  if (!r.has("num_experts_per_tok"))
    r.fail("num_experts_per_tok", "required (DeepseekV2Config's default is None, which its router cannot use)");
  moe.top_k = r.integer("num_experts_per_tok", 1);
  if (moe.top_k > moe.experts)
    r.fail("num_experts_per_tok", std::to_string(moe.top_k) + " exceeds n_routed_experts " + std::to_string(moe.experts));
  moe.expert_d_ff = r.opt_integer("moe_intermediate_size", 1).value_or(1407);
  if (r.present("n_shared_experts") && !r.has("n_shared_experts"))
    r.fail("n_shared_experts", "null: DeepseekV2Moe always builds its shared experts (give a count)");
  moe.shared_d_ff = moe.expert_d_ff * r.opt_integer("n_shared_experts", 1).value_or(2);
  moe.first_dense_layers = r.opt_integer("first_k_dense_replace", 0).value_or(0);
  moe.norm_topk = false;  // not read by 5.17's router
  const std::string method = r.opt_string("topk_method").value_or("greedy");
  if (method != "greedy" && method != "group_limited_greedy")
    r.fail("topk_method", "'" + method + "': transformers' DeepseekV2 router runs greedy or group_limited_greedy");
  moe.group_limited = method == "group_limited_greedy";
  if (moe.group_limited) {
    for (const char* key : {"n_group", "topk_group"})
      if (!r.has(key)) r.fail(key, "required with topk_method group_limited_greedy");
    moe.n_group = r.integer("n_group", 1);
    moe.topk_group = r.integer("topk_group", 1);
    if (moe.experts % moe.n_group != 0)
      r.fail("n_group", std::to_string(moe.n_group) + " groups do not split n_routed_experts " +
                            std::to_string(moe.experts) + " evenly");
    if (moe.topk_group > moe.n_group)
      r.fail("topk_group", std::to_string(moe.topk_group) + " exceeds n_group " + std::to_string(moe.n_group));
  } else {
    // greedy: n_group / topk_group are not read.
    moe.n_group = 1;
    moe.topk_group = 1;
  }
  if (auto f = r.opt_integer("moe_layer_freq", 1); f && *f != 1)
    r.fail("moe_layer_freq", "transformers' DeepseekV2 makes every layer from first_k_dense_replace on "
                             "a MoE layer (moe_layer_freq is DeepSeek's remote code only): set it to 1");
  if (auto sf = r.opt_string("scoring_func"); sf && *sf != "softmax")
    r.fail("scoring_func", "'" + *sf + "': transformers' DeepseekV2 router is softmax only");
  if (r.boolean("output_router_logits", false))
    r.fail("output_router_logits", "DeepseekV2ForCausalLM computes no auxiliary load-balancing loss");
}

void refuse_unmodelled(const Reader& r, bool moe) {
  if (r.has("quantization_config"))
    r.fail("quantization_config",
           "quantized checkpoints are not modelled (for QLoRA's 4-bit base use lora.base_dtype: "
           "nf4 on the unquantized config)");
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts",
                          "moe_intermediate_size", "num_experts_per_tok"}) {
    if (moe && (std::string(key) != "n_routed_experts" || is_deepseek(r.opt_string("model_type").value_or(""))))
      continue;  // read_moe_config / read_deepseek_config
    const json* v = r.get(key);
    if (v && !(v->is_number() && v->get<double>() == 0.0)) r.fail(key, kMoeHint);
  }
  for (const char* key : {"kv_lora_rank", "q_lora_rank"})
    if (r.has(key) && !is_deepseek(r.opt_string("model_type").value_or("")))
      r.fail(key, "multi-head latent attention is modelled for model_type deepseek_v3 and deepseek_v2 only");
  for (const char* key : {"text_config", "vision_config", "audio_config"})
    if (r.has(key))
      r.fail(key, "a multimodal config: memsim models the text decoder only (give its text_config "
                  "as a config of its own)");
  if (r.boolean("is_encoder_decoder", false))
    r.fail("is_encoder_decoder", "encoder-decoder models are not modelled");
  if (r.boolean("add_cross_attention", false))
    r.fail("add_cross_attention", "cross-attention layers are not modelled");
  if (auto tp = r.opt_integer("pretraining_tp", 1); tp && *tp > 1)
    r.fail("pretraining_tp", "the sliced projections of pretraining_tp > 1 are not modelled (1 is)");
}

void read_rope(const Reader& r, const std::string& key) {
  const json* v = r.get(key);
  if (!v) return;
  if (!v->is_object()) r.fail(key, "expected an object or null, got " + Reader::shown(*v));
  std::string type_key = key + ".rope_type";
  auto it = v->find("rope_type");
  if (it == v->end() || it->is_null()) {
    it = v->find("type");
    type_key = key + ".type";
  }
  if (it == v->end() || it->is_null()) return;  // rope_parameters with only rope_theta
  if (!it->is_string()) r.fail(type_key, "expected a string, got " + Reader::shown(*it));
  const std::string type = it->get<std::string>();
  for (const auto& t : rope_types())
    if (t == type) return;
  r.fail(type_key, "rope type '" + type + "' is not modelled (modelled: " + join(rope_types()) +
                       ": they change only the frequencies)");
}

// The rope_scaling (or rope_parameters) type and factor, for memsim serve's RoPE cache
// (ModelConfig::rope_scaling_type). read_rope has checked the type; a factor that is not a
// positive number is refused by key.
void record_rope_scaling(const Reader& r, ModelConfig& m) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* v = r.get(key);
    if (!v || !v->is_object()) continue;
    auto it = v->find("rope_type");
    if (it == v->end() || it->is_null()) it = v->find("type");
    if (it == v->end() || !it->is_string()) continue;
    m.rope_scaling_type = it->get<std::string>();
    auto f = v->find("factor");
    if (f != v->end() && !f->is_null()) {
      if (!f->is_number() || f->get<double>() <= 0.0)
        r.fail(std::string(key) + ".factor", "expected a positive number, got " + Reader::shown(*f));
      m.rope_scaling_factor = f->get<double>();
    }
    return;
  }
}

graph::Activation read_activation(const Reader& r, const ArchitectureRow& row) {
  const std::string key = row.activation_key;
  const auto name = r.opt_string(key);
  if (!name) return row.arch.act;  // the config class's default
  for (const auto& [hf, act] : hf_activations())
    if (hf == *name) return act;
  std::vector<std::string> known;
  for (const auto& [hf, act] : hf_activations()) known.push_back(hf);
  r.fail(key, "memsim has no activation for '" + *name + "' (modelled: " + join(known) + ")");
}

// The sliding window (0 = none) and which layers slide.
void read_sliding(const Reader& r, const ArchitectureRow& row, int64_t layers,
                  graph::DecoderArch& arch, SlidingRule& rule) {
  rule = row.sliding;
  arch.sliding_window = 0;
  if (row.sliding_source == SlidingSource::none) return;
  // Absent: the config class's default; null: None (no window).
  const auto given = r.opt_integer("sliding_window", 1);
  const int64_t window = r.present("sliding_window") ? given.value_or(0) : row.config_sliding_window;
  switch (row.sliding_source) {
    case SlidingSource::every_layer:
      arch.sliding_window = window;
      break;
    case SlidingSource::qwen:
      // Qwen2Config / Qwen3Config: sliding_window = sliding_window if use_sliding_window
      // else None; layer_types default: layers >= max_window_layers slide.
      arch.sliding_window = r.boolean("use_sliding_window", false) ? window : 0;
      rule = SlidingRule{SlidingRule::Kind::from_layer,
                         r.opt_integer("max_window_layers", 0).value_or(28), 0, {}};
      break;
    case SlidingSource::alternate:
      arch.sliding_window = window;
      break;
    case SlidingSource::pattern: {
      arch.sliding_window = window;
      const int64_t p = r.opt_integer("sliding_window_pattern", 1).value_or(6);
      rule = SlidingRule{SlidingRule::Kind::pattern, p - 1, 1, {}};
      break;
    }
    case SlidingSource::none:
      break;
  }
  if (const json* types = r.get("layer_types")) {
    if (!types->is_array()) r.fail("layer_types", "expected a list, got " + Reader::shown(*types));
    if (static_cast<int64_t>(types->size()) != layers)
      r.fail("layer_types", std::to_string(types->size()) + " entries for " +
                                std::to_string(layers) + " layers (num_hidden_layers)");
    SlidingRule list{SlidingRule::Kind::list, 0, 0, {}};
    for (const json& t : *types) {
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s != "sliding_attention" && s != "full_attention")
        r.fail("layer_types", "expected \"sliding_attention\" or \"full_attention\" entries, got " +
                                  Reader::shown(t));
      list.layers.push_back(s == "sliding_attention" ? 1 : 0);
    }
    rule = list;
  }
}

// attn_pdrop / resid_pdrop / embd_pdrop (GPT-2, all three: memsim's hf-gpt2 applies one p
// to the three) or attention_dropout (the others: the attention probabilities; Phi-3 also
// its residual dropout).
double read_dropout(const Reader& r, const ArchitectureRow& row, graph::DecoderArch& arch) {
  auto probability = [&](const char* key, double fallback) {
    const double p = r.opt_number(key).value_or(fallback);
    if (p < 0.0 || p >= 1.0) r.fail(key, "expected a probability in [0, 1), got " + Reader::shown(*r.get(key)));
    return p;
  };
  if (row.family == ModelFamily::hf_gpt2) {
    const double p = probability("attn_pdrop", 0.1);  // GPT2Config's defaults: 0.1 each
    for (const char* key : {"resid_pdrop", "embd_pdrop"})
      if (probability(key, 0.1) != p)
        r.fail(key, "differs from attn_pdrop: memsim's hf-gpt2 has one dropout probability for "
                    "attention, residual and embedding dropout");
    return p;
  }
  const double p = probability("attention_dropout", 0.0);
  if (std::string(row.name) == "phi3") {
    // Phi-3 (v4.45) drops both branch outputs with resid_pdrop (DecoderArch's
    // residual_dropout) and never calls its embed_dropout (embd_pdrop is inert).
    const double resid = probability("resid_pdrop", 0.0);
    if (resid != 0.0 && resid != p)
      r.fail("resid_pdrop", "differs from attention_dropout: memsim has one dropout probability "
                            "(model.dropout) for the attention probabilities and Phi-3's residual dropout");
    if (resid != 0.0) {
      arch.residual_dropout = true;
      return resid;
    }
  }
  return p;
}

std::optional<DType> read_dtype(const Reader& r) {
  // transformers >= 4.56 writes "dtype", older versions "torch_dtype".
  const char* key = r.present("dtype") ? "dtype" : "torch_dtype";
  const auto name = r.opt_string(key);
  if (!name) return std::nullopt;
  if (*name == "float32") return DType::fp32;
  if (*name == "bfloat16") return DType::bf16;
  if (*name == "float16") return DType::fp16;
  r.fail(key, "'" + *name + "' is not a parameter dtype memsim models (float32, bfloat16, float16)");
}

}  // namespace

HfConfig parse_hf_config(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte: 1-based position of the last character read.
    const size_t byte = e.byte > 0 ? e.byte - 1 : 0;
    size_t column = 0;
    const std::string line = line_col(text, byte, &column);
    std::string reason = e.what();
    const size_t colon = reason.find(": ", reason.find("parse error"));
    if (colon != std::string::npos) reason = reason.substr(colon + 2);
    throw ScenarioError(source + ":" + line + ": (json): invalid JSON at byte " + std::to_string(byte) +
                        " (line " + line + ", column " + std::to_string(column) + "): " + reason);
  }
  if (!j.is_object())
    throw ScenarioError(source + ":1: (json): expected an object of keys (a Hugging Face config.json), got " +
                        std::string(j.type_name()));
  const Reader r(j, text, source);

  HfConfig out;
  const auto model_type = r.opt_string("model_type");
  if (!model_type) r.fail("model_type", "required (one of " + architecture_list() + ")");
  out.model_type = *model_type;
  if (*model_type == "gemma3")
    r.fail("model_type", "'gemma3' is the multimodal Gemma 3 (a vision tower memsim does not "
                         "model): give its text_config, model_type gemma3_text, as a config of its own");
  const ArchitectureRow* row = find_architecture(*model_type);
  if (!row) {
    std::vector<std::string> names;
    for (const ArchitectureRow& a : architecture_rows()) names.push_back(a.name);
    r.fail("model_type", "unknown model_type '" + *model_type + "'" +
                             scenario_detail::did_you_mean(*model_type, names) +
                             " (supported: " + architecture_list() + ")");
  }
  refuse_unmodelled(r, is_moe_row(*model_type));
  if (const auto name = r.opt_string("_name_or_path")) out.name_or_path = *name;

  ModelConfig& m = out.model;
  m.family = row->family;
  m.arch = row->arch;
  const bool gpt2 = row->family == ModelFamily::hf_gpt2;
  const std::string hidden_key = gpt2 ? "n_embd" : "hidden_size";
  const std::string heads_key = gpt2 ? "n_head" : "num_attention_heads";
  m.d_model = r.integer(hidden_key, 1);
  m.layers = r.integer(gpt2 ? "n_layer" : "num_hidden_layers", 1);
  m.heads = r.integer(heads_key, 1);
  m.vocab = r.integer("vocab_size", 1);
  m.context_length = r.integer(gpt2 ? "n_positions" : "max_position_embeddings", 1);
  if (gpt2) {
    // GPT2Config: n_inner None = 4 * n_embd.
    m.d_ff = r.opt_integer("n_inner", 1).value_or(4 * m.d_model);
    m.kv_heads = m.heads;
    if (!r.boolean("scale_attn_weights", true))
      r.fail("scale_attn_weights", "false is not modelled (GPT-2 divides the scores by sqrt(head_dim))");
    if (r.boolean("scale_attn_by_inverse_layer_idx", false))
      r.fail("scale_attn_by_inverse_layer_idx", "the extra per-layer scaling is not modelled");
    if (r.boolean("reorder_and_upcast_attn", false))
      r.fail("reorder_and_upcast_attn", "GPT-2's upcast attention path is not modelled");
  } else {
    m.d_ff = r.integer("intermediate_size", 1);
    m.kv_heads = r.opt_integer("num_key_value_heads", 1).value_or(m.heads);
  }
  if (m.kv_heads > m.heads || m.heads % m.kv_heads != 0)
    r.fail("num_key_value_heads", std::to_string(m.kv_heads) + " KV heads do not divide " +
                                      std::to_string(m.heads) + " attention heads");
  // head_dim: written, else the config class's default (Gemma 256, Qwen3 128), else
  // hidden_size / heads.
  m.arch.head_dim = r.opt_integer("head_dim", 1).value_or(row->config_head_dim);
  if (m.arch.head_dim == 0 && m.d_model % m.heads != 0)
    r.fail(heads_key, std::to_string(m.heads) + " heads do not divide " + hidden_key + " " +
                          std::to_string(m.d_model) + " (and there is no head_dim)");
  const int64_t hd = head_dim(m);
  m.tied_embeddings = r.boolean("tie_word_embeddings", row->tied);

  m.arch.act = read_activation(r, *row);
  if (row->reads_attention_bias) {
    const bool bias = r.boolean("attention_bias", false);
    m.arch.qkv_bias = bias;
    m.arch.o_bias = bias;
  }
  if (row->reads_mlp_bias) m.arch.mlp_bias = r.boolean("mlp_bias", false);
  if (row->reads_softcap) {
    // Absent: the config class's default (Gemma-2 50 / 30, Gemma-3 none); null: none.
    for (auto [key, out_value, fallback] :
         {std::tuple{"attn_logit_softcapping", &m.arch.attn_softcap, row->arch.attn_softcap},
          std::tuple{"final_logit_softcapping", &m.arch.final_softcap, row->arch.final_softcap}}) {
      const auto v = r.opt_number(key);
      if (v && *v < 0.0) r.fail(key, "expected a number >= 0, got " + Reader::shown(*r.get(key)));
      *out_value = r.present(key) ? v.value_or(0.0) : fallback;
    }
  }

  read_rope(r, "rope_scaling");
  read_rope(r, "rope_parameters");
  record_rope_scaling(r, m);
  // partial_rotary_factor: top level, or inside rope_parameters (transformers v5).
  std::string factor_key = "partial_rotary_factor";
  std::optional<double> factor = r.opt_number(factor_key);
  if (const json* rp = r.get("rope_parameters"); !factor && rp && rp->contains("partial_rotary_factor") &&
                                                  !(*rp)["partial_rotary_factor"].is_null()) {
    factor_key = "rope_parameters.partial_rotary_factor";
    const json& v = (*rp)["partial_rotary_factor"];
    if (!v.is_number()) r.fail(factor_key, "expected a number, got " + Reader::shown(v));
    factor = v.get<double>();
  }
  if (factor && *factor != 1.0) {
    if (!row->reads_partial_rotary)
      r.fail(factor_key, "partial rotary embeddings are modelled for phi3 only");
    if (!(*factor > 0.0 && *factor < 1.0))
      r.fail(factor_key, "expected a number in (0, 1], got " + std::to_string(*factor));
    m.arch.rotary_dim = static_cast<int64_t>(static_cast<double>(hd) * *factor);  // int(hd * f)
    if (m.arch.rotary_dim < 2 || m.arch.rotary_dim % 2 != 0)
      r.fail(factor_key, "gives an odd or empty rotary dimension " + std::to_string(m.arch.rotary_dim) +
                             " of head_dim " + std::to_string(hd));
  }
  if (!gpt2 && hd % 2 != 0)
    r.fail(r.present("head_dim") ? "head_dim" : heads_key,
           "RoPE needs an even head size, head_dim = " + std::to_string(hd));

  if (is_deepseek(*model_type)) read_deepseek_config(r, m);
  else if (is_moe_row(*model_type)) read_moe_config(r, *model_type, m);
  read_sliding(r, *row, m.layers, m.arch, out.sliding);
  m.dropout = read_dropout(r, *row, m.arch);
  out.params = read_dtype(r);
  return out;
}

bool read_config_file(std::string& path, std::string& text, std::string& error) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) path = (std::filesystem::path(path) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot open '" + path + "': " + std::strerror(errno);
    return false;
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    error = "cannot read '" + path + "'";
    return false;
  }
  text = buffer.str();
  return true;
}

}  // namespace memsim
