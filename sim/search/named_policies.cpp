#include "sim/search/named_policies.h"

#include <algorithm>
#include <cmath>

#include "sim/step/checkpoint_policy.h"

namespace memsim {

namespace {

bool in_space(const graph::CheckpointPlan& plan, const std::vector<graph::LayerCheckpoint>& choices) {
  for (graph::LayerCheckpoint c : plan.layers)
    if (std::find(choices.begin(), choices.end(), c) == choices.end()) return false;
  return true;
}

// Some region spans two consecutive layers.
bool has_segments(const graph::CheckpointPlan& plan) {
  for (size_t l = 1; l < plan.segment.size(); ++l)
    if (plan.layers[l] == graph::LayerCheckpoint::layer &&
        plan.layers[l - 1] == graph::LayerCheckpoint::layer && plan.segment[l] == plan.segment[l - 1])
      return true;
  return false;
}

}  // namespace

std::vector<NamedPolicy> named_policies(int64_t layers,
                                        const std::vector<graph::LayerCheckpoint>& choices) {
  std::vector<std::string> specs = {"none", "full", "selective", "modules", "modules:attention",
                                    "modules:mlp", "sqrt"};
  for (int64_t k = 2; k <= std::min<int64_t>(layers, 8); ++k) specs.push_back("uniform:" + std::to_string(k));
  for (int64_t n = 1; n < layers; ++n) specs.push_back("block:" + std::to_string(n));
  std::vector<NamedPolicy> out;
  for (const std::string& spec : specs) {
    NamedPolicy p;
    p.spec = spec;
    p.config = parse_policy(spec);
    p.plan = make_plan(p.config, layers);
    if (!in_space(p.plan, choices)) continue;
    p.per_layer = !has_segments(p.plan);
    p.uniform = p.config.policy != CheckpointPolicy::block;
    // sqrt of a model of few layers is uniform:K or full again: keep the first spelling.
    bool duplicate = false;
    for (const NamedPolicy& q : out)
      duplicate = duplicate || (q.plan.layers == p.plan.layers && q.plan.segment == p.plan.segment);
    if (!duplicate) out.push_back(std::move(p));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const NamedPolicy& a, const NamedPolicy& b) { return a.per_layer > b.per_layer; });
  return out;
}

}  // namespace memsim
