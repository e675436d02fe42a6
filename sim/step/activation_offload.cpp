#include "sim/step/activation_offload.h"

#include <string>

#include "scenario/offload_keys.h"
#include "scenario/scenario_checkpoint.h"

namespace memsim {

std::unique_ptr<graph::OffloadEngine> make_offload_engine(graph::Runtime& rt,
                                                          const Scenario& s,
                                                          const graph::CheckpointEngine* checkpoint) {
  if (!offloads(s.checkpoint)) return nullptr;
  const std::string where = s.checkpoint.offload_where.empty() ? s.source : s.checkpoint.offload_where;
  std::vector<bool> layers = offload_layers(s.checkpoint, s.model.layers);
  if (checkpoint != nullptr) {
    for (size_t l = 0; l < layers.size(); ++l) {
      if (!layers[l] || checkpoint->plan().at(static_cast<int32_t>(l)) == graph::LayerCheckpoint::keep)
        continue;
      CheckpointConfig policy = s.checkpoint;  // the policy alone, without the offload list
      policy.offload.clear();
      policy.offload_all = false;
      throw ScenarioError(where + ": checkpoint.offload: layer " + std::to_string(l) +
                          " is also checkpointed by checkpoint.policy " + policy_label(policy) +
                          "; save_on_cpu inside a checkpointed region is not modelled (offload "
                          "the layers the policy keeps, e.g. block:N with the others offloaded)");
    }
  }
  if (rt.numeric != nullptr)
    throw ScenarioError(where + ": checkpoint.offload: numeric mode does not model host copies "
                                "of saved tensors; remove checkpoint.offload");
  return std::make_unique<graph::OffloadEngine>(rt, std::move(layers));
}

}  // namespace memsim
