// model.transformers (internal to the scenario loader): which transformers release's model
// code an hf row follows.
//
// "4" (the default) is the v4 release each row was written from (docs/decoder-modules.md:
// v4.45 Llama, Qwen2, Mistral, Gemma, Gemma-2, Phi-3; v4.47 OLMo-2; v4.50 Gemma-3; v4.51
// Qwen3): every existing comparison. "5" is transformers 5.x (measured against 5.17.0 on
// the H200 runs of tests/data/h100/arch): the same modules with 5.x's placements, which
// are memsim knobs the later v4 rows already use (Qwen3 v4.51 is 5.17's layout): one
// rotary table per forward computed as `emb.cos() * attention_scaling` (no per-attention
// rotary module), the causal mask built by exclusion, eager attention as the function
// eager_attention_forward with `scores * scaling` and an out-of-place mask add, and the
// loss as self.loss_function (logits.float() inside it, labels padded by one: no shifted
// copy of the logits). Rows and settings where 5.x was not measured are refused by key.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

// Reads model.transformers and, for "5", rewrites m.arch's placements (after
// model.architecture and its knob keys, before model.implementation).
void read_transformers_version(const Doc& d, ModelConfig& m);

// Rewrites `a`'s placements to transformers 5.x's (the list above). Also the MoE rows'
// dense parts (scenario/model_architecture.cpp): their expert code is 5.x's.
void apply_v5_layout(graph::DecoderArch& a);

// Whether `a` carries transformers 5.x's placements as model.transformers: 5 sets them
// (one list of them, in transformers_version.cpp; scenario/arch_checks.cpp asks).
bool has_v5_layout(const graph::DecoderArch& a);

}  // namespace memsim::scenario_detail
