// The command line's model features end to end: `memsim run --model CONFIG.json` (with
// and without a scenario), the JSON report's `model` object, the text summary's parameter
// count, and `memsim presets` listing the config presets.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli_test_support.h"

using nlohmann::json;
using memsim_test::TempDir;

namespace {

std::string quoted(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

const char* kTinyQwen =
    "{\n"
    "  \"model_type\": \"qwen2\",\n"
    "  \"hidden_size\": 64,\n"
    "  \"num_hidden_layers\": 2,\n"
    "  \"num_attention_heads\": 4,\n"
    "  \"num_key_value_heads\": 2,\n"
    "  \"intermediate_size\": 128,\n"
    "  \"vocab_size\": 100,\n"
    "  \"max_position_embeddings\": 64,\n"
    "  \"tie_word_embeddings\": true,\n"
    "  \"torch_dtype\": \"bfloat16\"\n"
    "}\n";

// Qwen2 with hidden 64, 4 heads (2 KV), d_ff 128, vocab 100, tied, 2 layers.
constexpr int64_t kTinyQwenParams =
    100 * 64 + 2 * (64 * 64 + 64 + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64;

}  // namespace

TEST_CASE("memsim run --model simulates a config.json alone", "[cli][hf_config]") {
  TempDir dir("memsim_model_cli");
  std::filesystem::create_directories(dir.path / "Tiny-Qwen");
  const auto config = dir.write("Tiny-Qwen/config.json", kTinyQwen);
  const auto out = dir.path / "r.json";
  const auto r = memsim_test::run_memsim(
      "run --model " + quoted(config) + " --set batch.seq_len=32 --json " + quoted(out), dir);
  INFO(r.err);
  REQUIRE(r.status == 0);
  const json j = json::parse(memsim_test::slurp(out));
  CHECK(j["scenario"] == "Tiny-Qwen");
  CHECK(j["scenario_file"] == config.string());
  REQUIRE(j.contains("model"));
  CHECK(j["model"]["family"] == "hf-llama");
  CHECK(j["model"]["architecture"] == "qwen2");
  CHECK(j["model"]["parameter_count"] == kTinyQwenParams);
  CHECK(j["model"]["trainable_parameter_count"] == kTinyQwenParams);
  CHECK(j["model"]["parameter_count_per_rank"] == kTinyQwenParams);

  // The folder works too; the summary names the config and counts the parameters.
  const auto text = memsim_test::run_memsim("run --model " + quoted(dir.path / "Tiny-Qwen") +
                                                " --set batch.seq_len=32",
                                            dir);
  CHECK(text.status == 0);
  CHECK(text.out.find("config.json: hf-llama (qwen2), 2 layers") != std::string::npos);
  CHECK(text.out.find("parameters") != std::string::npos);
}

TEST_CASE("memsim run SCENARIO --model replaces the scenario's model", "[cli][hf_config]") {
  TempDir dir("memsim_model_cli");
  const auto config = dir.write("config.json", kTinyQwen);
  const auto scenario = dir.write("s.yaml",
                                  "name: job\nmodel: {preset: llama2-7b}\nbatch: {seq_len: 16, micro_batch: 2}\n"
                                  "lora: {rank: 4, targets: [q_proj, v_proj]}\n");
  const auto out = dir.path / "r.json";
  const auto r = memsim_test::run_memsim(
      "run " + quoted(scenario) + " --model " + quoted(config) + " --json " + quoted(out), dir);
  INFO(r.err);
  REQUIRE(r.status == 0);
  const json j = json::parse(memsim_test::slurp(out));
  CHECK(j["scenario"] == "job");
  CHECK(j["model"]["parameter_count"] == kTinyQwenParams);
  // LoRA on: only the adapters train, r x (in + out) for q (64 -> 64) and v (64 -> 32).
  CHECK(j["model"]["trainable_parameter_count"] == 2 * 4 * ((64 + 64) + (64 + 32)));
}

TEST_CASE("memsim run: --model errors and usage", "[cli][hf_config]") {
  TempDir dir("memsim_model_cli");
  auto r = memsim_test::run_memsim("run", dir);
  CHECK(r.status == 2);
  CHECK(r.err.find("SCENARIO") != std::string::npos);
  r = memsim_test::run_memsim("run --model " + quoted(dir.path / "none.json"), dir);
  CHECK(r.status == 1);
  CHECK(r.err.find("--model model.hf_config: cannot open") != std::string::npos);
  const auto moe = dir.write("moe.json", "{\"model_type\": \"jamba\"}");
  r = memsim_test::run_memsim("run --model " + quoted(moe), dir);
  CHECK(r.status == 1);
  CHECK(r.err.find("moe.json:1: model_type: unknown model_type 'jamba'") != std::string::npos);
}

TEST_CASE("memsim presets lists the config presets with their parameter counts", "[cli]") {
  TempDir dir("memsim_model_cli");
  const auto r = memsim_test::run_memsim("presets", dir);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("qwen2.5-7b") != std::string::npos);
  CHECK(r.out.find("7,615,616,512 parameters") != std::string::npos);
  CHECK(r.out.find("Hugging Face Qwen/Qwen2.5-7B config.json (scenarios/models/qwen2.5-7b.json)") !=
        std::string::npos);
  CHECK(r.out.find("gemma3-27b") != std::string::npos);
  CHECK(r.out.find("cs336-xl") != std::string::npos);
}
