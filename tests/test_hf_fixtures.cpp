// The hf-gpt2 and hf-llama families against real PyTorch: tests/data/torch_cpu/*.json
// hold training steps of plain-torch stand-ins of the Hugging Face models measured on
// CPU (tools/fixtures/gen_torch_cpu_fixtures.py; requested bytes, no allocator
// rounding). For each fixture the same scenario is built and executed, and compared:
// bytes live at the end of the forward (exactly), the step's peak (within 2%) and the
// activation bytes each layer leaves alive for backward (exactly).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "json_test_support.h"
#include "torch_fixture_test_support.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kFixtureDir = MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu";

using memsim_test::load_json;

// The fixture's training run as a scenario: its dtype, torch.optim for-loop, eager attention,
// an unlimited device without cuBLAS workspaces (a CPU run has none).
Scenario scenario_for(const nlohmann::json& c) {
  const std::string family = c["family"];
  std::string y = "model:\n  family: " + family + "\n";
  y += "  layers: " + std::to_string(c["layers"].get<int>()) + "\n";
  y += "  d_model: " + std::to_string(c["d_model"].get<int>()) + "\n";
  y += "  heads: " + std::to_string(c["heads"].get<int>()) + "\n";
  y += "  kv_heads: " + std::to_string(c["kv_heads"].get<int>()) + "\n";
  y += "  d_ff: " + std::to_string(c["d_ff"].get<int>()) + "\n";
  y += "  vocab: " + std::to_string(c["vocab"].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  const bool tied = c.value("tied", family == "hf-gpt2");  // HF GPT-2 ties; LLaMA may
  y += std::string("  tied_embeddings: ") + (tied ? "true" : "false") + "\n";
  y += "  attention: eager\n";
  y += "  dropout: " + std::to_string(c["dropout"].get<double>()) + "\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: " + c.value("dtype", std::string("fp32")) + "\n";
  y += "  autocast: " + c.value("autocast", std::string("none")) + "\n";  // forward-and-loss
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "hf-fixture.yaml");
}

using memsim_test::rel;

}  // namespace

TEST_CASE("hf families match real PyTorch training steps (CPU fixtures)", "[hf]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kFixtureDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 8);
  memsim_test::print_fixture_table_header();
  for (const auto& path : files) {
    const nlohmann::json fx = load_json(path);
    // The folder holds other families' CPU fixtures too.
    // (checked key by key: json_pointer value() on a config without "family" crashed some builds)
    std::string family;
    if (fx.contains("config") && fx["config"].is_object() && fx["config"].contains("family") &&
        fx["config"]["family"].is_string())
      family = fx["config"]["family"].get<std::string>();
    if (family != "hf-gpt2" && family != "hf-llama") continue;
    const std::string name = fx["name"];
    INFO(name);
    const Scenario scenario = scenario_for(fx["config"]);
    const Program program = build_program(scenario);
    memsim_test::compare_with_fixture(fx, scenario, program);
  }
}
