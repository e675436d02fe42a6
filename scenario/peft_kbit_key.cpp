// lora.prepare_kbit: PEFT's prepare_model_for_kbit_training (scenario/peft_kbit_key.h).
// Sources: huggingface/peft 5d602fdb (0.20.1.dev0) src/peft/utils/other.py
// prepare_model_for_kbit_training; transformers v4.46 modeling_utils.py
// gradient_checkpointing_enable (gradient_checkpointing_kwargs None -> use_reentrant True).
#include "scenario/peft_kbit_key.h"

#include <string>

#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

void read_lora_prepare_kbit(const Doc& d, Scenario& s) {
  const Field* f = d.find("lora.prepare_kbit");
  if (f == nullptr) return;
  if (!read_bool(*f, "lora.prepare_kbit")) return;
  if (s.lora.rank == 0)
    fail(f->where, "lora.prepare_kbit",
         "prepare_model_for_kbit_training prepares a quantised base for PEFT adapters; set "
         "lora.rank (and lora.base_dtype: nf4) or remove the key");
  if (!s.lora.base_nf4)
    fail(f->where, "lora.prepare_kbit",
         "needs lora.base_dtype: nf4 (without a k-bit model the function only casts the "
         "16-bit parameters to fp32 and turns no checkpointing on; that full-precision LoRA "
         "with fp32 weights is precision.params: fp32)");
  // Step 2 over a bf16 / fp16 load (the fp32 upcast of every parameter that is not a
  // Params4bit, the model fp32 from there) is the graph's (graph/models/lora.h
  // prepare_kbit_upcast); an fp32 load casts nothing.
  s.lora.prepare_kbit = true;
  // gradient_checkpointing_enable(): every decoder layer, HF's GradientCheckpointingLayer.
  if (const Field* p = d.find("checkpoint.policy")) {
    if (s.checkpoint.policy != CheckpointPolicy::none &&
        s.checkpoint.policy != CheckpointPolicy::full)
      fail(p->where, "checkpoint.policy",
           std::string("with lora.prepare_kbit the model's gradient_checkpointing_enable() "
                       "checkpoints every decoder layer: full (or none for "
                       "use_gradient_checkpointing=False), not ") +
               to_string(s.checkpoint.policy));
  } else {
    s.checkpoint.policy = CheckpointPolicy::full;
  }
  // gradient_checkpointing_kwargs None: transformers passes use_reentrant=True.
  if (s.checkpoint.policy != CheckpointPolicy::none && !s.checkpoint.reentrant.has_value())
    s.checkpoint.reentrant = true;
}

}  // namespace memsim::scenario_detail
