// The `lora:` section of a scenario (PEFT LoRA / QLoRA; graph/models/lora.h models it).
//
// Keys: rank (required, positive), alpha (> 0, default 8: PEFT's lora_alpha; scaling only),
// targets (required unless lora.target_parameters is given, scenario/lora_target_parameters_key.h:
// module names of the family, or all-linear; a list, or one string with commas), dropout ([0, 1), default
// 0), base_dtype (nf4, or the precision.params dtype; default the latter), adapter_dtype
// (fp32, bf16, fp16; default fp32, PEFT's autocast_adapter_dtype). Errors name the file,
// line and key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim {

namespace scenario_detail {
// Reads lora.* (rank 0 when the section is absent); `model` and `precision` are the
// already-built sections it is checked against.
LoraConfig build_lora(const Doc& d, const ModelConfig& model, const PrecisionConfig& precision);
}  // namespace scenario_detail

// The target module names a family accepts (besides all-linear), in module order.
const std::vector<std::string>& lora_module_names(ModelFamily family);
// Bit i set: the family's i-th linear module (graph::LlamaLinear / Gpt2Linear) is
// targeted. Names are as validated by build_lora.
uint32_t lora_target_mask(const LoraConfig& lora, ModelFamily family);

}  // namespace memsim
