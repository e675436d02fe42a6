#include "scenario/peft_input_grads_key.h"

#include "scenario/yaml_fields.h"

namespace memsim {

namespace {
bool reentrant_checkpointing(const Scenario& s) {
  return s.checkpoint.policy != CheckpointPolicy::none && s.checkpoint.reentrant.value_or(false);
}
}  // namespace

namespace scenario_detail {

void read_lora_input_require_grads(const Doc& d, Scenario& s) {
  const Field* f = d.find("lora.input_require_grads");
  if (f == nullptr) return;
  const bool on = read_bool(*f, "lora.input_require_grads");
  if (s.lora.rank == 0)
    fail(f->where, "lora.input_require_grads",
         "PEFT's enable_input_require_grads hook matters for LoRA only (a trained embedding's "
         "output requires grad already); set lora.rank or remove it");
  if (!on && reentrant_checkpointing(s))
    fail(f->where, "lora.input_require_grads",
         "false with reentrant checkpointing (checkpoint.reentrant: true) leaves the adapters "
         "of the checkpointed layers without a gradient (torch.utils.checkpoint sees no input "
         "that requires grad); use true (PEFT's default there) or checkpoint.reentrant: false");
  s.lora.input_require_grads = on;
}

}  // namespace scenario_detail

bool lora_input_require_grads(const Scenario& s) {
  if (s.lora.rank == 0) return false;
  return s.lora.input_require_grads.value_or(reentrant_checkpointing(s));
}

}  // namespace memsim
