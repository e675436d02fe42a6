#include "sim/parallel/accelerate_step_checks.h"

#include <string>

#include "sim/step/loss_placement.h"

namespace memsim {

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
}  // namespace

void require_accelerate_trainer_step(const Scenario& s, const AccelerateStepWords& w) {
  const std::string path = w.path;
  if (s.model.family != ModelFamily::hf_llama || s.model.arch.impl != graph::ModelImpl::hf)
    refuse(s, "model.family",
           path + " is modelled for transformers' own Llama, Mistral and Qwen2 code "
           "(model.family hf-llama, model.implementation hf); GPT-2's LayerNorm runs in fp32 "
           "under autocast, which is not modelled with bf16 parameters");
  const std::string arch = s.model.arch.architecture;
  if ((arch != "llama" && arch != "mistral" && arch != "qwen2") || s.model.arch.moe.experts > 0)
    refuse(s, "model.architecture",
           path + " (" + w.autocast_over + ") is modelled for the llama, mistral and qwen2 "
           "architectures, whose ops autocast leaves alone (" + w.checked + "); '" + arch + "'" +
               (s.model.arch.moe.experts > 0 ? " with experts" : "") + " is not checked");
  if (s.loss.impl != LossFunction::automatic)
    refuse(s, "loss.impl",
           path + " is modelled with the model's own loss (HF Trainer); leave loss.impl out");
  if (!loss_in_model_forward(s))
    refuse(s, "step.keep_output",
           path + " is modelled for HF Trainer's step (labels passed to the model, which "
           "computes the loss in its forward, inside autocast" + w.loss_note +
               "): set step.keep_output: loss and step.kind train");
  if (s.precision.autocast_region != AutocastRegion::forward_and_loss)
    refuse(s, "precision.autocast_region",
           "Accelerate's autocast wraps model.forward, which computes the loss: "
           "forward-and-loss");
  if (!s.precision.autocast_cache)
    refuse(s, "precision.autocast_cache",
           "Accelerate's autocast keeps the default cache_enabled=True");
}

}  // namespace memsim
