// What memsim models of FSDP1 (parallel.sharding: fsdp) with LoRA and use_orig_params
// (docs/fsdp-lora.md), checked before a program is built.
//
// Contract: require_fsdp_lora_modelled(s) returns for a scenario whose FSDP1 setup is
// modelled and throws ScenarioError naming the key otherwise (FILE: KEY: why). Refused:
// parallel.fsdp_wrap peft without LoRA (PEFT's policy then wraps every trainable leaf);
// LoRA with fsdp_wrap block and use_orig_params false (torch itself refuses to flatten
// frozen and trainable parameters together); QLoRA (lora.base_dtype nf4); adapters in
// another dtype than the base (one FlatParameter per dtype is not modelled);
// parallel.fsdp_mixed_precision or precision.autocast with LoRA; use_orig_params with
// parallel.cpu_offload.
#pragma once

#include "scenario/scenario.h"

namespace memsim {

void require_fsdp_lora_modelled(const Scenario& s);

}  // namespace memsim
