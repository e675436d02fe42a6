// checkpoint.offload_activations (issue #16 item 7): torchtune's enable_activation_offloading,
// its OffloadActivations context around the model's forward (the model:
// graph/offload_streams.h, docs/offload.md "torchtune's OffloadActivations"). Internal to
// the scenario loader.
//
// Contract: read_offload_activations reads the bool key (default false: nothing changes);
// when true it refuses by key (FILE:LINE: KEY, exit 1) what the recipes do not allow or
// memsim does not model with it (below). The loader stores the value in
// RecipeFeatures::offload_activations; offloads_activations(s) reads it.
//
//  - checkpoint.policy other than full (the recipes raise without
//    enable_activation_checkpointing, and checkpoint every TransformerSelfAttentionLayer);
//    checkpoint.reentrant true (torchtune's checkpoint_wrapper is NO_REENTRANT);
//  - model.implementation other than torchtune (the NoOpManager is hooked on model.output,
//    which only torchtune's decoder has; transformers' lm_head would be offloaded);
//  - checkpoint.offload (save_on_cpu and OffloadActivations together: not a recipe);
//  - precision.params fp32 (RMSNorm's x.float() is x itself, so the re-run saves a view of
//    the unpacked input and OffloadActivations calls record_stream, whose free depends on
//    GPU progress: not modelled);
//  - step.compile, step.kind other than train, parallel.data / sharding (torchtune's
//    distributed recipe uses FSDP2, not modelled with its model code).
#pragma once

#include "scenario/scenario.h"

namespace memsim::scenario_detail {

struct Doc;  // scenario/scenario_doc.h

// Reads and checks the key; returns its value.
bool read_offload_activations(const Doc& d, const Scenario& s);

}  // namespace memsim::scenario_detail

namespace memsim {
inline constexpr const char* kOffloadActivationsKey = "checkpoint.offload_activations";
// Whether the scenario turns torchtune's OffloadActivations on.
bool offloads_activations(const Scenario& s);
}  // namespace memsim
