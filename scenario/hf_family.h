// Scenario -> graph::HfShape for the Hugging Face families (hf-gpt2, hf-llama).
#pragma once

#include "graph/models/hf_shape.h"
#include "scenario/scenario.h"

namespace memsim {

// Dimensions, element size (precision.params), dropout and attention implementation.
// A preset's context_length of 0 means "built with context_length = seq_len".
graph::HfShape hf_shape(const Scenario& s);

}  // namespace memsim
