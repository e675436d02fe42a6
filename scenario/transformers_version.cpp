#include "scenario/transformers_version.h"

#include <cstring>
#include <string>

#include "scenario/scenario_family.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

namespace {

bool is_moe_architecture(const char* name) {
  for (const char* moe : {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "deepseek_v2"})
    if (std::strcmp(name, moe) == 0) return true;
  return false;
}

}  // namespace

using graph::CausalLoss;
using graph::DecoderArch;
using graph::LogitsFloat;
using graph::MaskBuild;
using graph::RopeAt;

// transformers 5.x's layout of a Llama-lineage row (src/transformers/models/*/modeling_*.py
// as generated from modular files in 5.x; masking_utils.create_causal_mask;
// integrations' eager_attention_forward; loss/loss_utils.ForCausalLMLoss).
void apply_v5_layout(DecoderArch& a) {
  a.rope = RopeAt::model;       // XModel.rotary_emb once per forward, passed to every layer
  a.rope_mul_fused = true;      // XRotaryEmbedding.forward: cos = emb.cos() * attention_scaling
  a.attn_rope_buffer = false;   // no rotary module inside the attention
  a.mask = MaskBuild::exclude;  // the mask from index comparisons, not full + triu
  a.attn_function = true;       // eager_attention_forward(module, q, k, v, mask, scaling)
  a.attn_scale_mul = true;      // torch.matmul(q, k^T) * scaling
  a.mask_add_inplace = false;   // attn_weights = attn_weights + causal_mask
  a.logits_float = LogitsFloat::loss;  // ForCausalLMLoss: logits.float() inside the loss
  a.loss = CausalLoss::pad;            // labels padded by one, no shifted logits copy
  a.sdpa_gqa = true;  // sdpa_attention_forward: enable_gqa=True, no repeat_kv (use_gqa_in_sdpa)
  // masking_utils builds the training forward's position ids and masks
  // (graph/models/decoder_mask_v5.h: eager's (B,1,S,S) mask in the model dtype, SDPA's None;
  // transformers 5.17.0 masking_utils.py).
  a.masking_utils = true;
}

bool has_v5_layout(const DecoderArch& a) {
  DecoderArch v5 = a;
  apply_v5_layout(v5);
  return a.rope == v5.rope && a.rope_mul_fused == v5.rope_mul_fused &&
         a.attn_rope_buffer == v5.attn_rope_buffer && a.mask == v5.mask &&
         a.attn_function == v5.attn_function && a.attn_scale_mul == v5.attn_scale_mul &&
         a.mask_add_inplace == v5.mask_add_inplace && a.logits_float == v5.logits_float &&
         a.loss == v5.loss;  // not sdpa_gqa / masking_utils: calls, not layout (knob-built rows lack them)
}

void read_transformers_version(const Doc& d, ModelConfig& m) {
  const Field* f = d.find("model.transformers");
  if (!f) return;
  const std::string v = read_string(*f, "model.transformers");
  if (v == "4") {
    // The MoE rows are 5.x's code throughout (scenario/model_architecture.cpp): there is no
    // v4 row of them to switch to.
    if (is_moe_architecture(m.arch.architecture))
      fail(f->where, "model.transformers",
           std::string("4: the ") + m.arch.architecture + " row is transformers 5.x's code (its "
           "fused experts and, with them, 5.x's attention and loss placements); v4's per-expert "
           "modules are not modelled: use 5 or leave the key out");
    return;
  }
  if (v != "5")
    fail(f->where, "model.transformers",
         "'" + v + "' is not a modelled transformers release; use 4 (each row's v4 code, the "
         "default) or 5 (transformers 5.x, measured against 5.17)");
  if (!family_row(m.family).hf || m.family != ModelFamily::hf_llama)
    fail(f->where, "model.transformers",
         std::string("5 is modelled for the Llama-lineage rows of hf-llama; the family is ") +
             to_string(m.family) + " (GPT-2's 5.x code was measured within 0.01% of the v4 "
             "model: use 4)");
  const char* arch = m.arch.architecture;
  if (is_moe_architecture(arch)) return;  // already 5.x's placements (model_architecture.cpp)
  // Qwen2 / Qwen3 with sliding layers: 5.x builds the full and the sliding mask and picks
  // one per layer type, v4.51 folded one window into every layer's mask; not measured.
  if (m.arch.sliding_window > 0 && (std::strcmp(arch, "qwen2") == 0 || std::strcmp(arch, "qwen3") == 0))
    fail(f->where, "model.transformers",
         std::string("5 with a sliding window on the ") + arch + " row (use_sliding_window) is not "
         "modelled: 5.x's masking_utils builds a full and a sliding mask and picks one per layer "
         "type (docs/transformers5-mask.md); use 4 or no window");
  for (const char* measured : {"llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2"})
    if (std::strcmp(arch, measured) == 0) {
      apply_v5_layout(m.arch);
      return;
    }
  fail(f->where, "model.transformers",
       std::string("5 is not measured for the ") + arch + " row yet (measured: llama, qwen2, "
       "qwen3, mistral, phi3, gemma2; docs/h100-runs.md); use 4");
}

}  // namespace memsim::scenario_detail
