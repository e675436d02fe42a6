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
