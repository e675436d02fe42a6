// The Megatron-LM command-line flags that give a checkpointing plan, when stock flags can.
//
// Megatron's recompute settings are one set for every rank and apply to each rank's own
// (local) layers: --recompute-granularity selective checkpoints every layer's core
// attention; --recompute-granularity full --recompute-method block --recompute-num-layers N
// checkpoints the first N local layers whole (uniform with 1 layer per group is block with
// all layers). Plans that mix choices otherwise (some layers whole, others selective, or
// attention / MLP halves) have no stock flags.
//
// Contract: returns the flags ("" for the plan that checkpoints nothing), or nullopt.
#pragma once

#include <optional>
#include <string>

#include "graph/checkpoint.h"

namespace memsim {

std::optional<std::string> megatron_recompute_flags(const graph::CheckpointPlan& plan);

}  // namespace memsim
