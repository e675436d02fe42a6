#include "scenario/step_output_key.h"

#include <string>

#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

void read_step_keep_output(const Doc& d, const ModelConfig& m, StepConfig& s) {
  const Field* f = d.find("step.keep_output");
  if (f == nullptr) return;
  s.keep_output = read_bool(*f, "step.keep_output");
  // Megatron-LM's schedule (sim/megatron/megatron_step.h) is its own loop: its output
  // and loss live as forward_backward_func keeps them, which no user name changes.
  if (!s.keep_output && m.family == ModelFamily::megatron)
    fail(f->where, "step.keep_output",
         "Megatron-LM's training loop (forward_backward_func) keeps no user-bound output; "
         "step.keep_output applies to the cs336 and hf families; remove it");
}

}  // namespace memsim::scenario_detail
