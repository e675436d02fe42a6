// Shared by the tests that run the decoder-architecture fixtures
// (tests/data/torch_cpu_arch, tools/fixtures/gen_arch_fixtures.py): a fixture config's
// knobs (config.arch, in the scenario spellings) and transformers placement
// (config.arch_hf, docs/decoder-modules.md §4) as a graph::DecoderArch.
#pragma once

#include <deque>
#include <string>

#include <nlohmann/json.hpp>

#include "graph/models/decoder_spec.h"

namespace memsim_test {

// The fixture's run up to its parameter dtype, as scenario text: family hf-llama at the
// config's shape, eager attention without dropout, its batch, `precision: params`. Each
// suite appends its own optimizer, step, device (and LoRA / autocast) keys.
inline std::string fixture_shape_yaml(const nlohmann::json& c) {
  std::string y = "model:\n  family: hf-llama\n";
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += std::string("  tied_embeddings: ") + (c.value("tied", false) ? "true" : "false") + "\n";
  y += "  attention: eager\n  dropout: 0\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: " + c.value("dtype", std::string("fp32")) + "\n";
  return y;
}

// The fixture's knobs (config.arch, scenario spellings) and placement (config.arch_hf) as
// a DecoderArch.
inline memsim::graph::DecoderArch arch_for(const nlohmann::json& c) {
  using namespace memsim::graph;
  const nlohmann::json& a = c["arch"];
  const nlohmann::json& h = c["arch_hf"];
  DecoderArch r;
  static std::deque<std::string> names;  // DecoderArch::architecture is a const char*
  names.push_back(a["architecture"].get<std::string>());
  r.architecture = names.back().c_str();
  r.head_dim = a["head_dim"];
  r.rotary_dim = a["rotary_dim"].get<int64_t>() == r.head_dim ? 0 : a["rotary_dim"].get<int64_t>();
  r.qkv_bias = a["qkv_bias"];
  r.o_bias = a["o_bias"];
  r.mlp_bias = a["mlp_bias"];
  const std::string qk = a["qk_norm"];
  r.qk_norm = qk == "head" ? QkNorm::head : qk == "full" ? QkNorm::full : QkNorm::none;
  const std::string norm = a["norm"];
  r.norm = norm == "gemma-rms" ? NormKind::rms_one_plus : norm == "layer" ? NormKind::layer : NormKind::rms;
  const std::string place = a["norm_placement"];
  r.placement = place == "post" ? NormPlacement::post
                : place == "sandwich" ? NormPlacement::sandwich : NormPlacement::pre;
  r.mlp = a["mlp"] == "plain" ? MlpKind::plain : MlpKind::glu;
  const std::string act = a["activation"];
  r.act = act == "gelu-tanh" ? Activation::gelu_tanh : act == "gelu" ? Activation::gelu
          : act == "gelu-new" ? Activation::gelu_new : Activation::silu;
  r.fused_qkv = a["fused_qkv"];
  r.fused_gate_up = a["fused_gate_up"];
  r.embed_scale = a["embedding_scale"];
  r.attn_softcap = a["attn_softcap"].is_null() ? 0.0 : a["attn_softcap"].get<double>();
  r.final_softcap = a["final_softcap"].is_null() ? 0.0 : a["final_softcap"].get<double>();
  r.sliding_window = a["sliding_window"].is_null() ? 0 : a["sliding_window"].get<int64_t>();
  for (const auto& v : a["sliding_layers"]) r.sliding_layers.push_back(v.get<int>() != 0);

  r.rope = h["rope"] == "layer" ? RopeAt::layer : RopeAt::model;
  r.rope_mul_fused = h["rope_mul"] == "fused";
  r.rope_local = h["rope_local"];
  r.attn_rope_buffer = h["attn_rope_buffer"];
  // "masking_utils": transformers 5.x's create_causal_mask (torch_models.py's v5 mask): the
  // graph builds it for rows marked DecoderArch::masking_utils (graph/models/decoder_mask_v5.h),
  // which also make 5.x's SDPA call; eager fixtures never reach SDPA. generate() is not run
  // on them, so `mask` keeps exclude there.
  r.mask = h["mask"] == "triu" ? MaskBuild::triu : MaskBuild::exclude;
  r.masking_utils = h["mask"] == "masking_utils";
  r.sdpa_gqa = r.masking_utils;
  r.mask_target_s = h["mask_target"] == "s";
  r.mask_add_inplace = h["mask_add"] == "inplace";
  r.sliding_at = h["sliding_at"] == "layer" ? SlidingAt::layer : SlidingAt::mask;
  r.attn_scale_mul = h["attn_scale"] == "mul";
  r.attn_function = h["attn_interface"] == "function";
  r.qk_norm_at = h["qk_norm_at"] == "transposed" ? QkNormAt::transposed : QkNormAt::view;
  r.embed_scale_at = h["embed_scale_at"] == "embedding" ? EmbedScaleAt::embedding : EmbedScaleAt::model;
  r.attn_out_kept = h["attn_out_kept"];
  const std::string lf = h["logits_float"];
  r.logits_float = lf == "loss" ? LogitsFloat::loss : lf == "none" ? LogitsFloat::none : LogitsFloat::forward;
  r.loss = h["loss"] == "pad" ? CausalLoss::pad : CausalLoss::shift;
  r.residual_dropout = h["resid_dropout"].get<double>() > 0.0;
  if (r.architecture == std::string("gemma2")) r.sandwich_order = SandwichOrder::gemma2;
  // Qwen2-MoE's stand-in (a qwen2 row with experts) builds both of 5.x's masks.
  if (h.value("mask_both", false)) r.architecture = "qwen2_moe";
  return r;
}

}  // namespace memsim_test
