// Hugging Face config.json import (scenario/hf_config.h): every supported model_type from a
// small config written to a temporary folder, the scenario's keys over it, and every way a
// config can be refused, with the file and key in the message.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "cli_test_support.h"
#include "scenario/hf_config.h"
#include "scenario/scenario.h"

using namespace memsim;
using memsim_test::TempDir;

namespace {

// A scenario whose model is the config at `path` (absolute), plus `extra` YAML lines
// under model: and any other sections after.
Scenario load_config(const std::filesystem::path& path, const std::string& model_extra = "",
                     const std::string& rest = "batch: {seq_len: 16}\n") {
  return load_scenario_text("model:\n  hf_config: '" + path.string() + "'\n" + model_extra + rest,
                            "t.yaml");
}

std::string error_of_config(const std::filesystem::path& path, const std::string& model_extra = "") {
  try {
    load_config(path, model_extra);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

// A Llama-like config with the given extra keys ("\"k\": v" lines, each ending with ",").
std::string llama_like(const std::string& model_type, const std::string& extra = "") {
  return "{\n"
         "  \"model_type\": \"" + model_type + "\",\n" + extra +
         "  \"hidden_size\": 64,\n"
         "  \"num_hidden_layers\": 4,\n"
         "  \"num_attention_heads\": 4,\n"
         "  \"num_key_value_heads\": 2,\n"
         "  \"intermediate_size\": 128,\n"
         "  \"vocab_size\": 100,\n"
         "  \"max_position_embeddings\": 256\n"
         "}\n";
}

using graph::Activation;
using graph::MlpKind;
using graph::NormKind;
using graph::NormPlacement;
using graph::QkNorm;

}  // namespace

TEST_CASE("hf_config: llama reads the shape, biases, dtype and tie default", "[hf_config]") {
  TempDir dir("hf_config");
  const auto path = dir.write("config.json", llama_like("llama",
                                                        "  \"attention_bias\": true,\n"
                                                        "  \"mlp_bias\": true,\n"
                                                        "  \"torch_dtype\": \"bfloat16\",\n"
                                                        "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0},\n"
                                                        "  \"quantization_config\": null,\n"));
  const Scenario s = load_config(path);
  const ModelConfig& m = s.model;
  CHECK(m.family == ModelFamily::hf_llama);
  CHECK(std::string(m.arch.architecture) == "llama");
  CHECK(m.preset.empty());
  CHECK(m.hf_config == path.string());
  CHECK(m.layers == 4);
  CHECK(m.d_model == 64);
  CHECK(m.heads == 4);
  CHECK(m.kv_heads == 2);
  CHECK(m.d_ff == 128);
  CHECK(m.vocab == 100);
  CHECK(m.context_length == 256);
  CHECK_FALSE(m.tied_embeddings);  // LlamaConfig's default
  CHECK(m.arch.qkv_bias);
  CHECK(m.arch.o_bias);
  CHECK(m.arch.mlp_bias);
  CHECK(m.arch.head_dim == 0);
  CHECK(m.arch.act == Activation::silu);
  CHECK(m.dropout == 0.0);
  CHECK(s.precision.params == DType::bf16);  // torch_dtype sets the default
  // ... which an explicit precision.params overrides.
  CHECK(load_config(path, "", "batch: {seq_len: 16}\nprecision: {params: fp32}\n").precision.params ==
        DType::fp32);
  // A folder stands for its config.json; the report name is the scenario's.
  CHECK(load_config(dir.path).model.hf_config == (dir.path / "config.json").string());
}

TEST_CASE("hf_config: mistral and phi3 slide every layer, phi3 fuses and rotates partially",
          "[hf_config]") {
  TempDir dir("hf_config");
  CHECK(load_config(dir.write("a.json", llama_like("mistral", "  \"sliding_window\": 4096,\n")))
            .model.arch.sliding_window == 4096);
  // MistralConfig's default window is 4096; null is none.
  CHECK(load_config(dir.write("b.json", llama_like("mistral"))).model.arch.sliding_window == 4096);
  CHECK(load_config(dir.write("c.json", llama_like("mistral", "  \"sliding_window\": null,\n")))
            .model.arch.sliding_window == 0);
  const Scenario phi = load_config(dir.write(
      "phi.json", llama_like("phi3", "  \"sliding_window\": 2047,\n  \"partial_rotary_factor\": 0.5,\n"
                                     "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n"
                                     "  \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1.0], \"long_factor\": [1.0]},\n")));
  const graph::DecoderArch& a = phi.model.arch;
  CHECK(std::string(a.architecture) == "phi3");
  CHECK(a.fused_qkv);
  CHECK(a.fused_gate_up);
  CHECK_FALSE(a.qkv_bias);
  CHECK(a.sliding_window == 2047);
  CHECK(a.sliding_layers.empty());  // every layer
  CHECK(a.rotary_dim == 8);         // int(16 * 0.5)
  CHECK_FALSE(phi.model.tied_embeddings);
  CHECK(load_config(dir.write("d.json", llama_like("phi3"))).model.arch.sliding_window == 0);
  CHECK_FALSE(phi.model.arch.residual_dropout);
  CHECK(a.rope == graph::RopeAt::layer);  // Phi-3 v4.45 placement
  CHECK(a.mask_add_inplace);
  // Phi-3's residual dropout is model.dropout when it equals attention_dropout; embd_pdrop
  // is never applied (v4.45).
  const Scenario drop = load_config(dir.write(
      "drop.json", llama_like("phi3", "  \"resid_pdrop\": 0.1,\n  \"attention_dropout\": 0.1,\n  \"embd_pdrop\": 0.3,\n")));
  CHECK(drop.model.dropout == 0.1);
  CHECK(drop.model.arch.residual_dropout);
}

TEST_CASE("hf_config: qwen2 and qwen3 biases, head_dim and max_window_layers", "[hf_config]") {
  TempDir dir("hf_config");
  const Scenario q2 = load_config(dir.write("q2.json", llama_like("qwen2",
                                                                  "  \"attention_bias\": false,\n"
                                                                  "  \"use_sliding_window\": true,\n"
                                                                  "  \"sliding_window\": 32,\n"
                                                                  "  \"max_window_layers\": 2,\n")));
  CHECK(q2.model.arch.qkv_bias);   // Qwen2: q/k/v always biased, attention_bias not read
  CHECK_FALSE(q2.model.arch.o_bias);
  CHECK(q2.model.arch.sliding_window == 32);
  CHECK(q2.model.arch.sliding_layers == std::vector<uint8_t>{0, 0, 1, 1});
  // use_sliding_window false (the Qwen2.5 configs): no window at all.
  const Scenario off = load_config(dir.write("q2off.json", llama_like("qwen2", "  \"sliding_window\": 32,\n")));
  CHECK(off.model.arch.sliding_window == 0);
  CHECK(off.model.arch.sliding_layers.empty());
  // layer_types wins over max_window_layers.
  const Scenario types = load_config(dir.write(
      "q2types.json",
      llama_like("qwen2", "  \"use_sliding_window\": true,\n  \"layer_types\": [\"full_attention\", "
                          "\"sliding_attention\", \"full_attention\", \"full_attention\"],\n")));
  CHECK(types.model.arch.sliding_window == 4096);
  CHECK(types.model.arch.sliding_layers == std::vector<uint8_t>{0, 1, 0, 0});

  const Scenario q3 = load_config(dir.write("q3.json", llama_like("qwen3", "  \"attention_bias\": true,\n")));
  CHECK(q3.model.arch.qk_norm == QkNorm::head);
  CHECK(q3.model.arch.head_dim == 128);  // Qwen3Config's default, not hidden/heads
  CHECK(q3.model.arch.qkv_bias);
  CHECK(q3.model.arch.o_bias);
  CHECK(load_config(dir.write("q3b.json", llama_like("qwen3", "  \"head_dim\": 32,\n"))).model.arch.head_dim == 32);
}

TEST_CASE("hf_config: the Gemmas", "[hf_config]") {
  TempDir dir("hf_config");
  const Scenario g = load_config(dir.write("g.json", llama_like("gemma")));
  CHECK(g.model.arch.norm == NormKind::rms_one_plus);
  CHECK(g.model.arch.embed_scale);
  CHECK(g.model.arch.act == Activation::gelu_tanh);  // hidden_activation's default
  CHECK(g.model.arch.head_dim == 256);
  CHECK(g.model.tied_embeddings);  // GemmaConfig's default
  CHECK(g.model.arch.placement == NormPlacement::pre);
  // Gemma reads hidden_activation, not hidden_act.
  CHECK(load_config(dir.write("g2.json", llama_like("gemma", "  \"hidden_act\": \"relu\",\n  \"hidden_activation\": \"gelu\",\n")))
            .model.arch.act == Activation::gelu);

  const Scenario g2 = load_config(dir.write("g2b.json", llama_like("gemma2", "  \"head_dim\": 16,\n")));
  const graph::DecoderArch& a = g2.model.arch;
  CHECK(a.placement == NormPlacement::sandwich);
  CHECK(a.attn_softcap == 50.0);  // Gemma2Config's defaults
  CHECK(a.final_softcap == 30.0);
  CHECK(a.sliding_window == 4096);
  CHECK(a.sliding_layers == std::vector<uint8_t>{1, 0, 1, 0});  // layers 0, 2, ... slide
  const Scenario nocap = load_config(dir.write(
      "g2c.json", llama_like("gemma2", "  \"attn_logit_softcapping\": null,\n  \"final_logit_softcapping\": 20,\n")));
  CHECK(nocap.model.arch.attn_softcap == 0.0);
  CHECK(nocap.model.arch.final_softcap == 20.0);

  std::string eight = llama_like("gemma3_text", "  \"sliding_window\": 512,\n  \"head_dim\": 16,\n");
  eight.replace(eight.find("\"num_hidden_layers\": 4"), 22, "\"num_hidden_layers\": 8");
  const Scenario g3 = load_config(dir.write("g3.json", eight));
  CHECK(g3.model.arch.qk_norm == QkNorm::head);
  CHECK(g3.model.arch.placement == NormPlacement::sandwich);
  CHECK(g3.model.arch.attn_softcap == 0.0);
  CHECK(g3.model.arch.sliding_window == 512);
  // sliding_window_pattern 6: five local layers, then a global one.
  CHECK(g3.model.arch.sliding_layers == std::vector<uint8_t>{1, 1, 1, 1, 1, 0, 1, 1});
  std::string pattern3 = llama_like("gemma3_text", "  \"sliding_window_pattern\": 3,\n");
  CHECK(load_config(dir.write("g3b.json", pattern3)).model.arch.sliding_layers ==
        std::vector<uint8_t>{1, 1, 0, 1});
}

TEST_CASE("hf_config: olmo2, granite and gpt2", "[hf_config]") {
  TempDir dir("hf_config");
  const Scenario o = load_config(dir.write("o.json", llama_like("olmo2")));
  CHECK(o.model.arch.placement == NormPlacement::post);
  CHECK(o.model.arch.qk_norm == QkNorm::full);
  const Scenario gr = load_config(dir.write(
      "gr.json", llama_like("granite", "  \"embedding_multiplier\": 12.0,\n  \"residual_multiplier\": 0.22,\n"
                                       "  \"logits_scaling\": 8.0,\n  \"attention_multiplier\": 0.0078125,\n")));
  CHECK(std::string(gr.model.arch.architecture) == "granite");
  CHECK_FALSE(gr.model.arch.qkv_bias);

  const auto gpt2 = dir.write("gpt2.json",
                              "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 2, \"n_head\": 4,\n"
                              " \"n_inner\": null, \"vocab_size\": 100, \"n_positions\": 128, \"n_ctx\": 128,\n"
                              " \"activation_function\": \"gelu_new\", \"layer_norm_epsilon\": 1e-05}\n");
  const Scenario g = load_config(gpt2);
  const graph::DecoderArch& a = g.model.arch;
  CHECK(g.model.family == ModelFamily::hf_gpt2);
  CHECK(g.model.d_ff == 256);  // n_inner null: 4 * n_embd
  CHECK(g.model.kv_heads == 4);
  CHECK(g.model.context_length == 128);
  CHECK(g.model.tied_embeddings);  // PretrainedConfig's default
  CHECK(g.model.dropout == 0.1);   // GPT2Config's attn/resid/embd_pdrop defaults
  CHECK(a.norm == NormKind::layer);
  CHECK(a.linear == graph::LinearKind::conv1d);
  CHECK(a.fused_qkv);
  CHECK(a.qkv_bias);
  CHECK(a.o_bias);
  CHECK(a.mlp == MlpKind::plain);
  CHECK(a.mlp_bias);
  CHECK(a.act == Activation::gelu_new);
  CHECK(a.positions == graph::Positions::learned);
  CHECK(a.eager_core == graph::EagerCore::where_buffer);
  CHECK(a.logits_float == graph::LogitsFloat::none);
  CHECK(a.residual_dropout);
}

TEST_CASE("hf_config: scenario keys override the config", "[hf_config]") {
  TempDir dir("hf_config");
  const auto path = dir.write("config.json", llama_like("gemma2", "  \"head_dim\": 16,\n  \"torch_dtype\": \"float32\",\n"));
  const Scenario s = load_config(path,
                                 "  layers: 6\n  heads: 8\n  head_dim: 8\n  attn_softcap: 0\n"
                                 "  sliding_layers: '1:2'\n  dropout: 0.05\n  tied_embeddings: false\n");
  CHECK(s.model.layers == 6);
  CHECK(s.model.heads == 8);
  CHECK(s.model.kv_heads == 2);  // a GQA config keeps its KV heads
  CHECK(s.model.arch.head_dim == 8);
  CHECK(s.model.arch.attn_softcap == 0.0);
  CHECK(s.model.arch.final_softcap == 30.0);
  CHECK(s.model.arch.sliding_layers == std::vector<uint8_t>{1, 0, 0, 1, 0, 0});
  CHECK(s.model.dropout == 0.05);
  CHECK_FALSE(s.model.tied_embeddings);
  // The every-other rule follows a changed layer count.
  CHECK(load_config(path, "  layers: 3\n").model.arch.sliding_layers == std::vector<uint8_t>{1, 0, 1});
  // --set too.
  const Scenario set = load_scenario_text("model: {hf_config: '" + path.string() + "'}\nbatch: {seq_len: 8}\n",
                                          "t.yaml", {{"model.sliding_window", "0"}, {"model.norm", "rms"}});
  CHECK(set.model.arch.sliding_window == 0);
  CHECK(set.model.arch.sliding_layers.empty());
  CHECK(set.model.arch.norm == NormKind::rms);
}

TEST_CASE("hf_config: a relative path is read from the scenario's folder", "[hf_config]") {
  TempDir dir("hf_config");
  std::filesystem::create_directories(dir.path / "models");
  dir.write("models/tiny.json", llama_like("llama"));
  const auto scenario = dir.write("s.yaml", "model: {hf_config: models/tiny.json}\nbatch: {seq_len: 8}\n");
  const Scenario s = load_scenario(scenario.string());
  CHECK(s.model.hf_config == (dir.path / "models/tiny.json").string());
  CHECK(s.model.layers == 4);
}

TEST_CASE("hf_config: bad input is refused with the file, line and key", "[hf_config]") {
  TempDir dir("hf_config");
  auto error = [&](const std::string& name, const std::string& text) {
    return error_of_config(dir.write(name, text));
  };
  const std::string p = dir.path.string() + "/";

  // Missing file: the scenario's line and key, then the path.
  const std::string missing = error_of_config(dir.path / "nope.json");
  CHECK(missing.rfind("t.yaml:2: model.hf_config: cannot open '" + p + "nope.json': No such file", 0) == 0);
  // Invalid JSON: line, column and byte offset.
  const std::string bad = error("bad.json", "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 64,,\n}\n");
  CHECK(bad.rfind(p + "bad.json:3: (json): invalid JSON at byte 47 (line 3, column 21): syntax error while parsing object key - unexpected", 0) == 0);
  CHECK(error("array.json", "[1, 2]") == p + "array.json:1: (json): expected an object of keys (a Hugging Face config.json), got array");
  // Wrong type, out of range, missing key: the key's own line.
  std::string wrong = llama_like("llama");
  wrong.replace(wrong.find("\"hidden_size\": 64"), 17, "\"hidden_size\": \"64\"");
  CHECK(error("wrong.json", wrong) == p + "wrong.json:3: hidden_size: expected a positive integer, got \"64\"");
  std::string negative = llama_like("llama");
  negative.replace(negative.find("\"vocab_size\": 100"), 17, "\"vocab_size\": -1");
  CHECK(error("neg.json", negative) == p + "neg.json:8: vocab_size: expected a positive integer, got -1");
  std::string fractional = llama_like("llama");
  fractional.replace(fractional.find("\"intermediate_size\": 128"), 24, "\"intermediate_size\": 128.5");
  CHECK(error("frac.json", fractional) == p + "frac.json:7: intermediate_size: expected a positive integer, got 128.5");
  std::string no_layers = llama_like("llama");
  no_layers.erase(no_layers.find("  \"num_hidden_layers\": 4,\n"), 26);
  CHECK(error("nolayers.json", no_layers) == p + "nolayers.json:1: num_hidden_layers: required (a positive integer)");
  CHECK(error("notype.json", "{\"hidden_size\": 64}") ==
        p + "notype.json:1: model_type: required (one of llama, mistral, qwen2, qwen3, gemma, gemma2, "
            "gemma3_text, phi3, olmo2, granite, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3, deepseek_v2, gpt2)");
  CHECK(error("bool.json", llama_like("llama", "  \"tie_word_embeddings\": 1,\n")) ==
        p + "bool.json:3: tie_word_embeddings: expected true or false, got 1");
  std::string odd_kv = llama_like("llama");
  odd_kv.replace(odd_kv.find("\"num_key_value_heads\": 2"), 24, "\"num_key_value_heads\": 3");
  CHECK(error("kv.json", odd_kv) == p + "kv.json:6: num_key_value_heads: 3 KV heads do not divide 4 attention heads");

  // Experts keys on a dense row; unknown model_types list the supported ones.
  CHECK(error("experts.json", llama_like("llama", "  \"num_local_experts\": 8,\n")) ==
        p + "experts.json:3: num_local_experts: not yet modelled (mixture-of-experts)");
  CHECK(error("unknown.json", llama_like("lama")) ==
        p + "unknown.json:2: model_type: unknown model_type 'lama'; did you mean 'llama'? (supported: "
            "llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3, olmo2, granite, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3, deepseek_v2, gpt2)");
  CHECK(error("gemma3.json", llama_like("gemma3")).find("gemma3.json:2: model_type: 'gemma3' is the multimodal Gemma 3") !=
        std::string::npos);

  // Keys that matter and are not modelled: refused by name.
  CHECK(error("quant.json", llama_like("llama", "  \"quantization_config\": {\"quant_method\": \"gptq\"},\n"))
            .rfind(p + "quant.json:3: quantization_config: quantized checkpoints are not modelled", 0) == 0);
  CHECK(error("mla.json", llama_like("llama", "  \"kv_lora_rank\": 512,\n")) ==
        p + "mla.json:3: kv_lora_rank: multi-head latent attention is modelled for model_type deepseek_v3 and deepseek_v2 only");
  CHECK(error("act.json", llama_like("llama", "  \"hidden_act\": \"relu\",\n")) ==
        p + "act.json:3: hidden_act: memsim has no activation for 'relu' (modelled: silu, swish, "
            "gelu_pytorch_tanh, gelu, gelu_new)");
  CHECK(error("rope.json", llama_like("llama", "  \"rope_scaling\": {\"type\": \"mrope\"},\n")) ==
        p + "rope.json:3: rope_scaling.type: rope type 'mrope' is not modelled (modelled: default, linear, "
            "dynamic, yarn, longrope, su, llama3: they change only the frequencies)");
  CHECK(error("tp.json", llama_like("llama", "  \"pretraining_tp\": 2,\n")).rfind(p + "tp.json:3: pretraining_tp: ", 0) == 0);
  CHECK(error("dtype.json", llama_like("llama", "  \"torch_dtype\": \"float8_e4m3fn\",\n")) ==
        p + "dtype.json:3: torch_dtype: 'float8_e4m3fn' is not a parameter dtype memsim models (float32, bfloat16, float16)");
  CHECK(error("partial.json", llama_like("llama", "  \"partial_rotary_factor\": 0.5,\n")) ==
        p + "partial.json:3: partial_rotary_factor: partial rotary embeddings are modelled for phi3 only");
  CHECK(error("resid.json", llama_like("phi3", "  \"resid_pdrop\": 0.1,\n")).rfind(p + "resid.json:3: resid_pdrop: differs from attention_dropout", 0) == 0);
  CHECK(error("pdrop.json",
              "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 2, \"n_head\": 4, \"vocab_size\": 100,\n"
              " \"n_positions\": 128, \"attn_pdrop\": 0.1,\n \"resid_pdrop\": 0.2}")
            .rfind(p + "pdrop.json:3: resid_pdrop: differs from attn_pdrop", 0) == 0);
  CHECK(error("types.json", llama_like("gemma2", "  \"layer_types\": [\"sliding_attention\"],\n")) ==
        p + "types.json:3: layer_types: 1 entries for 4 layers (num_hidden_layers)");
  CHECK(error("vision.json", llama_like("llama", "  \"vision_config\": {},\n"))
            .rfind(p + "vision.json:3: vision_config: a multimodal config", 0) == 0);

  // A config's layer_types cannot follow a new layer count by itself.
  const auto typed = dir.write("typed.json", llama_like("gemma2", "  \"layer_types\": [\"sliding_attention\", "
                                                                  "\"sliding_attention\", \"full_attention\", \"full_attention\"],\n"));
  CHECK(error_of_config(typed, "  layers: 2\n") ==
        "t.yaml:3: model.layers: 2 layers, but the config's layer_types lists 4; give model.sliding_layers "
        "for the new layer count");
  CHECK(error_of_config(typed, "  layers: 2\n  sliding_layers: [1, 0]\n").empty());
  // model.preset and model.hf_config together.
  CHECK_THROWS_WITH(load_scenario_text("model:\n  preset: llama2-7b\n  hf_config: x.json\n", "t.yaml"),
                    Catch::Contains("t.yaml:3: model.hf_config: give model.preset or model.hf_config, not both"));
}

TEST_CASE("hf_config: --model replaces the scenario's model", "[hf_config]") {
  TempDir dir("hf_config");
  const auto config = dir.write("config.json", llama_like("qwen3", "  \"torch_dtype\": \"bfloat16\",\n"));
  const auto scenario = dir.write("s.yaml",
                                  "name: job\nmodel: {preset: cs336-xl, attention: flash, layers: 2}\n"
                                  "batch: {seq_len: 32, micro_batch: 2}\noptimizer: {type: sgd}\n");
  const Scenario s = load_scenario_with_model(scenario.string(), config.string());
  CHECK(s.name == "job");
  CHECK(s.model.family == ModelFamily::hf_llama);
  CHECK(std::string(s.model.arch.architecture) == "qwen3");
  CHECK(s.model.layers == 4);                          // the scenario's layers key is dropped
  CHECK(s.model.attention == AttentionImpl::flash);    // how the model runs is kept
  CHECK(s.batch.micro_batch == 2);
  CHECK(s.optimizer.type == OptimizerType::sgd);
  CHECK(s.precision.params == DType::bf16);
  // No scenario: every other section defaulted; the name is the checkpoint's folder.
  const Scenario alone = load_scenario_with_model("", config.string(), {{"batch.seq_len", "64"}, {"model.layers", "2"}});
  CHECK(alone.name == dir.path.filename().string());
  CHECK(alone.source == config.string());
  CHECK(alone.model.layers == 2);
  CHECK(alone.batch.seq_len == 64);
  CHECK(alone.model.context_length == 256);
  CHECK_THROWS_WITH(load_scenario_with_model("", (dir.path / "missing.json").string()),
                    Catch::StartsWith("--model model.hf_config: cannot open '"));
}
