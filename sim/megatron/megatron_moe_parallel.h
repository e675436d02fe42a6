// Expert parallelism of the megatron family's Megatron-Core MoE layers (issue #15, Megatron
// part; graph/models/megatron_moe.cpp, docs/moe-megatron.md): the model shape's MoE part
// from the scenario, and how expert parameters are grouped for the DDP grad buffers and
// the distributed optimizer.
//
// Megatron-LM (d98e8a64ddf34856e74b24714e3bedb2f5a39553): the world of a stage splits
// TP x DP for dense parameters and ETP x EP x EDP for expert ones
// (megatron/core/parallel_state.py; theoretical_memory_usage.py:
// expert_data_parallel_size = world_size // (ETP * EP * PP)). DistributedDataParallel keeps
// the expert parameters in their own buffers (expert_parallel_buffers) reduced over the
// expert data-parallel group; the distributed optimizer shards those over that group
// (EDP ranks), the dense buffers over the data-parallel group as before.
//
// Contract: expert_data_parallel(s) = data * tensor / (EP * ETP) for a scenario the keys
// checked (scenario/megatron_moe_keys.h); megatron_moe_owned_numel returns, per parameter
// id, the elements rank 0 owns: dense parameters sharded as megatron_shard_numel over
// `data` in their registration order, expert parameters likewise over `edp`.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/models/megatron.h"
#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

graph::MegatronMoeShape megatron_moe_shape(const Scenario& s);
int64_t expert_data_parallel(const Scenario& s);
// `ids` / `expert`: the model's parameter_ids() and expert() (same length).
std::vector<uint64_t> megatron_moe_owned_numel(const graph::Runtime& rt, uint64_t elem,
                                               const std::vector<int32_t>& ids,
                                               const std::vector<bool>& expert, int64_t data,
                                               int64_t edp);
// Elements of the dense and the expert parameters (the two DDP buffers, unpadded).
struct MegatronMoeNumel {
  uint64_t dense = 0, expert = 0;
};
MegatronMoeNumel megatron_moe_numel(const graph::Runtime& rt, uint64_t elem,
                                    const std::vector<int32_t>& ids, const std::vector<bool>& expert);

}  // namespace memsim
