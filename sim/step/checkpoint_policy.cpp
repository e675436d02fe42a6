#include "sim/step/checkpoint_policy.h"

#include <cmath>
#include <optional>

#include "scenario/scenario_family.h"
#include "sim/step/torchtitan_checkpoint.h"

namespace memsim {

using graph::CheckpointPlan;
using graph::LayerCheckpoint;

namespace {




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
    case P::sac_op:  // every block, each a region whose policy caches some op outputs
      plan.layers.assign(n, LayerCheckpoint::layer);
      plan.selective = torchtitan_op_sac_policy();
      return plan;
    case P::sac_layer:
      for (size_t l = 0; l < n; ++l)
        if (torchtitan_layer_sac_checkpoints(static_cast<int64_t>(l), c.layers_per_segment))
          plan.layers[l] = LayerCheckpoint::layer;
      return plan;
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
  // default), megatron as its reentrant CheckpointFunction (graph/models/megatron.h).
  // torchtitan's recipes pass early_stop=ac_config.early_stop (false by default).
  const bool torchtitan = scenario.checkpoint.policy == CheckpointPolicy::sac_op ||
                          scenario.checkpoint.policy == CheckpointPolicy::sac_layer;
  plan.early_stop =
      scenario.checkpoint.early_stop.value_or(torchtitan ? false : script.checkpoint_early_stop);
  // A compiled checkpointed block (docs/compile.md): the backward graph computes only what
  // the backward reads (dead code eliminated), whatever early_stop says (an option of the
  // eager re-run, which dynamo's traced checkpoint does not use): the re-run stops after
  // its last saved value.
  // torchtune's order is the other way round (compile_model, then
  // set_activation_checkpointing: graph/compile.h 4c): the eager checkpoint re-runs the
  // whole compiled forward, whose saved tensors are packed only after it returned, so
  // torch's early stop (raised at the last pack) cannot shorten it: no early stop.
  if (scenario.step.compile)
    plan.early_stop = scenario.model.arch.impl != graph::ModelImpl::torchtune;
  plan.reentrant = family_row(scenario.model.family).reentrant_checkpoint_only ||
                   scenario.checkpoint.reentrant.value_or(false);
  // torch.utils.checkpoint takes a context_fn only with use_reentrant=False.
  if (plan.reentrant && plan.selective.any())
    throw ScenarioError(scenario.source + ": checkpoint.reentrant: sac-op needs the "
                        "non-reentrant checkpoint (selective contexts)");
  return std::make_unique<graph::CheckpointEngine>(rt, std::move(plan));
}

}  // namespace memsim
