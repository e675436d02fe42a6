// The named checkpointing policies `memsim optimize` must never lose to (issue #18 item 2).
//
// Why: the search (sim/search/optimize.h) walks plans by a model of *requested* bytes,
// which cannot see the caching allocator's fragmentation. Two plans with the same
// modelled peak (the optimizer step's, say) can differ by GiBs of reserved memory, and
// the walk gives up after a few verifications: it used to answer NO PLAN for budgets
// that `compare --policies full` met (cs336-xl, 96 layers, seq 512: full reserves
// 191.47 GiB, the budgets 192-195 GiB gave NO PLAN). The named policies below are
// therefore simulated as well, where they can beat the search's answer.
//
// Contract: named_policies(layers, choices) lists the policies of the `compare` spec
// language (scenario/scenario_checkpoint.h) that fall in the optimizer's plan space, the
// per-layer choices it was given plus segments of whole layers:
//   none, full, selective, modules, modules:attention, modules:mlp, block:N (N = 1..L-1),
//   uniform:K (K = 2..min(L, 8)) and sqrt.
// A policy is listed only when every choice its plan makes is in `choices` (`layer` for
// full, block, uniform and sqrt). per_layer ones first, otherwise in the order above; a plan
// equal to an earlier one (sqrt of 4 layers is uniform:2) is listed once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/checkpoint.h"
#include "scenario/scenario.h"

namespace memsim {

struct NamedPolicy {
  std::string spec;           // as `compare --policies` spells it ("uniform:2")
  CheckpointConfig config;    // parse_policy(spec)
  graph::CheckpointPlan plan; // make_plan(config, layers)
  // Every region is one layer or part of one (the search's cost model applies). false:
  // segments of several layers (uniform:K, sqrt), which store less than the model knows.
  bool per_layer = true;
  bool uniform = true;        // the same choice in every layer (not block:N)
};

std::vector<NamedPolicy> named_policies(int64_t layers,
                                        const std::vector<graph::LayerCheckpoint>& choices);

}  // namespace memsim
