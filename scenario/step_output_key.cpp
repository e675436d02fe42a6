#include "scenario/step_output_key.h"

#include <cctype>
#include <string>

#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

void read_step_keep_output(const Doc& d, const ModelConfig& m, StepConfig& s) {
  const Field* f = d.find("step.keep_output");
  if (f == nullptr) return;
  std::string low;
  if (f->node.IsScalar())
    for (char c : f->node.Scalar()) low += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (low == "loss") {
    // HF Trainer's compute_loss: `outputs = model(**inputs)` is a local of the function
    // that returns the loss, so the output dies before training_step's backward.
    if (s.kind != StepKind::train && s.kind != StepKind::forward_backward)
      fail(f->where, "step.keep_output",
           "'loss' drops the output once the loss is computed; step.kind forward / "
           "forward-no-grad computes no loss: use true or false");
    s.keep_output = false;
    s.output_dies_after_loss = true;
  } else if (low == "model-loss") {
    // `outputs = model(ids, labels=labels); loss = outputs.loss` at loop level: transformers'
    // XForCausalLM.forward computes the loss before it returns (sim/step/loss_placement.h).
    if (s.kind != StepKind::train && s.kind != StepKind::forward_backward)
      fail(f->where, "step.keep_output",
           "'model-loss' passes the labels to the model, which computes the loss; step.kind "
           "forward / forward-no-grad computes no loss: use true or false");
    if ((m.family != ModelFamily::hf_llama && m.family != ModelFamily::hf_gpt2) ||
        m.arch.impl != graph::ModelImpl::hf)
      fail(f->where, "step.keep_output",
           "'model-loss' (the loss computed inside the model's forward) is transformers' "
           "XForCausalLM.forward: model.family hf-llama / hf-gpt2 with model.implementation hf");
    s.keep_output = true;
    s.model_computes_loss = true;
  } else if (low == "true" || low == "yes" || low == "on" || low == "false" || low == "no" ||
             low == "off") {
    s.keep_output = read_bool(*f, "step.keep_output");
  } else {
    fail(f->where, "step.keep_output",
         "expected true, false, loss or model-loss, got " + describe(f->node));
  }
  // Megatron-LM's schedule (sim/megatron/megatron_step.h) is its own loop: its output
  // and loss live as forward_backward_func keeps them, which no user name changes.
  if (!s.keep_output && m.family == ModelFamily::megatron)
    fail(f->where, "step.keep_output",
         "Megatron-LM's training loop (forward_backward_func) keeps no user-bound output; "
         "step.keep_output applies to the cs336 and hf families; remove it");
}

}  // namespace memsim::scenario_detail
