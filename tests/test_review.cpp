// Regression tests for problems found by the command-line review of the day's features
// (serve, generate, MoE, the time model, CLI finish). Each case names the problem it pins.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <fstream>
#include <string>

#include "cli_test_support.h"
#include "scenario/scenario.h"
#include "sim/step/event_budget.h"
#include "sim/step/generate.h"
#include "program/program.h"
#include "test_paths.h"

namespace {

const std::string kGenerate = MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-generate-a100.yaml";

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
  const std::string s = MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-vllm-h100.yaml";
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

// --set model.moe.top_k=4 (the key the docs and error messages name) was "unknown key":
// only model.moe.routing was a dotted key; the others needed --set 'model.moe={top_k: 4}'.
TEST_CASE("review: --set model.moe.SUB merges into model.moe", "[review]") {
  using memsim::load_scenario_text;
  const std::string model =
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 128\n"
      "  vocab: 256\n  context_length: 64\n";
  const std::string batch = "batch:\n  micro_batch: 1\n  seq_len: 8\n";
  const std::string file = model + "  moe:\n    experts: 4\n    top_k: 2\n    expert_d_ff: 32\n" + batch;
  const memsim::Scenario s = load_scenario_text(file, "moe.yaml", {{"model.moe.top_k", "3"}});
  CHECK(s.model.arch.moe.experts == 4);
  CHECK(s.model.arch.moe.top_k == 3);
  CHECK(s.model.arch.moe.expert_d_ff == 32);
  auto error = [&](const std::string& text, const std::string& key, const std::string& value) {
    try {
      load_scenario_text(text, "moe.yaml", {{key, value}});
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // The overridden value is blamed on --set; a file value keeps its line.
  CHECK(error(file, "model.moe.top_k", "5") == "--set model.moe.top_k: 5 exceeds model.moe.experts 4");
  CHECK(error(file, "model.moe.experts", "1") == "moe.yaml:12: model.moe.top_k: 2 exceeds model.moe.experts 1");
  CHECK(error(file, "model.moe.capacity_factor", "0") == "--set model.moe.capacity_factor: expected a number > 0, got '0'");
  CHECK(error(file, "model.moe.bogus", "1").find("model.moe.bogus: unknown key") != std::string::npos);
  // Without a model.moe section in the file the override creates one.
  const memsim::Scenario t =
      load_scenario_text(model + batch, "moe.yaml", {{"model.moe.experts", "4"}, {"model.moe.top_k", "2"}});
  CHECK(t.model.arch.moe.experts == 4);
  CHECK(t.model.arch.moe.top_k == 2);
}

// step.kind generate with model.transformers: 5 ran v5 model code inside v4.45's generate()
// loop and caches (a pairing no release has) without a word.
TEST_CASE("review: generate refuses model.transformers 5", "[review]") {
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + kGenerate + "' --set model.transformers=5 2>&1");
  CHECK(r.status == 1);
  CHECK(r.out.find("--set model.transformers: step.kind generate models transformers v4.45") != std::string::npos);
}

// generate.new_tokens had no bound: 100,000 new tokens on the shipped Llama-2 scenario built
// 304.8 million allocator events (ten times the event budget every training loop obeys).
TEST_CASE("review: generate obeys the event budget, naming generate.new_tokens", "[review]") {
  const memsim::Scenario ok = memsim::load_scenario(kGenerate, {{"generate.new_tokens", "64"}, {"generate.prompt_len", "8"}});
  CHECK(memsim::estimated_events(ok) <= memsim::kEventBudget);
  memsim::Program p;
  memsim::build_generate_program(ok, p, nullptr, nullptr);
  CHECK(p.events.size() <= memsim::estimated_events(ok));  // the estimate bounds what is built
  const memsim::Scenario big = memsim::load_scenario(
      kGenerate, {{"generate.new_tokens", "100000"}, {"model.context_length", "104000"}});
  CHECK(memsim::estimated_events(big) > memsim::kEventBudget);
  try {
    memsim::Program q;
    memsim::build_generate_program(big, q, nullptr, nullptr);
    FAIL("not refused");
  } catch (const memsim::ScenarioError& e) {
    CHECK(std::string(e.what()).find("generate.new_tokens: the run would emit about") != std::string::npos);
  }
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + kGenerate + "' --set generate.new_tokens=100000 --set model.context_length=104000 >/dev/null 2>&1");
  CHECK(r.status == 1);
}

// memsim serve - failed with "-:1: (file): cannot open the scenario file" although the usage
// says SCENARIO may be - for every verb.
TEST_CASE("review: memsim serve reads the scenario from standard input", "[review]") {
  const std::string s = MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-vllm-h100.yaml";
  const memsim_test::CommandResult file = memsim_test::run_shell(
      memsim_test::memsim_command() + "serve '" + s + "' --max-model-len-that-fits 2>&1");
  REQUIRE(file.status == 0);
  const memsim_test::CommandResult in = memsim_test::run_shell(
      memsim_test::memsim_command() + "serve - --max-model-len-that-fits < '" + s + "' 2>&1");
  CHECK(in.status == 0);
  CHECK(in.out == file.out);
  const memsim_test::CommandResult grid = memsim_test::run_shell(
      memsim_test::memsim_command() + "serve - --vary serve.max_model_len=2048,4096 --json - < '" + s + "' 2>&1");
  CHECK(grid.status == 0);
  const nlohmann::json g = nlohmann::json::parse(grid.out);
  REQUIRE(g["points"].size() == 2);
  CHECK(g["points"][1]["fits"] == true);
  const memsim_test::CommandResult bad = memsim_test::run_shell(
      "echo 'model: {layers: x}' | " + memsim_test::memsim_command() + "serve - 2>&1");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("<stdin>:1: model.layers") != std::string::npos);
}

// memsim serve planned as if LoRA, autocast and training parallelism were absent: the
// answer (444,880 KV tokens) did not change with --set lora.rank=8, precision.autocast=bf16
// or parallel.sharding=fsdp. They are refused by key now.
TEST_CASE("review: memsim serve refuses the training settings it would ignore", "[review]") {
  const std::string s = MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-vllm-h100.yaml";
  const std::string cmd = memsim_test::memsim_command() + "serve '" + s + "' ";
  const std::pair<const char*, const char*> cases[] = {
      {"--set lora.rank=8 --set lora.targets=all-linear", "--set lora.rank: memsim serve does not model LoRA"},
      {"--set precision.autocast=bf16", "--set precision.autocast: "},
      {"--set parallel.data=8", "--set parallel.data: "},
      {"--set parallel.data=8 --set parallel.sharding=fsdp", "--set parallel.sharding: "},
  };
  for (const auto& [sets, message] : cases) {
    const memsim_test::CommandResult r = memsim_test::run_shell(cmd + sets + " 2>&1");
    CHECK(r.status == 1);
    CHECK(r.out.find(message) != std::string::npos);
  }
  // From a file: the key's own line.
  memsim_test::TempDir dir("review_serve_lora");
  const auto file = dir.path / "serve.yaml";
  {
    std::ofstream out(file);
    out << "model:\n  preset: llama3-8b\nprecision:\n  params: bf16\n  autocast: bf16\n"
           "device:\n  preset: h100-80gb\nserve:\n  engine: vllm\n";
  }
  const memsim_test::CommandResult f =
      memsim_test::run_shell(memsim_test::memsim_command() + "serve '" + file.string() + "' 2>&1");
  CHECK(f.status == 1);
  CHECK(f.out.find("serve.yaml:5: precision.autocast: ") != std::string::npos);
  CHECK(memsim_test::run_shell(cmd + "--set serve.tensor_parallel=2 >/dev/null 2>&1").status == 0);
}

// --max-seqs 0 / abc answered "Value 0 not in range 0.000000 to 1797693134862315708...";
// the options that take a positive integer now say so.
TEST_CASE("review: positive integer options name the rule", "[review]") {
  const std::string s = MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-vllm-h100.yaml";
  for (const char* v : {"0", "-5", "abc", "1.5"}) {
    const memsim_test::CommandResult r = memsim_test::run_shell(
        memsim_test::memsim_command() + "serve '" + s + "' --max-seqs " + v + " 2>&1");
    CHECK(r.status == 2);
    CHECK(r.out.find(std::string("--max-seqs: expected a positive integer, got '") + v + "'") != std::string::npos);
  }
  const memsim_test::CommandResult ok = memsim_test::run_shell(
      memsim_test::memsim_command() + "serve '" + s + "' --max-seqs 4096 --json - 2>/dev/null");
  REQUIRE(ok.status == 0);
  CHECK(nlohmann::json::parse(ok.out)["sequences_that_fit"]["count"] == 108);
}
