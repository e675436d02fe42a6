// lora.prepare_kbit (issues #15/#16): PEFT's prepare_model_for_kbit_training(model,
// use_gradient_checkpointing=True), which most QLoRA recipes call between from_pretrained
// and get_peft_model (internal to the scenario loader; documented in
// docs/scenario-format.md and docs/qlora-prepare.md).
//
// What the function does (huggingface/peft 5d602fdb, src/peft/utils/other.py):
//   1. freezes every base parameter (memsim's LoRA freezes the base already);
//   2. casts every fp16/bf16 parameter that is not a Params4bit to fp32
//      (`param.data = param.data.to(torch.float32)`), then torch.cuda.empty_cache();
//   3. with a k-bit model and use_gradient_checkpointing: enable_input_require_grads()
//      unless gradient_checkpointing_kwargs says use_reentrant=False, and
//      model.gradient_checkpointing_enable(), which checkpoints every decoder layer with
//      transformers' default use_reentrant=True (modeling_utils.py, v4.46).
//
// Contract. A boolean; false changes nothing. true needs lora.rank > 0 and
// lora.base_dtype nf4 (the function's k-bit branch), else exit 1 naming the key. Step 3
// is set here: checkpoint.policy defaults to `full` (given: `none` is
// use_gradient_checkpointing=False, `full` is kept, any other policy is refused: HF
// checkpoints whole decoder layers), checkpoint.reentrant defaults to true (given false:
// gradient_checkpointing_kwargs={"use_reentrant": False}); lora.input_require_grads then
// follows from the reentrant flag (scenario/peft_input_grads_key.h), as PEFT's hook does.
// Step 2 sets LoraConfig::prepare_kbit: over a bf16/fp16 load the graph builds the model in
// that dtype, then casts every parameter that is not a Params4bit to fp32 (alloc fp32, free
// the 16-bit storage, in registration order) and empties the cache; the hidden states and
// logits are fp32 from then on, each Linear4bit casting to its compute dtype and back
// (lora.compute_dtype, scenario/lora_compute_dtype_key.h; graph/models/lora.h). With
// precision.params fp32 the loop casts nothing and the program is the spelled-out
// reentrant QLoRA one, event for event.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {
// Reads lora.prepare_kbit after checkpoint.* and lora.* were read into s and before
// lora.input_require_grads and lora.target_parameters are (they see the defaults it sets).
void read_lora_prepare_kbit(const Doc& d, Scenario& s);
}  // namespace memsim::scenario_detail
