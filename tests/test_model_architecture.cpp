// model.architecture, the knob keys (scenario/model_architecture.h) and the presets shipped as
// config.json files (scenarios/models/).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "scenario/model_architecture.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const char* kShape = "  layers: 6\n  d_model: 64\n  heads: 4\n  d_ff: 128\n  vocab: 100\n";

Scenario arch(const std::string& model_keys, const std::vector<std::pair<std::string, std::string>>& sets = {}) {
  return load_scenario_text("model:\n" + std::string(kShape) + model_keys + "batch: {seq_len: 16}\n", "t.yaml", sets);
}

std::string error_of(const std::string& model_keys, const std::vector<std::pair<std::string, std::string>>& sets = {}) {
  try {
    arch(model_keys, sets);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("model.architecture sets the family and the row's knobs", "[architecture]") {
  const Scenario gpt2 = arch("  architecture: gpt2\n");
  CHECK(gpt2.model.family == ModelFamily::hf_gpt2);
  CHECK(gpt2.model.tied_embeddings);  // the row's default without a preset
  CHECK(gpt2.model.arch.mlp == graph::MlpKind::plain);
  CHECK(gpt2.model.arch.positions == graph::Positions::learned);
  for (const ArchitectureRow& row : architecture_rows()) {
    INFO(row.name);
    // The mixture-of-experts rows need their experts (docs/moe.md).
    const std::string name = row.name;
    if (name == "deepseek_v3" || name == "deepseek_v2") {  // latent sizes from a config.json only
      CHECK_THROWS_WITH(arch("  architecture: " + name + "\n  moe: {experts: 4, top_k: 2}\n"),
                        Catch::Contains("model.architecture: " + name + " needs its config.json"));
      continue;
    }
    const bool moe = name == "mixtral" || name == "qwen2_moe" || name == "qwen3_moe" || name == "olmoe";
    const Scenario s = arch("  architecture: " + name + "\n" + (moe ? "  moe: {experts: 4, top_k: 2}\n" : ""));
    CHECK(s.model.family == row.family);
    CHECK(std::string(s.model.arch.architecture) == row.name);
    CHECK(s.model.tied_embeddings == row.tied);
  }
  const Scenario g2 = arch("  architecture: gemma2\n");
  CHECK(g2.model.arch.sliding_window == 4096);
  CHECK(g2.model.arch.sliding_layers == std::vector<uint8_t>{1, 0, 1, 0, 1, 0});
  const Scenario g3 = arch("  architecture: gemma3_text\n");
  CHECK(g3.model.arch.sliding_layers == std::vector<uint8_t>{1, 1, 1, 1, 1, 0});
  CHECK(arch("  architecture: mistral\n").model.arch.sliding_window == 0);  // from a config only
  CHECK(arch("  architecture: mistral\n  sliding_window: 128\n").model.arch.sliding_layers.empty());
  // A hand-written model of a family takes that family's row.
  CHECK(std::string(arch("  family: hf-gpt2\n").model.arch.architecture) == "gpt2");
  CHECK(std::string(arch("  family: hf-llama\n").model.arch.architecture) == "llama");
  // A family named over a preset of another family takes the named family's row.
  CHECK(std::string(load_scenario_text("model: {preset: gpt2-small, family: hf-llama}\n", "t.yaml")
                        .model.arch.architecture) == "llama");
  // An architecture over a preset keeps the preset's shape, and replaces its knobs.
  const Scenario over = load_scenario_text("model: {preset: gemma2-2b, architecture: llama}\n", "t.yaml");
  CHECK(over.model.layers == 26);
  CHECK(over.model.arch.sliding_window == 0);
  CHECK(over.model.arch.norm == graph::NormKind::rms);
}

TEST_CASE("knob keys override the row", "[architecture]") {
  const Scenario s = arch(
      "  architecture: llama\n  head_dim: 32\n  qkv_bias: true\n  o_bias: true\n  mlp_bias: true\n"
      "  qk_norm: full\n  norm: gemma-rms\n  norm_placement: sandwich\n  mlp: plain\n  activation: gelu-new\n"
      "  fused_qkv: true\n  fused_gate_up: true\n  embedding_scale: true\n  attn_softcap: 50\n"
      "  final_softcap: 30.5\n  sliding_window: 64\n  sliding_layers: [0, 1, 0, 1, 1, 1]\n  rotary_dim: 16\n");
  const graph::DecoderArch& a = s.model.arch;
  CHECK(a.head_dim == 32);
  CHECK(a.qkv_bias);
  CHECK(a.o_bias);
  CHECK(a.mlp_bias);
  CHECK(a.qk_norm == graph::QkNorm::full);
  CHECK(a.norm == graph::NormKind::rms_one_plus);
  CHECK(a.placement == graph::NormPlacement::sandwich);
  CHECK(a.mlp == graph::MlpKind::plain);
  CHECK(a.act == graph::Activation::gelu_new);
  CHECK(a.fused_qkv);
  CHECK(a.fused_gate_up);
  CHECK(a.embed_scale);
  CHECK(a.attn_softcap == 50.0);
  CHECK(a.final_softcap == 30.5);
  CHECK(a.sliding_window == 64);
  CHECK(a.sliding_layers == std::vector<uint8_t>{0, 1, 0, 1, 1, 1});
  CHECK(a.rotary_dim == 16);
  CHECK(head_dim(s.model) == 32);
  // The sliding_layers strings.
  CHECK(arch("  sliding_window: 8\n  sliding_layers: all\n  family: hf-llama\n").model.arch.sliding_layers.empty());
  CHECK(arch("  family: hf-llama\n  sliding_window: 8\n  sliding_layers: every-other\n").model.arch.sliding_layers ==
        std::vector<uint8_t>{1, 0, 1, 0, 1, 0});
  CHECK(arch("  family: hf-llama\n  sliding_window: 8\n  sliding_layers: '2:1'\n").model.arch.sliding_layers ==
        std::vector<uint8_t>{1, 1, 0, 1, 1, 0});
  CHECK(arch("  family: hf-llama\n", {{"model.sliding_window", "8"}, {"model.sliding_layers", "[1,1,1,0,0,0]"}})
            .model.arch.sliding_layers == std::vector<uint8_t>{1, 1, 1, 0, 0, 0});
  // An explicit head_dim need not divide d_model (Gemma, Qwen3).
  CHECK(arch("  family: hf-llama\n  head_dim: 10\n", {{"model.heads", "6"}}).model.arch.head_dim == 10);
}

TEST_CASE("architecture keys are checked", "[architecture]") {
  CHECK(error_of("  architecture: lama\n") ==
        "t.yaml:7: model.architecture: unknown architecture 'lama'; did you mean 'llama'? (expected one of "
        "llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3, olmo2, granite, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3, deepseek_v2, gpt2)");
  CHECK(error_of("  architecture: gpt2\n  family: hf-llama\n") ==
        "t.yaml:8: model.family: is hf-llama, but model.architecture gpt2 is a hf-gpt2 model (leave model.family out)");
  CHECK(error_of("  family: cs336\n  qk_norm: head\n") ==
        "t.yaml:8: model.qk_norm: an architecture knob of the Hugging Face families (hf-llama, hf-gpt2), but "
        "the family is cs336");
  CHECK(error_of("  family: hf-llama\n  head_dim: 0\n") == "t.yaml:8: model.head_dim: expected a positive integer, got '0'");
  CHECK(error_of("  family: hf-llama\n  head_dim: 5\n") == "t.yaml:8: model.head_dim: RoPE needs an even head size, head_dim = 5");
  CHECK(error_of("  family: hf-llama\n  attn_softcap: -1\n") ==
        "t.yaml:8: model.attn_softcap: expected a number >= 0 (0 = no soft-capping), got '-1'");
  CHECK(error_of("  family: hf-llama\n  qk_norm: yes\n") ==
        "t.yaml:8: model.qk_norm: expected one of none, head, full, got 'yes'");
  CHECK(error_of("  family: hf-llama\n  norm: rmsnorm\n") ==
        "t.yaml:8: model.norm: expected one of rms, gemma-rms, layer, got 'rmsnorm'");
  CHECK(error_of("  family: hf-llama\n  activation: relu\n") ==
        "t.yaml:8: model.activation: expected one of silu, gelu-tanh, gelu, gelu-new, got 'relu'; did you mean 'gelu'?");
  CHECK(error_of("  family: hf-llama\n  sliding_window: 8\n  sliding_layers: [1, 0]\n") ==
        "t.yaml:9: model.sliding_layers: 2 entries for 6 layers");
  CHECK(error_of("  family: hf-llama\n  sliding_window: 8\n  sliding_layers: [1, 2, 0, 0, 0, 0]\n") ==
        "t.yaml:9: model.sliding_layers: expected 0 or 1 per layer, got '2' as an item");
  CHECK(error_of("  family: hf-llama\n  sliding_window: 8\n  sliding_layers: every-others\n") ==
        "t.yaml:9: model.sliding_layers: expected a list of 0/1 per layer, all, every-other, or N:M (N "
        "sliding layers then M full ones, repeated), got 'every-others'; did you mean 'every-other'?");
  CHECK(error_of("  family: hf-llama\n  sliding_window: 8\n  sliding_layers: '0:0'\n").find("got '0:0'") !=
        std::string::npos);
  CHECK(error_of("  family: hf-llama\n  sliding_layers: all\n") ==
        "t.yaml:8: model.sliding_layers: says which layers slide, but there is no sliding window "
        "(model.sliding_window is 0)");
  CHECK(error_of("  family: hf-llama\n  rotary_dim: 20\n") ==
        "t.yaml:8: model.rotary_dim: 20 must be even and at most head_dim 16");
  CHECK(error_of("  family: hf-llama\n", {{"model.fused_qkv", "maybe"}}) ==
        "--set model.fused_qkv: expected true or false, got 'maybe'");
}

TEST_CASE("config presets load as scenarios, and the old preset names are unchanged", "[architecture][scenario]") {
  for (const PresetInfo& info : model_presets()) {
    INFO(info.name);
    const Scenario s = load_scenario_text("model: {preset: " + info.name + "}\nbatch: {seq_len: 32}\n", "t.yaml");
    CHECK(s.model.preset == info.name);
    // A preset gives the architecture only: memsim's precision and dropout defaults.
    CHECK(s.precision.params == DType::fp32);
    CHECK(s.model.dropout == 0.0);
    CHECK(s.model.hf_config.empty());
    CHECK(info.summary.find(" parameters") != std::string::npos);
    CHECK_FALSE(info.source.empty());
  }
  // The names that were C++ rows before the config files: the same fields.
  struct Old {
    const char* name;
    ModelFamily family;
    int64_t layers, d_model, heads, kv_heads, d_ff, vocab, context;
    bool tied;
  };
  for (const Old& o : {Old{"gpt2-small", ModelFamily::hf_gpt2, 12, 768, 12, 12, 3072, 50257, 1024, true},
                       Old{"gpt2-medium", ModelFamily::hf_gpt2, 24, 1024, 16, 16, 4096, 50257, 1024, true},
                       Old{"gpt2-large", ModelFamily::hf_gpt2, 36, 1280, 20, 20, 5120, 50257, 1024, true},
                       Old{"gpt2-xl", ModelFamily::hf_gpt2, 48, 1600, 25, 25, 6400, 50257, 1024, true},
                       Old{"llama2-7b", ModelFamily::hf_llama, 32, 4096, 32, 32, 11008, 32000, 4096, false},
                       Old{"llama2-13b", ModelFamily::hf_llama, 40, 5120, 40, 40, 13824, 32000, 4096, false},
                       Old{"llama3-8b", ModelFamily::hf_llama, 32, 4096, 32, 8, 14336, 128256, 8192, false}}) {
    INFO(o.name);
    const ModelConfig* m = find_model_preset(o.name);
    REQUIRE(m != nullptr);
    CHECK(m->family == o.family);
    CHECK(m->layers == o.layers);
    CHECK(m->d_model == o.d_model);
    CHECK(m->heads == o.heads);
    CHECK(m->kv_heads == o.kv_heads);
    CHECK(m->d_ff == o.d_ff);
    CHECK(m->vocab == o.vocab);
    CHECK(m->context_length == o.context);
    CHECK(m->tied_embeddings == o.tied);
    CHECK(m->dropout == 0.0);
    CHECK(m->attention == AttentionImpl::eager);
  }
  // Sliding layers of the shipped configs.
  CHECK(find_model_preset("mistral-7b")->arch.sliding_window == 4096);
  CHECK(find_model_preset("mistral-7b")->arch.sliding_layers.empty());
  CHECK(find_model_preset("qwen2.5-7b")->arch.sliding_window == 0);  // use_sliding_window false
  CHECK(find_model_preset("gemma2-9b")->arch.sliding_layers.size() == 42);
  const auto& g3 = find_model_preset("gemma3-27b")->arch.sliding_layers;
  REQUIRE(g3.size() == 62);
  CHECK(g3[4] == 1);
  CHECK(g3[5] == 0);
  CHECK(g3[11] == 0);
  CHECK(g3[61] == 1);
  CHECK(find_model_preset("gemma3-1b")->arch.sliding_window == 512);
  CHECK(find_model_preset("phi3-mini")->arch.fused_qkv);
  CHECK(find_model_preset("qwen3-0.6b")->arch.head_dim == 128);
  CHECK(find_model_preset("qwen3-0.6b")->tied_embeddings);
  // A preset's layer count may change; its sliding rule follows.
  CHECK(load_scenario_text("model: {preset: gemma2-2b, layers: 3}\n", "t.yaml").model.arch.sliding_layers ==
        std::vector<uint8_t>{1, 0, 1});
  CHECK_THROWS_WITH(load_scenario_text("model: {preset: qwen2.5-7bb}\n", "t.yaml"),
                    Catch::Contains("unknown model preset 'qwen2.5-7bb'; did you mean 'qwen2.5-7b'?"));
}

TEST_CASE("every config preset simulates (two layers, short sequence)", "[architecture][hf]") {
  for (const PresetInfo& info : model_presets()) {
    const ModelConfig* m = find_model_preset(info.name);
    REQUIRE(m != nullptr);
    if (m->family != ModelFamily::hf_llama && m->family != ModelFamily::hf_gpt2) continue;
    INFO(info.name);
    // DeepSeek-V3's three dense first layers: one more layer than them, so a MoE layer runs.
    const int64_t layers = std::max<int64_t>(2, m->arch.moe.first_dense_layers + 1);
    const Scenario s = load_scenario_text("model: {preset: " + info.name + ", layers: " + std::to_string(layers) +
                                              "}\nbatch: {seq_len: 64}\n"
                                              "precision: {params: bf16}\noptimizer: {type: sgd}\n"
                                              "device: {capacity: 1TiB}\n",
                                          "t.yaml");
    const Program program = build_program(s);
    CHECK(program.events.size() > 100);
  }
}

// The rows' placement is what the torch CPU fixtures measured for each architecture
// (tests/data/torch_cpu_arch, config.arch_hf; docs/decoder-modules.md section 5). The llama
// row keeps the hf-llama family's layout (no unused per-attention rotary buffer), which the
// fixture of v4.45 Llama with biases has.
TEST_CASE("architecture rows carry the placement the fixtures measured", "[architecture]") {
  using namespace graph;
  int compared = 0;
  for (const auto& entry : std::filesystem::directory_iterator(MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_arch")) {
    const std::string file = entry.path().filename().string();
    if (entry.path().extension() != ".json" || file.rfind("checkpoint_", 0) == 0) continue;
    std::ifstream in(entry.path());
    const nlohmann::json c = nlohmann::json::parse(in)["config"];
    std::string name = c["arch"]["architecture"];
    if (name == "gemma3") name = "gemma3_text";
    const ArchitectureRow* row = find_architecture(name);
    if (!row) continue;  // stablelm: not a row
    INFO(file);
    const nlohmann::json& h = c["arch_hf"];
    const DecoderArch& a = row->arch;
    CHECK((a.rope == RopeAt::layer) == (h["rope"] == "layer"));
    CHECK(a.rope_mul_fused == (h["rope_mul"] == "fused"));
    CHECK(a.rope_local == h["rope_local"].get<bool>());
    if (name != "llama") CHECK(a.attn_rope_buffer == h["attn_rope_buffer"].get<bool>());
    CHECK((a.mask == MaskBuild::exclude) == (h["mask"] == "exclude"));
    CHECK(a.mask_target_s == (h["mask_target"] == "s"));
    CHECK(a.mask_add_inplace == (h["mask_add"] == "inplace"));
    CHECK((a.sliding_at == SlidingAt::layer) == (h["sliding_at"] == "layer"));
    CHECK(a.attn_scale_mul == (h["attn_scale"] == "mul"));
    CHECK(a.attn_function == (h["attn_interface"] == "function"));
    CHECK((a.qk_norm_at == QkNormAt::transposed) == (h["qk_norm_at"] == "transposed"));
    CHECK((a.embed_scale_at == EmbedScaleAt::embedding) == (h["embed_scale_at"] == "embedding"));
    CHECK(a.attn_out_kept == h["attn_out_kept"].get<bool>());
    CHECK(std::string(h["logits_float"]) ==
          (a.logits_float == LogitsFloat::loss ? "loss" : a.logits_float == LogitsFloat::none ? "none" : "forward"));
    CHECK((a.loss == CausalLoss::pad) == (h["loss"] == "pad"));
    if (a.placement == NormPlacement::sandwich)
      CHECK((a.sandwich_order == SandwichOrder::gemma2) == (name == "gemma2"));
    const nlohmann::json& k = c["arch"];
    CHECK(std::string(k["norm"]) == spelling(norm_names(), a.norm));
    CHECK(std::string(k["norm_placement"]) == spelling(norm_placement_names(), a.placement));
    CHECK(std::string(k["qk_norm"]) == spelling(qk_norm_names(), a.qk_norm));
    CHECK(std::string(k["mlp"]) == spelling(mlp_names(), a.mlp));
    CHECK(std::string(k["activation"]) == spelling(activation_names(), a.act));
    CHECK(k["fused_qkv"].get<bool>() == a.fused_qkv);
    CHECK(k["fused_gate_up"].get<bool>() == a.fused_gate_up);
    CHECK(k["embedding_scale"].get<bool>() == a.embed_scale);
    if (name != "llama") CHECK(k["qkv_bias"].get<bool>() == a.qkv_bias);
    ++compared;
  }
  CHECK(compared >= 12);
}
