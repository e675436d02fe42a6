// Checkpointing policies: the names users write (scenario key checkpoint.policy, and
// `memsim compare --policies`) turned into a graph::CheckpointPlan, one choice per layer.
//
// Policy specs (parse_policy):
//   none                 nothing
//   full                 every transformer layer its own region
//   uniform:K            groups of K consecutive layers per region (Megatron uniform,
//                        the common `checkpoint_sequential` loop); K = layers_per_segment
//   block:N              the first N layers, each its own region (Megatron block)
//   modules[:attention,mlp]  the attention half and/or the MLP half of every layer
//   selective            core attention only (QK^T, softmax, dropout, attn·V; Megatron)
//   sqrt                 segments of round(sqrt(layers)) layers (Chen et al. 2016)
//   sac-op               torchtitan's op-level selective AC on every layer
//   sac-layer:N          torchtitan's layer-level selective AC: every N-th layer whole
//   custom:ITEM,...      ITEM = a layer index (whole layer), a module name for every
//                        layer (attention, mlp, selective), or LAYER.MODULE ("3.mlp")
// Module names: attention|attn, mlp|ffn, selective|core_attention, layer, modules.
//
// Contract: errors (unknown policy, bad number, layer out of range, a combination one
// layer cannot have) throw PolicyError with a message naming the offending text.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph/checkpoint.h"
#include "scenario/scenario.h"
#include "scenario/scenario_checkpoint.h"  // the spec language (parse_policy, policy_label)
#include "sim/step/training_script.h"

namespace memsim {

// The per-layer plan of a policy for a model of `layers` layers.
graph::CheckpointPlan make_plan(const CheckpointConfig& config, int64_t layers);
// A plan as a checkpoint config (policy none, full or custom) that make_plan turns back
// into the same choices (segments of more than one layer are not expressible: whole-layer
// choices become single-layer regions).
CheckpointConfig config_for_plan(const graph::CheckpointPlan& plan);

// The engine build_program installs for the scenario's policy (nullptr for none):
// non-reentrant (early stop as the script says) unless checkpoint.reentrant is true or
// the family is megatron (graph::CheckpointPlan::reentrant).
std::unique_ptr<graph::CheckpointEngine> make_checkpoint_engine(graph::Runtime& rt,
                                                                const Scenario& scenario,
                                                                const TrainingScript& script);

}  // namespace memsim
