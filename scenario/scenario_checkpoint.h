// The checkpoint.policy spec language (scenario key checkpoint.policy, and
// `memsim compare --policies`): parsing a spec into a CheckpointConfig and printing it
// back. Read by the scenario reader and the command line; sim/step/checkpoint_policy.h turns
// a config into a per-layer plan.
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
//   offload[:N]          no checkpointing; save_on_cpu around every layer, or the first N
//                        (checkpoint.offload, graph/offload.h)
//
// Contract: errors throw PolicyError with a message naming the offending text.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "scenario/scenario.h"

namespace memsim {

class PolicyError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// One spec ("uniform:2") as a CheckpointConfig (policy "uniform", layers_per_segment 2).
CheckpointConfig parse_policy(const std::string& spec);
// A --policies list. Commas separate policies, but a piece that is not a policy name
// continues the previous policy's argument list: "none,modules:attention,mlp,full" is
// {none, modules:attention,mlp, full}.
std::vector<std::string> split_policies(const std::string& list);
// `policy` as the user's script would call it: the scenario's checkpoint.reentrant and
// checkpoint.early_stop (how torch.utils.checkpoint is called, not which regions) carried
// over, so that `compare --policies` and `optimize` try other regions with the same call.
CheckpointConfig with_call_of(CheckpointConfig policy, const CheckpointConfig& user);

// The spec that parse_policy reads back ("uniform:2", "custom:0,3.mlp").
std::string policy_label(const CheckpointConfig& config);
// A non-negative decimal count of at most 9 digits, or nullopt.
std::optional<int64_t> parse_count(const std::string& s);
// "a,b,c" split at `sep` (empty pieces kept).
std::vector<std::string> split_list(const std::string& text, char sep);

}  // namespace memsim
