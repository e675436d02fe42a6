// lora.target_parameters (issue #15 item 5, LoRA on routed experts): PEFT's
// LoraConfig(target_parameters=[...]) (PEFT >= 0.17.0, huggingface/peft f3b97c37 "Allow LoRA to
// target nn.Parameter"; read at 5d602fdb, 0.20.1.dev0: src/peft/tuners/lora/layer.py
// ParamWrapper, _LoraParameterProxy), the only way PEFT adapts transformers 5.x's 3-D expert
// weights (Qwen3MoeExperts.gate_up_proj / down_proj are nn.Parameters, not nn.Linear).
//
// Read only to refuse it, by key: what ParamWrapper does is known (docs/moe.md "LoRA on the
// routed experts") but not modelled. Per targeted 3-D parameter (E, out, in) it creates one
// lora_A nn.Linear(in, r*E) and one lora_B nn.Linear(r*E, out) (all experts' adapters in two
// matrices), and on every forward of the experts module computes the whole delta
// einsum(B, A) * scaling, registers it as a parametrization (W + delta under
// parametrize.cached()), so a merged (E, out, in) weight is materialised per layer and per
// target, and every hit expert's F.linear saves a select view of it (the merged weight lives
// until that expert's backward) and its gathered input (the weight now needs a grad).
//
// Contract: any value (a list of parameter names) exits 1 naming FILE:LINE:
// lora.target_parameters and why. Errors name FILE:LINE.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

// Refuses lora.target_parameters when given (after model.* was read into s).
void refuse_lora_target_parameters(const Doc& d, const Scenario& s);

}  // namespace memsim::scenario_detail
