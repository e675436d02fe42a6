// model.implementation (internal to the scenario loader): whose model code runs the
// architecture (graph/models/decoder_spec.h ModelImpl; docs/implementations.md).
//
// hf (the default) is transformers' code, every setting as before. torchtitan is its
// llama3 model code, modelled for the Llama row only and in the settings its stand-in
// and sources were checked in; anything else is refused naming the key. torchtune and
// litgpt are modelled likewise (Llama rows only).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

// model.implementation's spelling of `impl`.
const char* spelling(graph::ModelImpl impl);

// Reads model.implementation into m.arch.impl (after model.architecture, which resets
// the row).
void read_implementation(const Doc& d, ModelConfig& m);

// The combinations a non-hf implementation is not modelled in (the whole scenario is
// read): exit 1 naming the key.
void check_implementation(const Doc& d, const Scenario& s);

}  // namespace memsim::scenario_detail
