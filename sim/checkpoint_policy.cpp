#include "sim/checkpoint_policy.h"

#include <cmath>
#include <optional>

#include "sim/model_family.h"

namespace memsim {

using graph::CheckpointPlan;
using graph::LayerCheckpoint;

namespace {

bool is_policy_name(const std::string& word) {
  return parse_checkpoint_policy(word.substr(0, word.find(':'))).has_value();
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(sep, start);
    out.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

std::optional<int64_t> parse_count(const std::string& s) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoll(s);
}

// A module word as a per-layer choice.
std::optional<LayerCheckpoint> module_choice(const std::string& m) {
  if (m == "attention" || m == "attn") return LayerCheckpoint::attention;
  if (m == "mlp" || m == "ffn") return LayerCheckpoint::mlp;
  if (m == "selective" || m == "core_attention") return LayerCheckpoint::core_attention;
  if (m == "modules") return LayerCheckpoint::modules;
  if (m == "layer") return LayerCheckpoint::layer;
  return std::nullopt;
}

// Two choices for one layer combined (both regions checkpointed).
std::optional<LayerCheckpoint> combine(LayerCheckpoint a, LayerCheckpoint b) {
  using C = LayerCheckpoint;
  if (a == b || b == C::keep) return a;
  if (a == C::keep) return b;
  if (a == C::layer || b == C::layer) return C::layer;  // the whole layer covers the rest
  auto has = [&](C x) { return a == x || b == x; };
  if (has(C::modules)) return C::modules;
  if (has(C::attention) && has(C::mlp)) return C::modules;
  if (has(C::attention) && has(C::core_attention)) return C::attention;  // contains it
  return std::nullopt;  // core attention + MLP: no such region pair in the plan
}

// policy modules / custom: each item of checkpoint.custom merged into the layers' choices.
void add_items(CheckpointPlan& plan, const CheckpointConfig& c, size_t n) {
  const bool modules = c.policy == CheckpointPolicy::modules;
  std::vector<std::string> items = c.custom;
  if (items.empty()) items = {"attention", "mlp"};  // modules: both halves
  for (const std::string& item : items) {
    const size_t dot = item.find('.');
    const std::string head = item.substr(0, dot);
    std::optional<LayerCheckpoint> what;
    std::optional<int64_t> layer = parse_count(head);
    if (dot != std::string::npos) {
      what = module_choice(item.substr(dot + 1));
      if (!layer || !what)
        throw PolicyError("checkpoint item '" + item + "': expected LAYER.MODULE (e.g. 3.mlp)");
    } else if (layer) {
      what = LayerCheckpoint::layer;
    } else {
      what = module_choice(item);
      if (!what) throw PolicyError("checkpoint item '" + item + "': not a layer index or module name (attention, mlp, selective, layer)");
    }
    if (modules && (layer || (*what != LayerCheckpoint::attention && *what != LayerCheckpoint::mlp)))
      throw PolicyError("policy modules takes module names attention and mlp, not '" + item + "'");
    if (layer && static_cast<size_t>(*layer) >= n)
      throw PolicyError("checkpoint item '" + item + "': layer " + std::to_string(*layer) +
                        " does not exist (the model has " + std::to_string(n) + " layers, 0-based)");
    const size_t lo = layer ? static_cast<size_t>(*layer) : 0;
    const size_t hi = layer ? lo + 1 : n;
    for (size_t l = lo; l < hi; ++l) {
      const auto merged = combine(plan.layers[l], *what);
      if (!merged)
        throw PolicyError("checkpoint item '" + item + "': layer " + std::to_string(l) +
                          " cannot checkpoint both core attention and the MLP half "
                          "(use attention + mlp instead)");
      plan.layers[l] = *merged;
    }
  }
}

}  // namespace

CheckpointConfig parse_policy(const std::string& spec) {
  CheckpointConfig c;
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const bool has_arg = colon != std::string::npos;
  const std::optional<CheckpointPolicy> policy = parse_checkpoint_policy(name);
  if (!policy) throw PolicyError("unknown checkpoint policy '" + spec + "'");
  c.policy = *policy;
  if (c.policy == CheckpointPolicy::uniform || c.policy == CheckpointPolicy::block) {
    const auto k = parse_count(arg);
    if (!has_arg || !k || *k < 1)
      throw PolicyError("policy '" + spec + "': expected " + name + ":N with N >= 1");
    c.layers_per_segment = *k;
  } else if (c.policy == CheckpointPolicy::modules || c.policy == CheckpointPolicy::custom) {
    if (has_arg) c.custom = split(arg, ',');
    if (c.policy == CheckpointPolicy::custom && c.custom.empty())
      throw PolicyError("policy '" + spec + "': expected custom:ITEM,... (layers or modules)");
    for (const std::string& item : c.custom)
      if (item.empty()) throw PolicyError("policy '" + spec + "': empty item");
  } else if (has_arg) {
    throw PolicyError("policy '" + name + "' takes no argument (got '" + spec + "')");
  }
  return c;
}

std::vector<std::string> split_policies(const std::string& list) {
  std::vector<std::string> out;
  for (const std::string& piece : split(list, ',')) {
    if (piece.empty()) continue;
    if (!out.empty() && !is_policy_name(piece) && out.back().find(':') != std::string::npos)
      out.back() += "," + piece;
    else
      out.push_back(piece);
  }
  return out;
}

std::string policy_label(const CheckpointConfig& c) {
  using P = CheckpointPolicy;
  const std::string name = to_string(c.policy);
  if (c.policy == P::uniform || c.policy == P::block)
    return name + ":" + std::to_string(c.layers_per_segment);
  if ((c.policy == P::custom || c.policy == P::modules) && !c.custom.empty()) {
    std::string s = name + ":";
    for (size_t i = 0; i < c.custom.size(); ++i) s += (i ? "," : "") + c.custom[i];
    return s;
  }
  return name;
}

CheckpointPlan make_plan(const CheckpointConfig& c, int64_t layers) {
  CheckpointPlan plan;
  const size_t n = static_cast<size_t>(std::max<int64_t>(0, layers));
  plan.layers.assign(n, LayerCheckpoint::keep);
  auto segments_of = [&](int64_t k) {
    plan.layers.assign(n, LayerCheckpoint::layer);
    plan.segment.resize(n);
    for (size_t l = 0; l < n; ++l) plan.segment[l] = static_cast<int32_t>(l / static_cast<size_t>(k));
  };
  using P = CheckpointPolicy;
  switch (c.policy) {
    case P::none: return plan;
    case P::full: plan.layers.assign(n, LayerCheckpoint::layer); return plan;
    case P::uniform: segments_of(std::max<int64_t>(1, c.layers_per_segment)); return plan;
    case P::sqrt:
      segments_of(std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(n)))));
      return plan;
    case P::block:
      for (size_t l = 0; l < n && static_cast<int64_t>(l) < c.layers_per_segment; ++l)
        plan.layers[l] = LayerCheckpoint::layer;
      return plan;
    case P::selective: plan.layers.assign(n, LayerCheckpoint::core_attention); return plan;
    case P::modules:
    case P::custom: add_items(plan, c, n); return plan;
  }
  throw PolicyError(std::string("unknown checkpoint policy '") + to_string(c.policy) + "'");
}

CheckpointConfig config_for_plan(const CheckpointPlan& plan) {
  CheckpointConfig c;
  if (!plan.any()) return c;
  bool all_layers = true;
  for (LayerCheckpoint l : plan.layers) all_layers = all_layers && l == LayerCheckpoint::layer;
  if (all_layers) {
    c.policy = CheckpointPolicy::full;
    return c;
  }
  c.policy = CheckpointPolicy::custom;
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    switch (plan.layers[l]) {
      case LayerCheckpoint::keep: break;
      case LayerCheckpoint::layer: c.custom.push_back(std::to_string(l)); break;
      case LayerCheckpoint::modules:
        c.custom.push_back(std::to_string(l) + ".attention");
        c.custom.push_back(std::to_string(l) + ".mlp");
        break;
      case LayerCheckpoint::attention: c.custom.push_back(std::to_string(l) + ".attention"); break;
      case LayerCheckpoint::mlp: c.custom.push_back(std::to_string(l) + ".mlp"); break;
      case LayerCheckpoint::core_attention:
        c.custom.push_back(std::to_string(l) + ".selective");
        break;
    }
  }
  return c;
}

std::unique_ptr<graph::CheckpointEngine> make_checkpoint_engine(graph::Runtime& rt,
                                                                const Scenario& scenario,
                                                                const TrainingScript& script) {
  CheckpointPlan plan = make_plan(scenario.checkpoint, scenario.model.layers);
  if (!plan.any()) return nullptr;
  // Every family's emitter opens the candidate regions (graph::run_layers / run_region):
  // cs336, hf-gpt2 and hf-llama as torch.utils.checkpoint(use_reentrant=False) does
  // unless checkpoint.reentrant says true (Hugging Face's gradient_checkpointing_enable()
  // default), megatron as its reentrant CheckpointFunction (graph/megatron.h).
  plan.early_stop = script.checkpoint_early_stop;
  plan.reentrant = family_row(scenario.model.family).reentrant_checkpoint_only ||
                   scenario.checkpoint.reentrant.value_or(false);
  return std::make_unique<graph::CheckpointEngine>(rt, std::move(plan));
}

}  // namespace memsim
