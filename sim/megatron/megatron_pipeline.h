// Pipeline parallelism for the megatron family (parallel.pipeline = p > 1): one Program per
// pipeline stage, and the choice of the stage `memsim run` reports.
//
// What a stage (tensor-parallel rank 0, data-parallel rank 0 of pipeline rank k) runs, as
// Megatron-LM's pretrain_gpt does with pipelining:
//  - Setup: its model chunks (one, or v with parallel.pipeline_schedule interleaved; chunk
//    c of rank k holds the L/(p*v) layers of virtual stage c*p + k, or those of an uneven
//    split (parallel.pipeline_first_layers, ...: scenario/pipeline_split.h), numbered from
//    0 as Megatron's TransformerBlock numbers them; the first virtual stage adds the embedding,
//    the last the final LayerNorm, the output layer and the loss, with its own copy of
//    the tied word embedding, graph/models/megatron.h), then one DDP main_grad buffer per chunk
//    (each chunk is its own DistributedDataParallel; with MoE two: the dense parameters' and
//    the experts', sim/megatron/megatron_pipeline_moe.h), then the optimizer over all of them.
//  - Each step: zero_grad, the schedule's forwards and backwards (sim/megatron/pipeline_schedule.h),
//    then optimizer.step. A forward of a chunk that is not the first virtual stage
//    receives its input: torch.empty((s/t with SP else s, b, h), requires_grad=True) in the
//    parameters' dtype, a graph leaf kept (in the schedule's input_tensors list and by the
//    layers that save it) until that micro-batch's backward; its .grad is what is sent
//    back. The first and last virtual stages load the batch (get_batch on tensor-parallel
//    rank 0 copies all five fields); the others load nothing. After the output is sent,
//    deallocate_output_tensor (deallocate_pipeline_outputs, on in Megatron training)
//    replaces its data by a 1-element tensor: only the graph stays. A backward of a chunk
//    that is not the last virtual stage receives the output's gradient (same shape) and
//    runs the engine from the deallocated output (custom_backward). The schedule's Python
//    locals (input_tensor, output_tensor_grad, input_tensor_grad) keep their tensors until
//    rebound, as in forward_backward_pipelining_without_interleaving, and each chunk's
//    set_input_tensor attribute keeps its last received input until its next forward.
//  - Marks: measured_step_begin, forward_end (after the measured step's last forward),
//    backward_end (after its last backward), optimizer_end.
//
// Left out: the p2p send side (isend reads the tensor in place), the coalesced buffer in
// which sequence-parallel LayerNorm grads are all-reduced (a few MiB), the embedding-grad
// all-reduce between first and last stage (in place on main_grad), the last stage's
// per-micro-batch reduced losses (a few bytes each). The interleaved schedule's receives
// are placed right before the pass that uses them (Megatron posts each one step earlier,
// together with the previous send: one p2p tensor, s/t*b*h, earlier per receive).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/runtime.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/megatron/megatron_step.h"

namespace memsim {

// The Program of pipeline rank `stage` (0 <= stage < parallel.pipeline), built into
// `program` (cleared first); program.rank names that stage (why left empty).
void build_megatron_stage_program(const Scenario& scenario, const MegatronOptions& options,
                                  int64_t stage, Program& program,
                                  graph::RuntimeBuffers* buffers = nullptr);

// Everything of `stage` that its Program depends on: each chunk's first/last virtual
// stage flags and layer count, then its schedule's (forward or backward, chunk) sequence (the schedule of
// every step is the same), then, for a MoE model only, which of its layers are MoE layers
// by their global index and their routing (sim/megatron/megatron_pipeline_moe.h). StageLoop
// reads the stage nowhere else (the layers of every chunk are numbered from 0, the shards
// are data-parallel rank 0's), so stages with equal keys build the same events and differ
// only in program.rank. Under 1F1B with m
// micro-batches, every middle stage warming up with m or m - 1 forwards runs all m
// forwards then all m backwards: on 64 stages with 16 micro-batches, stages 1-48 share one
// key (17 stages are built instead of 64).
std::vector<int32_t> megatron_stage_key(const Scenario& scenario, int64_t stage);

struct PipelineStagePeaks {
  std::vector<uint64_t> peak_reserved;  // per stage, of the measured step, unlimited device
  int64_t worst = 0;                    // the stage with the largest (the first of equals)
};

// Every stage's peak reserved with unlimited capacity and the scenario's allocator
// settings; `program` receives the worst stage's Program, with program.rank saying which
// stage and why. Returns the peaks.
// How: one stage per distinct megatron_stage_key (the first of its stages) is built on the
// -j workers, each streamed into a PeakSink (no events or timeline stored), and its peak
// stands for its key's stages; then the worst stage is built once more into `program`,
// streamed into program's sink when it has one (a plain `memsim run`), else stored.
PipelineStagePeaks build_megatron_pipeline_program(const Scenario& scenario,
                                                   const MegatronOptions& options,
                                                   Program& program,
                                                   graph::RuntimeBuffers* buffers = nullptr);

}  // namespace memsim
