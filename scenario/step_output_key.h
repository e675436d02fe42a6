// step.keep_output (issue #16 item 8): what the user's loop keeps of a step's output
// between iterations (internal to the scenario loader; the key is documented in
// docs/scenario-format.md, its effect in sim/step/training_script.h).
//
// Contract: step.keep_output is a boolean, default true (today's behaviour for every
// step.kind: `out = model(x)` / `logits = model(x)` bound at loop level, so the previous
// iteration's output, and the autograd graph it holds when nobody ran backward on it,
// lives until the next forward has returned). false: the output and loss are locals of
// the iteration (a function that returns nothing, or a result nobody keeps) and die at
// its end, graph first. `loss` (HF Trainer's compute_loss, which returns the loss
// only): the output dies as soon as the loss is computed, before backward (the graph
// lives on through the loss), and the loss at the iteration's end as with false; only
// for step.kind train / forward-backward (the other kinds compute no loss: refused).
// `model-loss`: `outputs = model(ids, labels=labels); loss = outputs.loss` bound at loop
// level (tools/gpu/measure_cuda.py's transformers runs): as true, but the model's forward
// computes the loss (sim/step/loss_placement.h), so the previous outputs die when the
// call returns, after the new loss; hf-* families with model.implementation hf and
// step.kind train / forward-backward only (else refused; loss.impl other than the
// model's own is refused when the program is built). The megatron family builds its own schedule (no user loop):
// keep_output false is refused there by key. Errors name FILE:LINE and the key.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

// Reads step.keep_output into s.keep_output (after model.* has been read into m).
void read_step_keep_output(const Doc& d, const ModelConfig& m, StepConfig& s);

}  // namespace memsim::scenario_detail
