#include "scenario/scenario_arch.h"

#include <charconv>
#include <filesystem>
#include <string>
#include <vector>

#include "scenario/hf_config.h"
#include "scenario/model_presets.h"
#include "scenario/megatron_arch_keys.h"
#include "scenario/scenario_family.h"
#include "scenario/scenario_implementation.h"
#include "scenario/transformers_version.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {
namespace {

// The knob keys (model.KEY), in the order docs/scenario-format.md lists them.
const std::vector<std::string>& knob_keys() {
  static const std::vector<std::string> keys = {
      "model.head_dim",      "model.qkv_bias",      "model.o_bias",          "model.mlp_bias",
      "model.qk_norm",       "model.norm",          "model.norm_placement",  "model.mlp",
      "model.activation",    "model.fused_qkv",     "model.fused_gate_up",   "model.embedding_scale",
      "model.attn_softcap",  "model.final_softcap", "model.sliding_window",  "model.sliding_layers",
      "model.rotary_dim"};
  return keys;
}

bool is_hf(ModelFamily f) { return family_row(f).hf; }

// Where a model value was decided: its own line, else the preset's or config's line,
// else the section's.
std::string origin(const Doc& d, const std::string& key) {
  if (const Field* f = d.find(key)) return f->where;
  if (const Field* p = d.find("model.preset")) return p->where;
  if (const Field* h = d.find("model.hf_config")) return h->where;
  return d.where_missing("model");
}

double read_softcap(const Field& f, const std::string& key) {
  const double v = read_number(f, key);
  if (v < 0.0) fail(f.where, key, "expected a number >= 0 (0 = no soft-capping), got '" + f.node.Scalar() + "'");
  return v;
}

bool parse_count(const std::string& text, int64_t& out) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && !text.empty() && out >= 0;
}

// model.sliding_layers: a list of 0/1 per layer, `all`, `every-other` or `N:M`.
SlidingRule read_sliding_layers(const Field& f, const std::string& key) {
  const std::string forms =
      "a list of 0/1 per layer, all, every-other, or N:M (N sliding layers then M full ones, repeated)";
  if (f.node.IsSequence()) {
    SlidingRule rule{SlidingRule::Kind::list, 0, 0, {}};
    for (const auto& item : f.node) {
      const std::string v = item.IsScalar() ? item.Scalar() : "";
      if (v != "0" && v != "1") fail(f.where, key, "expected 0 or 1 per layer, got " + describe(item) + " as an item");
      rule.layers.push_back(v == "1" ? 1 : 0);
    }
    return rule;
  }
  if (!f.node.IsScalar() || is_null(f.node)) fail(f.where, key, "expected " + forms + ", got " + describe(f.node));
  const std::string text = f.node.Scalar();
  if (text == "all") return SlidingRule{};
  if (text == "every-other") return SlidingRule{SlidingRule::Kind::every_other, 0, 0, {}};
  const size_t colon = text.find(':');
  int64_t n = 0, m = 0;
  if (colon != std::string::npos && parse_count(text.substr(0, colon), n) &&
      parse_count(text.substr(colon + 1), m) && n + m > 0 && n <= (int64_t{1} << 40) &&
      m <= (int64_t{1} << 40))
    return SlidingRule{SlidingRule::Kind::pattern, n, m, {}};
  fail(f.where, key, "expected " + forms + ", got '" + text + "'" +
                         did_you_mean(text, {"all", "every-other"}));
}

}  // namespace

ModelBase read_model_base(const Doc& d) {
  ModelBase base;
  const Field* preset_field = d.find("model.preset");
  const Field* config_field = d.find("model.hf_config");
  if (preset_field && config_field)
    fail(config_field->where, "model.hf_config",
         "give model.preset or model.hf_config, not both (model.preset is at " + preset_field->where + ")");
  if (preset_field) {
    const std::string name = read_string(*preset_field, "model.preset");
    const ModelConfig* preset = find_model_preset(name);
    if (!preset) {
      std::vector<std::string> names;
      for (const auto& p : model_presets()) names.push_back(p.name);
      fail(preset_field->where, "model.preset",
           "unknown model preset '" + name + "'" + did_you_mean(name, names) +
               " (`memsim presets` lists them)");
    }
    base.given = true;
    base.model = *preset;
    if (const HfConfig* config = find_config_preset(name)) {
      base.sliding = config->sliding;
      base.sliding_from_config = config->sliding.kind == SlidingRule::Kind::list;
    }
  } else if (config_field) {
    std::string path = read_string(*config_field, "model.hf_config");
    // A file's value is relative to the scenario's folder; a command line's (--set,
    // --model) to the working directory.
    const bool from_file = config_field->where.rfind("--", 0) != 0;
    if (from_file && std::filesystem::path(path).is_relative()) {
      const std::filesystem::path folder = std::filesystem::path(d.source).parent_path();
      if (!folder.empty()) path = (folder / path).lexically_normal().string();
    }
    std::string text, error;
    if (!read_config_file(path, text, error)) fail(config_field->where, "model.hf_config", error);
    const HfConfig config = parse_hf_config(text, path);
    base.given = true;
    base.model = config.model;
    base.model.hf_config = path;
    base.sliding = config.sliding;
    base.sliding_from_config = config.sliding.kind == SlidingRule::Kind::list;
    base.params = config.params;
  }
  return base;
}

void read_architecture(const Doc& d, const ModelBase& base, ModelConfig& m) {
  SlidingRule rule = base.sliding;
  if (const Field* f = d.find("model.architecture")) {
    const std::string name = read_string(*f, "model.architecture");
    const ArchitectureRow* row = find_architecture(name);
    if (!row) {
      std::vector<std::string> names;
      for (const ArchitectureRow& r : architecture_rows()) names.push_back(r.name);
      fail(f->where, "model.architecture",
           "unknown architecture '" + name + "'" + did_you_mean(name, names) + " (expected one of " +
               architecture_list() + ")");
    }
    if (const Field* family = d.find("model.family"); family && m.family != row->family)
      fail(family->where, "model.family",
           std::string("is ") + to_string(m.family) + ", but model.architecture " + name +
               " is a " + to_string(row->family) + " model (leave model.family out)");
    m.family = row->family;
    m.arch = row->arch;  // every knob back to the row's default
    rule = row->sliding;
    if (!base.given && !d.find("model.tied_embeddings")) m.tied_embeddings = row->tied;
  } else if (is_hf(m.family) && (!base.given || m.family != base.model.family)) {
    // A hand-written model, or a family named over a preset of another one: that
    // family's own architecture.
    m.arch = default_architecture(m.family).arch;
    rule = default_architecture(m.family).sliding;
  }

  for (const std::string& key : knob_keys()) {
    const Field* f = d.find(key);
    // Family megatron reads a few knobs as its own flags (scenario/megatron_arch_keys.h).
    if (f && m.family == ModelFamily::megatron && is_megatron_arch_knob(key)) continue;
    if (f && !is_hf(m.family))
      fail(f->where, key,
           std::string("an architecture knob of the Hugging Face families (hf-llama, hf-gpt2), "
                       "but the family is ") + to_string(m.family));
  }
  graph::DecoderArch& a = m.arch;
  if (const Field* f = d.find("model.head_dim")) a.head_dim = read_int(*f, "model.head_dim", 1);
  for (auto [key, out] : {std::pair{"model.qkv_bias", &a.qkv_bias}, {"model.o_bias", &a.o_bias},
                          {"model.mlp_bias", &a.mlp_bias}, {"model.fused_qkv", &a.fused_qkv},
                          {"model.fused_gate_up", &a.fused_gate_up},
                          {"model.embedding_scale", &a.embed_scale}}) {
    if (const Field* f = d.find(key)) *out = read_bool(*f, key);
  }
  if (const Field* f = d.find("model.qk_norm")) a.qk_norm = read_enum(*f, "model.qk_norm", qk_norm_names());
  if (const Field* f = d.find("model.norm")) a.norm = read_enum(*f, "model.norm", norm_names());
  if (const Field* f = d.find("model.norm_placement"))
    a.placement = read_enum(*f, "model.norm_placement", norm_placement_names());
  if (const Field* f = d.find("model.mlp")) a.mlp = read_enum(*f, "model.mlp", mlp_names());
  if (const Field* f = d.find("model.activation")) a.act = read_enum(*f, "model.activation", activation_names());
  if (const Field* f = d.find("model.attn_softcap")) a.attn_softcap = read_softcap(*f, "model.attn_softcap");
  if (const Field* f = d.find("model.final_softcap")) a.final_softcap = read_softcap(*f, "model.final_softcap");
  if (const Field* f = d.find("model.sliding_window")) a.sliding_window = read_int(*f, "model.sliding_window", 0);
  if (const Field* f = d.find("model.rotary_dim")) a.rotary_dim = read_int(*f, "model.rotary_dim", 1);
  const Field* layers_field = d.find("model.sliding_layers");
  if (layers_field) {
    rule = read_sliding_layers(*layers_field, "model.sliding_layers");
  }

  read_transformers_version(d, m);  // model.transformers (scenario/transformers_version.h)
  read_implementation(d, m);  // model.implementation (scenario/scenario_implementation.h)
  a.sliding_layers.clear();
  if (!is_hf(m.family)) return;
  if (a.sliding_window == 0) {
    if (layers_field)
      fail(layers_field->where, "model.sliding_layers",
           "says which layers slide, but there is no sliding window (model.sliding_window is 0)");
    return;
  }
  if (rule.kind == SlidingRule::Kind::list && static_cast<int64_t>(rule.layers.size()) != m.layers) {
    if (layers_field)
      fail(layers_field->where, "model.sliding_layers",
           std::to_string(rule.layers.size()) + " entries for " + std::to_string(m.layers) + " layers");
    fail(origin(d, "model.layers"), "model.layers",
         std::to_string(m.layers) + " layers, but the config's layer_types lists " +
             std::to_string(rule.layers.size()) +
             "; give model.sliding_layers for the new layer count");
  }
  a.sliding_layers = resolve_sliding(rule, m.layers);
}

void check_architecture(const Doc& d, const ModelConfig& m) {
  if (!is_hf(m.family)) return;
  const int64_t hd = head_dim(m);
  if (m.arch.rotary_dim > 0 && m.family == ModelFamily::hf_llama &&
      (m.arch.rotary_dim > hd || m.arch.rotary_dim % 2 != 0))
    fail(origin(d, "model.rotary_dim"), "model.rotary_dim",
         std::to_string(m.arch.rotary_dim) + " must be even and at most head_dim " + std::to_string(hd));
}

}  // namespace memsim::scenario_detail
