// Family megatron's MLP activation, linear biases and grouped-query attention (issue #15,
// Megatron part 2; docs/moe-megatron.md "SwiGLU, GQA, biases"), from the architecture knob
// keys the Hugging Face families use, into Scenario::megatron_arch:
//
//   model.mlp glu + model.activation silu   --swiglu (gated_linear_unit, F.silu); the default
//                                          plain + gelu is Megatron's default GeLU MLP
//   model.o_bias / model.mlp_bias false    --disable-bias-linear (add_bias_linear False: no
//                                          bias on QKV, proj, fc1, fc2, experts)
//   model.qkv_bias true (with those false) --add-qkv-bias (Qwen-style QKV bias only)
//   model.kv_heads G < heads               --group-query-attention --num-query-groups G
//
// Modelled from NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553:
// megatron/training/arguments.py (--swiglu, --disable-bias-linear, --add-qkv-bias: "if
// args.add_bias_linear: args.add_qkv_bias = True"), megatron/training/argument_utils.py
// (bias_activation_fusion = bias_swiglu_fusion with --swiglu, default on).
//
// Contract: is_megatron_arch_knob says which knob keys family megatron reads (the knob
// reader skips its refusal for them); read_megatron_arch fills s.megatron_arch for family
// megatron and throws ScenarioError "FILE:LINE: KEY: why" for what Megatron cannot express
// or memsim does not model (another activation, mixed biases, GQA with eager attention,
// a SwiGLU expert with a bias). Runs after the model, parallel and MoE keys are read.
#pragma once

#include <string>

#include "scenario/megatron_arch_name.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

bool is_megatron_arch_knob(const std::string& key);

void read_megatron_arch(const Doc& d, Scenario& s);

}  // namespace memsim::scenario_detail
