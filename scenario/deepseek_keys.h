// DeepSeek-V3 and DeepSeek-V2 (docs/deepseek.md): the checks of their routers' group sizes and the settings
// memsim does not model around multi-head latent attention (graph::MlaSpec,
// graph/models/decoder_mla.cpp) or DeepseekV3MoE, refused by key.
//
// MLA has no scenario keys of its own: its sizes come from a deepseek_v3 / deepseek_v2 config.json
// (model.hf_config / --model; scenario/hf_config.cpp); model.moe's keys may change the MoE
// part. Contract: check_deepseek runs once the scenario is built (after check_moe) and
// throws ScenarioError "FILE:LINE: KEY: message".
#pragma once

#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void check_deepseek(const Doc& d, const Scenario& s);

}  // namespace memsim::scenario_detail
