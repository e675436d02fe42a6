// Model parallelism of the megatron family: which tensor/pipeline settings are modelled,
// and which rank a model-parallel Program stands for.
//
// Tensor parallelism (parallel.tensor = t > 1) is modelled as Megatron splits a GPT
// (graph/models/megatron.h: column-parallel QKV and fc1, row-parallel proj and fc2, heads,
// vocab-parallel embedding and cross entropy over the vocabulary padded to a multiple of
// 128*t). Every tensor-parallel rank holds the same shapes, so rank 0 stands for all.
// parallel.sequence adds Megatron's sequence parallelism (Korthikanti et al. 2022).
// Pipeline parallelism (parallel.pipeline > 1) is sim/megatron/megatron_pipeline.h; the interleaved
// schedule needs the micro-batches (batch.grad_accum) to be a multiple of the stages.
// Tensor parallelism combines with data parallelism and the distributed optimizer
// (Megatron's 3D parallelism): each tensor-parallel rank's DDP grad buffer and optimizer
// shards cover its own shard of the model, split over its data-parallel group.
#pragma once

#include "program/rank_info.h"
#include "scenario/scenario.h"

namespace memsim {

// Throws ScenarioError ("SOURCE: parallel.KEY: ...") for model-parallel settings the
// megatron family does not model: heads or d_ff not divisible by tensor, interleaved
// with grad_accum not a multiple of pipeline, sequence parallel without tensor > 1.
void require_megatron_model_parallel_modelled(const Scenario& s);

// `base` (the data-parallel RankInfo) with the tensor-parallel reason filled in.
RankInfo megatron_model_parallel_rank(const Scenario& s, RankInfo base);

}  // namespace memsim
