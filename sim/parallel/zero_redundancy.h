// ZeRO stage 1 for the cs336 / hf-* families (parallel.zero: 1, parallel.sharding: none,
// parallel.data > 1): torch.distributed.optim.ZeroRedundancyOptimizer wrapped around the
// scenario's optimizer, with the model in DistributedDataParallel (sim/parallel/data_parallel.h).
//
// torch 1.13 / 2.x (torch/distributed/optim/zero_redundancy_optimizer.py):
//  - _partition_parameters: the parameters of each param group are sorted by numel,
//    largest first (a stable sort: equal sizes keep registration order), and each goes
//    whole to the rank whose partition is smallest so far (_get_min_index: the first
//    such rank). Rank r's local optimizer is built over its partition, in that order.
//  - step(): _local_step runs the local optimizer (state and temporaries exist for the
//    partition only, created in partition order); _sync_params then broadcasts every
//    rank's updated parameters in place (parameters_as_bucket_view=False, the default:
//    parameter by parameter, no buffer). Gradients stay whole on every rank (DDP
//    all-reduces them all) and are freed by zero_grad as without ZeRO.
// Left out: parameters_as_bucket_view=True (per-rank flat buckets the parameters become
// views of), overlap_with_ddp.
//
// Contract:
//  - zero_redundancy_partition(numel, d)[r] lists the parameter indices rank r owns, in
//    the order its optimizer steps them; every index appears exactly once.
//  - The simulated rank is the one whose partition has the most bytes (ties: the lowest
//    rank): it holds the most optimizer state. zero_redundancy_rank() says which and why.
//  - make_zero_redundancy_optimizer() steps `inner` over that rank's partition only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "graph/runtime.h"
#include "program/rank_info.h"
#include "scenario/scenario.h"
#include "sim/optim/optimizer_step.h"

namespace memsim {

std::vector<std::vector<int32_t>> zero_redundancy_partition(const std::vector<uint64_t>& numel,
                                                            int64_t d);

// The rank simulated and why (world = parallel.data); `bytes[i]` is parameter i's size.
struct ZeroRedundancyRank {
  int64_t rank = 0;
  std::vector<uint64_t> partition_bytes;  // per rank
  RankInfo info;
};
ZeroRedundancyRank zero_redundancy_rank(const std::vector<std::vector<int32_t>>& partition,
                                        const std::vector<uint64_t>& bytes,
                                        const Scenario& scenario);

// ZeroRedundancyOptimizer(model.parameters(), optimizer_class=...) on the worst rank;
// records that rank in rt.program().rank.
std::unique_ptr<OptimizerSim> make_zero_redundancy_optimizer(std::unique_ptr<OptimizerSim> inner,
                                                             graph::Runtime& rt,
                                                             const Scenario& scenario,
                                                             uint64_t param_elem);

}  // namespace memsim
