// build_program for the `megatron` family: Megatron-LM's pretrain_gpt loop on one rank
// (pipeline parallel 1; parallel.pipeline > 1 is sim/megatron/megatron_pipeline.h: every stage is
// built and the worst one returned), emitted through graph::Runtime.
//
// Setup, in Megatron's order: the model's 16-bit parameters (graph/models/megatron.h), the DDP
// main_grad buffer (one contiguous tensor, zeroed in place every step), the optimizer's
// fp32 master copies (sim/megatron/megatron_optimizer.h). Each step: optimizer.zero_grad, then per
// micro-batch get_batch (tokens, labels, loss_mask, attention_mask, position_ids on the
// device), GPTModel.forward with the loss inside, loss_func (masked sum), backward; then
// optimizer.step. Marks: measured_step_begin, forward_end (after loss_func),
// backward_end, optimizer_end, as in sim/step/schedule.h.
//
// Modelling choices (each a version- or configuration-dependent point of Megatron):
//  - gradient_accumulation_fusion on: weight GEMMs accumulate into main_grad; like
//    current Megatron (grad_added_to_main_grad) each returns an empty weight-sized dummy
//    grad that the DDP hook drops at once (older releases returned None: no transient).
//  - create_attention_mask_in_dataloader on: a (b, 1, s, s) bool mask is copied to the
//    device every micro-batch although the causal fused softmax never reads it.
//  - FusedAdam creates its state on the first step; no loss-scaler temporaries (bf16
//    has none; fp16's found_inf and scale tensors are a few bytes and are left out).
//  - Left out: CUDA reduction scratch of the bias-grad sums (see graph/ops/cuda_reduce.h),
//    the TorchScript fusion's own backward temporaries and cuDNN attention workspaces.
//    (The q/k/v reshapes of the eager path stay views in backward too: their grads
//    reach the QKV split's cat without copies.)
#pragma once

#include "graph/models/megatron.h"
#include "program/program.h"
#include "scenario/scenario.h"

namespace memsim::graph {
class NumericContext;
}

namespace memsim {

struct MegatronOptions {
  // The ZeRO paper's model-state accounting (Rajbhandari et al. 2020, §3.1: 2 + 2 + 12
  // bytes per parameter) instead of Megatron's: main_grad in the parameters' 16-bit
  // dtype even for bf16 (Megatron forces fp32 accumulation for bf16), and the fp32 copies
  // of 16-bit grads transient within the step (Megatron keeps them until zero_grad).
  bool zero_paper_accounting = false;
};

// The model shape a scenario describes (family megatron).
graph::MegatronShape megatron_shape(const Scenario& scenario);

// Throws std::runtime_error / ScenarioError for settings this family does not model yet
// (sim/megatron/megatron_parallel.h, sim/parallel/data_parallel.h, autocast, GQA); the builders check first.
void check_megatron_supported(const Scenario& scenario);
Program build_megatron_program(const Scenario& scenario, const MegatronOptions& options = {});
// Same Program, built into `program` (cleared first, capacity kept) by a Runtime that
// borrows `buffers` (may be null): repeated builds reuse storage (sim/step/schedule.h).
void build_megatron_program(const Scenario& scenario, const MegatronOptions& options,
                            Program& program, graph::RuntimeBuffers* buffers);
// Numeric mode (graph/numeric/numeric.h, sim/check/numeric_check.h): the same loop executed by `numeric`.
void build_megatron_program(const Scenario& scenario, Program& program,
                            graph::NumericContext* numeric);

}  // namespace memsim
