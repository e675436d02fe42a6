// lora.input_require_grads (issue #16 item 5, HF Trainer/PEFT helper): whether PEFT's
// `enable_input_require_grads()` hook is on, i.e. the frozen embedding's output is made a
// leaf that requires grad (internal to the scenario loader; documented in
// docs/scenario-format.md, the model in graph/runtime.h requires_grad_).
//
// Why it exists. With LoRA the embedding is frozen, so its output needs no grad. A
// reentrant checkpoint (torch.utils.checkpoint(use_reentrant=True), HF's
// gradient_checkpointing_enable() default) then sees no input that requires grad: its
// output needs none, and the adapters inside get no gradient. PEFT therefore registers
// a forward hook on the input embeddings (`make_inputs_require_grad`:
// `output.requires_grad_(True)`), from PeftModel.__init__ when the model has gradient
// checkpointing on (peft/peft_model.py _prepare_model_for_gradient_checkpointing,
// peft v0.13) and from prepare_model_for_kbit_training; transformers calls
// enable_input_require_grads() in gradient_checkpointing_enable() for adapters it loaded
// itself (modeling_utils.py, v4.46).
//
// Contract: a boolean; only with lora.rank > 0 (without LoRA the embedding's output has a
// grad_fn already and the hook does nothing: refused by key). Default: true when
// checkpointing is reentrant (checkpoint.policy not none, checkpoint.reentrant true),
// false otherwise (today's behaviour). false with reentrant checkpointing is refused (the
// adapters of the checkpointed layers would get no gradient). Errors name FILE:LINE.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim {

namespace scenario_detail {
// Reads lora.input_require_grads (after lora.* and checkpoint.* were read into s).
void read_lora_input_require_grads(const Doc& d, Scenario& s);
}  // namespace scenario_detail

// Whether the embedding output is made a leaf that requires grad (the default above).
bool lora_input_require_grads(const Scenario& s);

}  // namespace memsim
