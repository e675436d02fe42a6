// The parts of a user's training loop that change memory but are not model, batch or
// optimizer settings: where zero_grad sits, which Python names outlive a step, which
// loss function is called, how the batch tensors are allocated. Real scripts differ in
// exactly these (shared/groundtruth/snapshots/SOURCES.md), and a byte-exact prediction
// of a real run needs them.
//
// Contract: default_script(scenario) is the conventional loop
//   for step: zero_grad(set_to_none); logits = model(x); loss = CE(logits, y);
//             loss.backward(); opt.step()
// with logits/loss bound at loop level (the previous step's logits are alive until the
// next forward returns), the staff cross_entropy for the CS336 optimizer and
// F.cross_entropy otherwise.
#pragma once

#include <cstdint>

#include "graph/models/cs336.h"
#include "scenario/scenario.h"

namespace memsim {

enum class LossImpl : uint8_t {
  cs336,         // cs336_basics.nn_utils.cross_entropy (cs336-model.md §6)
  torch,         // F.cross_entropy(logits.view(-1, V), targets.view(-1))
  torch_float,   // F.cross_entropy(logits.float().view(-1, V), ...): an explicit fp32 copy
  one_hot,       // -sum(one_hot * log_softmax) / B, hand-written (graph/models/script_losses.h)
};

enum class ZeroGradAt : uint8_t { before_forward, after_step, never };

struct TrainingScript {
  LossImpl loss = LossImpl::torch;
  // zero_grad(set_to_none=True) position in each step. (zero_grad(set_to_none=False)
  // keeps the grads allocated and is memory-wise `never`.)
  ZeroGradAt zero_grad = ZeroGradAt::before_forward;
  // The measured step ends with the same after_step zero_grad as the warm-up ones
  // (false: recording stops right after optimizer.step()).
  bool measured_step_zero_grad = true;
  // true: logits/loss are locals of a step function and die when it returns;
  // false: loop-level names, rebound by the next step (alive during its forward).
  // default_script sets it from step.keep_output (scenario/step_output_key.h): false there
  // is true here.
  bool outputs_are_step_locals = false;
  // true: the output and loss die after each micro-batch's backward (or, in forward-only
  // steps, after each forward): step.keep_output false, a function run per micro-batch.
  bool drop_outputs_each_iteration = false;
  // Bind the forward's output at all (false: `model(x)` result discarded at once).
  bool bind_output = true;
  // `pred = model(x); loss = loss_fn(pred, y); del pred; loss.backward()`: the output dies
  // right after the loss (torchtitan's train.py; set by model.implementation).
  bool del_output_after_loss = false;
  // `outputs = model(ids, labels=labels)` at loop level (step.keep_output: model-loss): the
  // previous outputs die when the call returns, i.e. after the loss the model computed
  // (and the root's FSDP post-forward), not when the new logits exist.
  bool rebind_output_after_loss = false;
  // Between warm-up and the measured step: `del output, loss` / `zero_grad()`.
  bool del_outputs_before_measured = false;
  bool zero_grad_before_measured = false;
  // The "measured_step_begin" mark (peak reset / recording start) comes before the
  // measured step's leading zero_grad (true) or after it (false).
  bool measure_includes_zero_grad = true;
  // Batch tensors: one (steps, B, S) int64 tensor for all warm-up steps plus one for the
  // measured step (inputs, then targets), instead of one (B, S) pair reused.
  bool per_step_batches = false;
  bool targets_on_device = true;
  // Warm-up steps of another kind than the measured one (e.g. one forward with grad
  // whose output stays bound while the measured step runs).
  bool warmup_kind_set = false;
  StepKind warmup_kind = StepKind::train;
  // The staff code release (model RoPE, AdamW weight-decay placement). Not a Scenario
  // field yet.
  graph::Cs336Revision cs336_revision = graph::Cs336Revision::v26;
  // torch.utils.checkpoint(use_reentrant=False) stops a region's re-run once its last
  // saved tensor is recomputed (torch >= 2.1); torch 1.13 re-runs the whole region.
  bool checkpoint_early_stop = true;
  // Forward-only steps run under torch.inference_mode() rather than no_grad: autocast
  // then caches no weight casts (graph/autocast.h).
  bool inference_mode = false;
  // Forward-only steps run under torch.inference_mode()/no_grad (step.kind
  // forward-no-grad does too); this keeps the scenario's step kind as given.
};

TrainingScript default_script(const Scenario& scenario);

}  // namespace memsim
