// Which decoder-architecture knobs (graph/models/decoder_spec.h) memsim models in which
// settings. The modules were checked against torch fixtures in fp32 and bf16 parameter
// runs with eager attention; a knob whose behaviour in another setting (autocast, the
// SDPA kernels, LoRA, numeric mode) has not been checked is refused by its key, never
// approximated.
#pragma once

#include "scenario/scenario.h"

namespace memsim {

// Throws ScenarioError naming the key when the scenario's architecture row uses a knob
// in a setting that is not modelled.
void require_arch_modelled(const Scenario& s);

// The first model.* key whose value differs from the Llama (or, for hf-gpt2, GPT-2) row,
// or nullptr: numeric mode (memsim check) has kernels for those two rows only.
const char* first_arch_knob(const Scenario& s);

}  // namespace memsim
