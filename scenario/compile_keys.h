// Reading step.compile, step.compile_scope and step.compile_memory_budget, and the
// combinations torch.compile is modelled with (internal to the scenario loader and the
// simulator's modelled-features check; the keys are documented in
// docs/scenario-format.md, the model in docs/compile.md).
//
// Contract: step.compile is a bool (default false: the eager program, byte-identical to
// a scenario without the key). step.compile_scope (model | block) and
// step.compile_memory_budget (a number in [0, 1]) need step.compile: true. With compile,
// require_compile_modelled refuses by key what is not modelled: families other than
// hf-llama / hf-gpt2 (and their architecture rows), the mixture-of-experts rows, LoRA
// outside torchtune's code, data parallelism and sharding other than FSDP2 per block,
// checkpoint policies other than full / sac-layer / sac-op, autocast. Errors name the key and where step.compile was set.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim {
namespace scenario_detail {
void read_compile(const Doc& d, StepConfig& s);
}  // namespace scenario_detail

// Throws ScenarioError for a combination with step.compile that is not modelled.
void require_compile_modelled(const Scenario& s);
}  // namespace memsim
