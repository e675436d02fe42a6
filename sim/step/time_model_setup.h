// What the schedule tells the time model while it emits a step (issue #18 item 1;
// program/step_cost.h, sim/analysis/step_time.h, docs/time-model.md).
//
// Contract:
//  - configure_time_model(rt, s): once per build, before any op: the dtype GEMMs
//    multiply in (Runtime::gemm_dtype), and, for each feature whose work the model does
//    not cost, a refusal naming its key (StepCost::refuse): tensor and pipeline
//    parallelism, FSDP / FSDP2 / DeepSpeed / ZeroRedundancyOptimizer sharding, CPU
//    offload, torch.compile, the Megatron family's optimizer, optimizers other than
//    torch Adam / AdamW / SGD and CS336's AdamW.
//  - add_optimizer_cost(rt, s): just before optimizer.step(): the HBM bytes of the step's
//    kernels for every parameter that has a .grad, from the kernel sequence of the
//    implementation (sim/step/time_model_setup.cpp cites torch/optim/adam.py), plus fp32
//    master weights' grad casts and copies back.
//  - add_ddp_all_reduce(rt, bucket_bytes, ranks): after each backward of a DDP model:
//    one ring all-reduce per bucket (torch DDP without no_sync() reduces every backward).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

void configure_time_model(graph::Runtime& rt, const Scenario& s);
void add_optimizer_cost(graph::Runtime& rt, const Scenario& s);
void add_ddp_all_reduce(graph::Runtime& rt, const std::vector<uint64_t>& bucket_bytes, int64_t ranks);

}  // namespace memsim
