// Where the training step computes its loss: inside the model's forward (the module the
// user called returns the loss among its outputs) or after it returns (`logits =
// model(x); loss = loss_fn(logits, labels)`). One job: answer that from the scenario.
//
// It matters to hooks keyed on the root module's forward and its outputs. FSDP2 (torch
// 2.11 torch/distributed/fsdp/_fully_shard/_fsdp_state.py) runs the root's post-forward
// when model.forward returns, i.e. after a loss computed inside it, and registers its
// pre-backward hook (`_register_pre_backward_hook`: `t.register_hook(self._pre_backward)`
// on every tensor of the flattened output that requires grad) on the loss too, so the
// root's pre-backward (unshard, prefetch the last block) runs at the loss's first
// backward op instead of the LM head's (sim/parallel/fsdp2.h; docs/fsdp2.md).
//
// Contract: true only for the hf-* families with transformers' own code
// (model.implementation hf) in a step that computes a loss (step.kind train or
// forward-backward), when
//  - step.keep_output: loss with the family's own loss (loss.impl left out): HF Trainer's
//    compute_loss, `outputs = model(**inputs)` with the labels in the inputs, so
//    XForCausalLM.forward computes `self.loss_function(logits, labels, ...)` before it
//    returns (transformers 5.17.0 trainer.py compute_loss, models/qwen2/modeling_qwen2.py
//    Qwen2ForCausalLM.forward; the H200 trace of hft_lora_fsdp2_w8 shows it), or
//  - step.keep_output: model-loss with the family's own loss: the same call with its
//    output bound at loop level (`outputs = model(ids, labels=labels)`, the tf_arch_* runs
//    of tools/gpu/measure_cuda.py), or
//  - loss.impl: liger: Liger-Kernel's patched causal-LM forward takes the labels and
//    returns the loss (graph/models/decoder_losses.cpp forward_liger).
// Everything else computes its loss after the model returns: step.keep_output true /
// false describe `logits = model(x)` loops (the shipped FSDP2 stand-in runs,
// tools/gpu/measure_fsdp2.py and measure_cp.py, apply the HF loss function to the
// returned logits), loss.impl torch / torch-float / chunked:N are the script's own
// losses, and cs336, torchtitan, torchtune and LitGPT compute the loss in their loops.
#pragma once

#include "scenario/scenario.h"

namespace memsim {

bool loss_in_model_forward(const Scenario& s);

}  // namespace memsim
