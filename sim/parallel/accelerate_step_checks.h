// What both of Accelerate's mixed-precision FSDP paths (FSDP1: accelerate_fsdp1_checks.h;
// FSDP2 v1.6 / v1.7: fsdp2_checks.cpp) are modelled for: HF Trainer's step over
// transformers' own Llama / Mistral / Qwen2 code (ops autocast leaves alone over bf16
// parameters), the model's own loss computed in its forward, Accelerate's autocast wrapper
// (forward-and-loss, cache enabled). One job: refuse by key (ScenarioError "SOURCE: KEY:
// why") anything else; the caller checks what is its path's own (policies, offload).
#pragma once

#include "scenario/scenario.h"

namespace memsim {

// The words of the refusals that differ between the two paths.
struct AccelerateStepWords {
  const char* path;          // "Accelerate's FSDP1 bf16 path"
  const char* autocast_over; // "autocast over bf16 parameter views"
  const char* checked;       // where the ops were checked, as the architecture refusal says it
  const char* loss_note;     // appended to the step.keep_output refusal's parenthesis ("" or more)
};

void require_accelerate_trainer_step(const Scenario& s, const AccelerateStepWords& w);

}  // namespace memsim
