#include "sim/step/loss_placement.h"

namespace memsim {

bool loss_in_model_forward(const Scenario& s) {
  const bool hf = (s.model.family == ModelFamily::hf_llama || s.model.family == ModelFamily::hf_gpt2) &&
                  s.model.arch.impl == graph::ModelImpl::hf;
  const bool computes_loss = s.step.kind == StepKind::train || s.step.kind == StepKind::forward_backward;
  if (!hf || !computes_loss) return false;
  if (s.loss.impl == LossFunction::liger) return true;  // the patched forward takes the labels
  return (s.step.output_dies_after_loss || s.step.model_computes_loss) &&
         s.loss.impl == LossFunction::automatic;
}

}  // namespace memsim
