// The shared decoder modules against real PyTorch, one architecture row at a time:
// tests/data/torch_cpu_arch/*.json hold training steps of the configurable Llama-lineage
// stand-in (tools/fixtures/torch_models.py DecoderForCausalLM; each knob placed where its
// transformers version puts it, docs/decoder-modules.md) measured on CPU with torch 1.13
// (tools/fixtures/gen_arch_fixtures.py). Each fixture's scenario is built from its
// config and compared as the hf-llama fixtures are (tests/torch_fixture_test_support.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "json_test_support.h"
#include "sim/schedule.h"
#include "torch_fixture_test_support.h"

using namespace memsim;

namespace {

const char* kArchFixtureDir = MEMSIM_SOURCE_DIR "/tests/data/torch_cpu_arch";

// The fixture's knobs (config.arch, scenario spellings) and placement (config.arch_hf) as
// a DecoderArch.
graph::DecoderArch arch_for(const nlohmann::json& c) {
  using namespace graph;
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
  r.mask = h["mask"] == "exclude" ? MaskBuild::exclude : MaskBuild::triu;
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
  return r;
}

// The fixture's run: fp32, torch.optim for-loop, eager attention, an unlimited device
// without cuBLAS workspaces or CUDA kernel scratch (a CPU run has none).
Scenario scenario_for(const nlohmann::json& c) {
  std::string y = "model:\n  family: hf-llama\n";
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += std::string("  tied_embeddings: ") + (c.value("tied", false) ? "true" : "false") + "\n";
  y += "  attention: eager\n  dropout: 0\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: " + c.value("dtype", std::string("fp32")) + "\n";
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  Scenario s = load_scenario_text(y, "arch-fixture.yaml");
  s.model.arch = arch_for(c);
  return s;
}

}  // namespace

TEST_CASE("decoder architecture rows match real PyTorch training steps (CPU fixtures)", "[hf][arch]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kArchFixtureDir))
    if (entry.path().extension() == ".json" &&
        entry.path().filename().string().rfind("checkpoint_", 0) != 0)
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 14);
  memsim_test::print_fixture_table_header();
  for (const auto& path : files) {
    const nlohmann::json fx = memsim_test::load_json(path);
    INFO(fx["name"].get<std::string>());
    const Scenario scenario = scenario_for(fx["config"]);
    const Program program = build_program(scenario);
    memsim_test::compare_with_fixture(fx, scenario, program);
  }
}
