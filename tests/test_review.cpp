// Regression tests for problems found by the command-line review of the day's features
// (serve, generate, MoE, the time model, CLI finish). Each case names the problem it pins.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_support.h"

namespace {

const std::string kGenerate = MEMSIM_SOURCE_DIR "/scenarios/llama2-7b-generate-a100.yaml";

}  // namespace

// generate() built its Program without configure_time_model, so every GEMM of a bf16
// model was costed at the fp32 peak (37.4 s and "MFU 67% of the fp32 peak" for the
// shipped scenario instead of the bf16 rate).
TEST_CASE("review: generate's time model multiplies in the weights' dtype", "[review]") {
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + kGenerate +
      "' --set generate.prompt_len=64 --set generate.new_tokens=4 --json - 2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  REQUIRE(j["estimated_step_seconds"].is_object());
  CHECK(j["estimated_step_seconds"]["mfu_dtype"] == "bf16");
  const memsim_test::CommandResult f = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + kGenerate +
      "' --set precision.params=fp32 --set generate.prompt_len=64 --set generate.new_tokens=4 --json - 2>/dev/null");
  REQUIRE(f.status == 0);
  const nlohmann::json k = nlohmann::json::parse(f.out);
  CHECK(k["estimated_step_seconds"]["mfu_dtype"] == "fp32");
  CHECK(k["estimated_step_seconds"]["total"].get<double>() > j["estimated_step_seconds"]["total"].get<double>());
}

// memsim serve --vary exited 0 when no point's engine started (the usage says 3, as sweep),
// and silently dropped --html (no file written), --max-seqs, --min-tp and
// --max-model-len-that-fits.
TEST_CASE("review: serve --vary's exit status and the single-plan options", "[review]") {
  const std::string s = MEMSIM_SOURCE_DIR "/scenarios/llama3-8b-vllm-h100.yaml";
  const std::string cmd = memsim_test::memsim_command() + "serve '" + s + "' ";
  CHECK(memsim_test::run_shell(cmd + "--vary serve.gpu_memory_utilization=0.1,0.2 >/dev/null 2>&1").status == 3);
  CHECK(memsim_test::run_shell(cmd + "--vary serve.gpu_memory_utilization=0.1,0.9 >/dev/null 2>&1").status == 0);
  CHECK(memsim_test::run_shell(cmd + "--vary serve.bogus=1,2 >/dev/null 2>&1").status == 3);
  memsim_test::TempDir dir("review_vary_html");
  const std::string html = (dir.path / "grid.html").string();
  CHECK(memsim_test::run_shell(cmd + "--vary serve.max_model_len=4096 --html '" + html + "' >/dev/null 2>&1").status == 2);
  CHECK(memsim_test::run_shell(cmd + "--vary serve.max_model_len=4096 --min-tp >/dev/null 2>&1").status == 2);
  CHECK(memsim_test::run_shell(cmd + "--vary serve.max_model_len=4096 --max-seqs 100 >/dev/null 2>&1").status == 2);
  CHECK(memsim_test::run_shell(cmd + "--vary serve.max_model_len=4096 --max-model-len-that-fits >/dev/null 2>&1").status == 2);
}
