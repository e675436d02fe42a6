// A tensor's free event carries the kind of its alloc event: the per-kind running totals
// (the CSV timeline's parameters/gradients/optimizer_state/... columns, the breakdowns) add
// a tensor's bytes under its alloc's kind and take them back under its free's, so a mismatch
// makes one kind's total run negative (it wrapped to 18446744072... in the CSV of DeepSpeed
// ZeRO-1/2 with 16-bit parameters: the master partition's kind was set on the 16-bit clone's
// free event; sim/parallel/deepspeed_zero.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using namespace memsim;

namespace {

using Sets = std::vector<std::pair<std::string, std::string>>;

// The first tensor whose free's kind differs from its alloc's, or "".
std::string mismatch(const Program& p) {
  std::vector<int> alloc_kind(p.tensors.size(), -1);
  for (size_t i = 0; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc) {
      alloc_kind[e.tensor] = static_cast<int>(e.kind);
    } else if (e.type == EventType::free && alloc_kind[e.tensor] != static_cast<int>(e.kind)) {
      return "event " + std::to_string(i) + ": tensor " + std::to_string(e.tensor) + " allocated as kind " +
             std::to_string(alloc_kind[e.tensor]) + ", freed as " + std::to_string(static_cast<int>(e.kind));
    }
  }
  return "";
}

}  // namespace

TEST_CASE("every free event carries its tensor's alloc kind (DeepSpeed, Megatron, FSDP, optimizers)",
          "[program][kinds]") {
  const Sets small = {{"model.layers", "2"}, {"batch.seq_len", "256"}, {"device.capacity", "1TiB"}};
  auto with = [&](Sets extra) {
    Sets s = small;
    s.insert(s.end(), extra.begin(), extra.end());
    return s;
  };
  const std::string zero3 = MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-zero3-8xa100.yaml";
  const std::string llama = MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-full-finetune-a100.yaml";
  const std::vector<std::pair<std::string, Sets>> runs = {
      {zero3, with({{"parallel.zero", "2"}})},
      {zero3, with({{"parallel.zero", "1"}})},
      {zero3, with({{"parallel.zero", "2"}, {"precision.params", "fp32"}})},
      {zero3, small},
      {llama, with({{"optimizer.type", "adamw8bit"}})},
      {llama, with({{"precision.master_weights", "true"}, {"precision.params", "bf16"}})},
      {MEMSIM_SOURCE_DIR + "/scenarios/gpt3-175b-tp8-pp8-64xh100.yaml",
       {{"model.layers", "16"}, {"device.capacity", "1TiB"}, {"parallel.data", "2"}, {"parallel.zero", "1"}}},
      {MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-fsdp2-8xh100.yaml", small},
  };
  for (const auto& [path, sets] : runs) {
    INFO(path << " with " << sets.size() << " overrides");
    CHECK(mismatch(build_program(load_scenario(path, sets))) == "");
  }
}

TEST_CASE("every free event carries its tensor's alloc kind (shipped scenarios)", "[program][kinds]") {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(MEMSIM_SOURCE_DIR) / "scenarios"))
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() > 30);
  for (const fs::path& f : files) {
    INFO(f.filename().string());
    // Small enough to build quickly; the kinds come from the same code at any size.
    const Scenario s = load_scenario(f.string(), {{"device.capacity", "1TiB"}});
    CHECK(mismatch(build_program(s)) == "");
  }
}
