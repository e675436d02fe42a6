// The model section's source and architecture (internal to the scenario loader):
// model.preset / model.hf_config (what the model starts from), model.architecture and
// the knob keys (scenario/model_architecture.h) over it.
//
// Order, so that explicit keys always win: the preset or config.json; model.family;
// model.architecture (the row's knobs replace the base's); the shape keys (in
// scenario_build.cpp); the knob keys; then the sliding layers are resolved against the
// final layer count. Errors name the file, line and key; errors inside a config.json name
// that file, its line and its key (scenario/hf_config.h).
#pragma once

#include <optional>

#include "scenario/model_architecture.h"
#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

struct ModelBase {
  bool given = false;            // model.preset or model.hf_config
  ModelConfig model;             // the preset's or the config's fields
  SlidingRule sliding;           // its sliding layers, unresolved
  bool sliding_from_config = false;  // a config's layer_types list (else a rule or none)
  std::optional<DType> params;   // model.hf_config's torch_dtype (not a preset's)
};

// model.preset or model.hf_config (relative paths from the scenario file's folder; from
// the working directory for --set / --model), or an empty base.
ModelBase read_model_base(const Doc& d);

// model.architecture and the knob keys over `m` (whose family and shape are read), then
// DecoderArch::sliding_layers for m.layers.
void read_architecture(const Doc& d, const ModelBase& base, ModelConfig& m);

// Checks that need the whole model section (head sizes, rotary dimension).
void check_architecture(const Doc& d, const ModelConfig& m);

}  // namespace memsim::scenario_detail
