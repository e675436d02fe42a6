// checkpoint.offload (issue #18 item 4): which transformer layers run their forward under
// torch.autograd.graph.save_on_cpu(pin_memory=True) (the model: graph/offload.h,
// docs/offload.md). Internal to the scenario loader and the modelled-features check.
//
// Contract:
//  - The value is a list of layer indices (`[0, 1, 5]`, or the scalar "0,1,5" that --set
//    gives), `all` (every layer), or `none` / an empty list (the default: no offload, the
//    program byte-identical to a scenario without the key). Indices must exist in the
//    model (0-based) and appear once; errors name checkpoint.offload and where it was set.
//  - require_offload_modelled refuses by key what is not modelled with offload: the
//    megatron family (its own pipeline and recompute), parallel.sharding (FSDP / FSDP2 /
//    DeepSpeed own the parameters the hooks would copy), step.compile (the partitioner
//    decides what is saved), step.kind other than train (nothing is unpacked).
//    A layer that is also checkpointed is refused where the plan is made
//    (sim/step/activation_offload.h).
#pragma once

#include <cstdint>
#include <vector>

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim {
namespace scenario_detail {
void read_offload(const Doc& d, const ModelConfig& m, CheckpointConfig& c);
}  // namespace scenario_detail

// Per layer of a model of `layers` layers: whether it is offloaded (all false: none).
std::vector<bool> offload_layers(const CheckpointConfig& c, int64_t layers);
bool offloads(const CheckpointConfig& c);
// The key's value as the scenario file spells it back: "all", "0,1,5", or "none".
std::string offload_label(const CheckpointConfig& c);

// Throws ScenarioError for a combination with checkpoint.offload that is not modelled.
void require_offload_modelled(const Scenario& s);
}  // namespace memsim
