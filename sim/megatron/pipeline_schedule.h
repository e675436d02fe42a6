// The order in which one pipeline rank runs its forward and backward passes, as
// Megatron-LM's schedules (megatron/core/pipeline_parallel/schedules.py) run them.
//
//  - 1f1b (forward_backward_pipelining_without_interleaving, PipeDream-flush): rank k of
//    p runs w = min(p - k - 1, m) warm-up forwards, then m - w steady pairs (forward of
//    micro-batch w + i, backward of i), then w cool-down backwards. Before its first
//    backward rank k holds min(p - k, m) micro-batches of activations.
//  - gpipe (not a Megatron schedule; GPipe's): all m forwards, then all m backwards in
//    the same order; every rank holds m micro-batches at once.
//  - interleaved (forward_backward_pipelining_with_interleaving, v model chunks per
//    rank): m * v virtual micro-batches, warm-up min((p - k - 1) * 2 + (v - 1) * p, m*v),
//    then 1F1B pairs, then cool-down. Virtual micro-batch j runs chunk
//    (j mod p*v) / p forward and chunk v - 1 - (j mod p*v) / p backward, each chunk
//    taking its micro-batches in order (Megatron's get_model_chunk_id with
//    microbatch_group_size_per_vp_stage = p; needs m a multiple of p).
//  - forward only (step.kind forward / forward-no-grad): the forwards in the same order,
//    no backwards.
//
// Contract: pure function of its arguments; every (chunk, micro-batch) appears once as a
// forward and (unless forward only) once as a backward, the backward after the forward.
#pragma once

#include <cstdint>
#include <vector>

#include "scenario/scenario.h"

namespace memsim {

struct PipelineAction {
  bool forward = true;
  int32_t chunk = 0;        // model chunk of this rank (0 unless interleaved)
  int32_t micro_batch = 0;  // 0 .. m - 1
};

// Rank `stage` of `p` with `v` chunks (1 unless interleaved) and `m` micro-batches.
std::vector<PipelineAction> pipeline_actions(PipelineSchedule schedule, int64_t p, int64_t v,
                                             int64_t m, int64_t stage, bool forward_only);

// The largest number of (chunk, micro-batch) forwards whose backward has not run yet, over
// the action list: the micro-batches of activations a rank holds at once.
int64_t max_in_flight(const std::vector<PipelineAction>& actions);

}  // namespace memsim
