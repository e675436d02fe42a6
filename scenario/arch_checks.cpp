#include "scenario/arch_checks.h"

#include <cstring>
#include <initializer_list>

#include <string>

#include "scenario/scenario_family.h"
#include "scenario/transformers_version.h"

namespace memsim {

namespace {

using graph::DecoderArch;

[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}

// Whether the row is one of `names` (DecoderArch::architecture).
bool is_arch(const DecoderArch& a, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (std::strcmp(a.architecture, n) == 0) return true;
  return false;
}

// Knobs and placements whose autocast behaviour (which dtype each op sees) has not been
// checked: the q/k norms and post-/sandwich norms get low-precision inputs, per-layer
// rotary tables are cast to the value states' dtype, soft-capping runs on bf16 scores.
// Linear biases (Qwen2's q/k/v) are modelled: Autocast::linear_bias.
const char* autocast_unmodelled(const DecoderArch& a) {
  // q/k RMSNorms on the low projection outputs (DecoderModel::qk_norm: fp32 copies, fp32
  // weight x low -> fp32 q/k, RoPE in fp32) are checked for the MoE rows (issue #15:
  // tests/data/torch_cpu_moe_compose/autocast_{qwen3_moe,olmoe}_*): Qwen3-MoE's per-head
  // norm on the (B,S,h,hd) view and OLMoE's over the whole projection, Llama's RMSNorm.
  // Dense Qwen3 / OLMo-2 and Gemma-3's (1 + w) norms on the transposed views are not.
  const bool qk_checked = is_arch(a, {"qwen3_moe", "olmoe"}) && a.norm == graph::NormKind::rms &&
                          a.qk_norm_at == graph::QkNormAt::view;
  if (a.qk_norm != graph::QkNorm::none && !qk_checked) return "model.qk_norm";
  if (a.placement != graph::NormPlacement::pre) return "model.norm_placement";
  if (a.norm == graph::NormKind::rms_one_plus) return "model.norm";
  if (a.attn_softcap > 0.0) return "model.attn_softcap";
  if (a.final_softcap > 0.0) return "model.final_softcap";
  // Per-layer rotary (Mistral v4.45): tables cast to the value states' low dtype, q/k low.
  if (a.rope_local) return "model.architecture";
  // Multi-head latent attention (DeepSeek-V2 / V3, a config.json's rows: its rotary_dim is
  // qk_rope_head_dim) is checked under bf16 autocast by tests/data/torch_cpu_deepseek/
  // *_autocast_*; what it does not model is refused by scenario/deepseek_keys.cpp.
  if (a.mla.enabled()) return nullptr;
  // Phi-3's fused qkv / gate_up: slices of one low output (views); its in-place mask add
  // keeps the scores low (decoder_attention.cpp core).
  if (a.rotary_dim > 0) return "model.rotary_dim";
  // A window folded into the model-level mask (Mistral) is built in the embedding's fp32.
  if (a.sliding_window > 0 && a.sliding_at != graph::SlidingAt::mask) return "model.sliding_window";
  if (a.embed_scale) return "model.embedding_scale";
  if (a.act != graph::Activation::silu && a.act != graph::Activation::gelu_new)
    return "model.activation";
  // transformers 5.x's layout as a whole (model.transformers: 5, scenario/
  // transformers_version.h) is checked under bf16 autocast: Qwen2 through transformers 5.17
  // on the H200 came out exact in reserved and 5 KiB under in allocated (a run not used to
  // derive the layout). The same knobs one by one are not, nor the other rows under 5.x
  // (Mistral, Phi-3: not measured under autocast).
  // Qwen2-MoE's attention, norms and loss are Qwen2's code in 5.17 (Qwen2MoeAttention differs
  // from Qwen2Attention only in where qkv_bias and sliding_window are read); its MoE block
  // under autocast is scenario/moe_keys.cpp's (issue #15 item 5).
  // The MoE rows' dense parts are Llama's v5 modules (Mixtral: MistralAttention in 5.17 is
  // Llama's with the model-level rotary) plus the q/k norms above: CPU fixtures
  // autocast_{mixtral,qwen3_moe,olmoe}_* (issue #15, docs/moe.md "Under autocast").
  const bool v5_layout = scenario_detail::has_v5_layout(a) &&
                         is_arch(a, {"qwen2", "qwen2_moe", "llama",  // llama: Qwen2 less its biases
                                     "mixtral", "qwen3_moe", "olmoe"});
  if ((a.attn_function || a.loss != graph::CausalLoss::shift ||
       a.logits_float == graph::LogitsFloat::loss) && !v5_layout)
    return "model.architecture";
  return nullptr;
}

}  // namespace

const char* first_arch_knob(const Scenario& s) {
  const DecoderArch& a = s.model.arch;
  if (s.model.family == ModelFamily::hf_gpt2 && a.code == graph::ModelCode::gpt2) return nullptr;
  const DecoderArch llama;
  if (a.moe.experts > 0) return "model.moe";  // no numeric kernels for the routing ops
  if (a.head_dim > 0 && a.head_dim * s.model.heads != s.model.d_model) return "model.head_dim";
  if (a.qkv_bias != llama.qkv_bias) return "model.qkv_bias";
  if (a.o_bias != llama.o_bias) return "model.o_bias";
  if (a.mlp_bias != llama.mlp_bias) return "model.mlp_bias";
  if (a.qk_norm != llama.qk_norm) return "model.qk_norm";
  if (a.norm != llama.norm) return "model.norm";
  if (a.placement != llama.placement) return "model.norm_placement";
  if (a.mlp != llama.mlp) return "model.mlp";
  if (a.act != llama.act) return "model.activation";
  if (a.fused_qkv != llama.fused_qkv) return "model.fused_qkv";
  if (a.fused_gate_up != llama.fused_gate_up) return "model.fused_gate_up";
  if (a.embed_scale != llama.embed_scale) return "model.embedding_scale";
  if (a.attn_softcap != llama.attn_softcap) return "model.attn_softcap";
  if (a.final_softcap != llama.final_softcap) return "model.final_softcap";
  if (a.sliding_window != llama.sliding_window) return "model.sliding_window";
  if (a.rotary_dim > 0 && a.rotary_dim * s.model.heads != s.model.d_model) return "model.rotary_dim";
  if (a.rope != llama.rope || a.rope_local || a.attn_rope_buffer || a.mask != llama.mask ||
      a.mask_target_s || a.mask_add_inplace || a.attn_scale_mul || a.attn_function ||
      a.attn_out_kept || a.logits_float != llama.logits_float || a.loss != llama.loss ||
      a.residual_dropout || a.code != llama.code)
    return "model.architecture";
  return nullptr;
}

void require_arch_modelled(const Scenario& s) {
  if (!family_row(s.model.family).hf) return;
  const DecoderArch& a = s.model.arch;
  const std::string arch = a.architecture;
  if (s.precision.autocast.has_value() && s.model.family == ModelFamily::hf_llama) {
    if (const char* key = autocast_unmodelled(a))
      refuse(s, key,
             "precision.autocast with this architecture knob (" + arch +
                 ") is not modelled yet (which dtype each of its ops sees under autocast is not "
                 "checked); use precision.autocast: none (bf16/fp16 parameters are modelled)");
  }
  // GPT-2's SDPA path (GPT2SdpaAttention) is not built: graph/models/decoder.cpp would stop
  // with a runtime error deep in the build; say it here, by key.
  if (a.code == graph::ModelCode::gpt2 && s.model.attention != AttentionImpl::eager)
    refuse(s, "model.attention",
           "hf-gpt2 is modelled with eager attention only (GPT2Attention._attn); SDPA "
           "(GPT2SdpaAttention) is not modelled yet: use model.attention: eager");
  if (s.model.attention != AttentionImpl::eager) {
    if (a.attn_softcap > 0.0)
      refuse(s, "model.attn_softcap",
             "attention-logit soft-capping runs in eager attention only (transformers falls "
             "back to eager for it); use model.attention: eager");
    if (a.sliding_window > 0 && a.sliding_at == graph::SlidingAt::layer)
      refuse(s, "model.sliding_window",
             "per-layer sliding masks (" + arch + ") with the SDPA kernels pass an explicit "
             "mask, which memsim's fused-kernel model does not; use model.attention: eager");
    if (a.sliding_window > 0 && a.sliding_window < s.batch.seq_len)
      refuse(s, "model.sliding_window",
             "a window shorter than batch.seq_len makes SDPA take an explicit mask, which "
             "memsim's fused-kernel model does not; use model.attention: eager");
  }
  if (s.lora.rank > 0 && s.model.family == ModelFamily::hf_llama) {
    if (a.fused_qkv)
      refuse(s, "model.fused_qkv",
             "LoRA on a fused qkv_proj (Phi-3) is not modelled yet; use lora.rank: 0");
    if (a.fused_gate_up)
      refuse(s, "model.fused_gate_up",
             "LoRA on a fused gate_up_proj (Phi-3) is not modelled yet; use lora.rank: 0");
    if (a.mlp == graph::MlpKind::plain)
      refuse(s, "model.mlp", "LoRA targets of a plain (fc1/fc2) MLP are not modelled yet");
  }
  if (a.code == graph::ModelCode::gpt2 && (!a.qkv_bias || !a.o_bias || !a.mlp_bias))
    refuse(s, "model.qkv_bias", "GPT-2's Conv1D always has a bias");
}

}  // namespace memsim
