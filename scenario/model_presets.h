// The model presets shipped as config.json files (scenarios/models/, embedded at build
// time: scenario/embedded_models.h), for the scenario loader. model_presets() and
// find_model_preset() (scenario/scenario.h) list and expand them with the C++ rows.
#pragma once

#include <string_view>

#include "scenario/hf_config.h"

namespace memsim {

// The preset's import (its sliding rule unresolved, so that model.layers may change), or
// nullptr when `name` is not a config preset. A preset gives the architecture only: its
// torch_dtype and dropout are not applied (model.preset leaves precision.params and
// model.dropout at their defaults, as the C++ presets always have).
const HfConfig* find_config_preset(std::string_view name);

}  // namespace memsim
