#include "sim/megatron/megatron_recompute_flags.h"

#include <algorithm>

namespace memsim {

using graph::LayerCheckpoint;

std::optional<std::string> megatron_recompute_flags(const graph::CheckpointPlan& plan) {
  const auto& l = plan.layers;
  auto all = [&l](LayerCheckpoint c) {
    return std::all_of(l.begin(), l.end(), [c](LayerCheckpoint x) { return x == c; });
  };
  if (all(LayerCheckpoint::keep)) return std::string();
  if (all(LayerCheckpoint::core_attention)) return std::string("--recompute-granularity selective");
  // Block: the first N layers whole, the rest kept.
  const size_t n = static_cast<size_t>(
      std::find_if(l.begin(), l.end(), [](LayerCheckpoint x) { return x != LayerCheckpoint::layer; }) -
      l.begin());
  if (n > 0 && std::all_of(l.begin() + static_cast<long>(n), l.end(),
                           [](LayerCheckpoint x) { return x == LayerCheckpoint::keep; }))
    return "--recompute-granularity full --recompute-method block --recompute-num-layers " +
           std::to_string(n);
  return std::nullopt;
}

}  // namespace memsim
