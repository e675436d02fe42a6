// Reading parallel.fsdp_wrap and parallel.use_orig_params (internal to the scenario loader;
// the keys are documented in docs/scenario-format.md, the model in docs/fsdp-lora.md).
//
// Contract (read_fsdp_lora_keys, called by read_sharding for every sharding):
//  - parallel.fsdp_wrap: block (default: transformer_auto_wrap_policy, each decoder layer a
//    unit, the root the rest) | peft (PEFT's fsdp_auto_wrap_policy: additionally every leaf
//    module whose weight requires grad, i.e. each LoRA lora_A / lora_B Linear, is its own
//    unit; what the Hugging Face Trainer installs for a PEFT model under FSDP).
//  - parallel.use_orig_params: false (default) | true (FSDP(use_orig_params=True)).
//  - Both only with parallel.sharding: fsdp; an error naming the key otherwise.
// Which combinations are modelled is checked later (sim/parallel/fsdp_lora_checks.h).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void read_fsdp_lora_keys(const Doc& d, ParallelConfig& p);

}  // namespace memsim::scenario_detail
