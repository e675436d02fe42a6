// The shared decoder modules against real PyTorch, one architecture row at a time:
// tests/data/torch_cpu_arch/*.json hold training steps of the configurable Llama-lineage
// stand-in (tools/fixtures/torch_models.py DecoderForCausalLM; each knob placed where its
// transformers version puts it, docs/decoder-modules.md) measured on CPU with torch 1.13
// (tools/fixtures/gen_arch_fixtures.py). Each fixture's scenario is built from its
// config and compared as the hf-llama fixtures are (tests/torch_fixture_test_support.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "json_test_support.h"
#include "sim/step/schedule.h"
#include "decoder_arch_test_support.h"
#include "torch_fixture_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kArchFixtureDir = MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_arch";

// The fixture's run: fp32, torch.optim for-loop, eager attention, an unlimited device
// without cuBLAS workspaces or CUDA kernel scratch (a CPU run has none).
Scenario scenario_for(const nlohmann::json& c) {
  std::string y = memsim_test::fixture_shape_yaml(c);
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  Scenario s = load_scenario_text(y, "arch-fixture.yaml");
  s.model.arch = memsim_test::arch_for(c);
  return s;
}

}  // namespace

TEST_CASE("decoder architecture rows match real PyTorch training steps (CPU fixtures)", "[hf][arch]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kArchFixtureDir))
    // checkpoint_* and trainer_autocast_* are other tests' fixtures (no "name"/"config":
    // const json operator[] on a missing key is undefined behaviour, a crash in some builds).
    if (entry.path().extension() == ".json" &&
        entry.path().filename().string().rfind("checkpoint_", 0) != 0 &&
        entry.path().filename().string().rfind("trainer_autocast_", 0) != 0)
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
