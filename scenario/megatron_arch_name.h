// The name family megatron's resolved architecture knobs carry (issue #15, Megatron part 2).
//
// Contract: scenario/megatron_arch_keys.cpp writes the resolved --swiglu / bias flags into
// Scenario::model.arch (mlp, act, qkv_bias, o_bias, mlp_bias) and sets its `architecture`
// to kMegatronArchitecture when they differ from Megatron's defaults (GeLU, biases), so that a ModelConfig counted without the scenario
// (sim/analysis/parameter_count.cpp) can tell them from a preset's untouched knobs (family
// megatron's presets are the GeLU GPT with biases). No other reader looks at it.
#pragma once

namespace memsim::scenario_detail {

inline constexpr const char* kMegatronArchitecture = "megatron-core";

}  // namespace memsim::scenario_detail
