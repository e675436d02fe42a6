// lora.* with model.implementation litgpt: what LitGPT v0.5.13's litgpt/lora.py and
// finetune/lora.py express, mapped onto memsim's lora keys (graph/models/decoder_litgpt.cpp,
// docs/implementations.md "LitGPT LoRA"). Called by check_implementation once the whole
// scenario is read; every refusal names the key and FILE:LINE (exit 1).
//
// Mapping (litgpt.lora.Config): lora.rank = lora_r, lora.alpha = lora_alpha (scaling
// only), lora.dropout = lora_dropout (nn.Dropout: native_dropout on CUDA), lora.targets: o_proj =
// lora_projection (attn.proj), gate_proj + up_proj + down_proj = lora_mlp (fc_1, fc_2,
// proj: all three or none). q_proj / k_proj / v_proj (lora_query / lora_key / lora_value:
// LoRAQKVLinear, whose F.conv1d runs on cuDNN) are refused; lora_head has no memsim
// target name (lm_head stays a LoRALinear with r 0).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void check_litgpt_lora(const Doc& d, const Scenario& s);

}  // namespace memsim::scenario_detail
