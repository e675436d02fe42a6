// The time model (docs/time-model.md) against real step times: tools/gpu/measure_step_time.py
// on a lent H200 (torch 2.11.0+cu130, 2026-11-27), the plain-torch LLaMA stand-in at 16
// layers, d 2048, batch 4 x 1024, bf16, six configurations (checkpointing policies and AdamW
// implementations), measured twice on two leases (tests/data/gpu/step_time/step_times.json
// and step_times_profiled.json, the second with the forward timed apart). The blind
// predictions (docs/time-model.md §7) were made for the h100-80gb preset before the lease
// turned out to be an H200; this test predicts with memsim's h200 preset, the card measured.
//
// The goal issue #18 sets is the ranking: every pair of configurations that both runs put
// clearly apart (more than 5%) must come out in the same order from the model. The absolute
// error is printed (the model is 0.6-0.7x the real time: docs/time-model.md §8 says where).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "json_test_support.h"
#include "scenario/scenario.h"
#include "sim/analysis/step_time.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kRuns[] = {MEMSIM_SOURCE_DIR + "/tests/data/gpu/step_time/step_times.json",
                       MEMSIM_SOURCE_DIR + "/tests/data/gpu/step_time/step_times_profiled.json"};

// memsim's scenario of one measured configuration (the command line of docs/time-model.md §7).
double predicted_ms(const std::string& policy, const std::string& impl) {
  const Scenario s = load_scenario(
      MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-full-finetune-a100.yaml",
      {{"model.layers", "16"}, {"model.d_model", "2048"}, {"model.heads", "16"}, {"model.kv_heads", "8"},
       {"model.d_ff", "5632"}, {"model.vocab", "32000"}, {"model.attention", "eager"},
       {"batch.micro_batch", "4"}, {"batch.seq_len", "1024"}, {"device.preset", "h200"},
       {"checkpoint.policy", policy}, {"optimizer.impl", impl}});
  const StepTime t = estimate_step_time(build_program(s).cost, s.device);
  REQUIRE(t.estimated);
  return t.seconds * 1e3;
}

}  // namespace

TEST_CASE("step times on an H200: the model ranks the configurations as the GPU does", "[time][gpu]") {
  std::vector<std::map<std::string, double>> real;  // per run: name -> median step ms
  std::map<std::string, std::pair<std::string, std::string>> config;
  for (const std::string& path : kRuns) {
    const nlohmann::json j = memsim_test::load_json(path);
    REQUIRE(j["gpu"] == "NVIDIA H200");
    auto& run = real.emplace_back();
    for (const nlohmann::json& c : j["configs"]) {
      const std::string name = c["name"];
      run[name] = c["step_ms_median"].get<double>();
      config[name] = {c["policy"].get<std::string>(), c["optimizer_impl"].get<std::string>()};
    }
  }
  REQUIRE(config.size() == 6);
  std::map<std::string, double> pred;
  std::printf("| config | memsim (h200) | real, run 1 | real, run 2 | memsim / real |\n|---|---:|---:|---:|---:|\n");
  for (const auto& [name, pc] : config) {
    pred[name] = predicted_ms(pc.first, pc.second);
    const double r1 = real[0].at(name), r2 = real[1].at(name);
    std::printf("| %s | %.1f ms | %.1f ms | %.1f ms | %.2f |\n", name.c_str(), pred[name], r1, r2,
                pred[name] / (0.5 * (r1 + r2)));
  }
  // Pairs both runs put more than 5% apart: the model's order must agree, and it must not
  // call them a tie (within 1%).
  int compared = 0;
  for (const auto& [a, ra] : real[0]) {
    for (const auto& [b, rb] : real[0]) {
      bool apart = true;
      for (const auto& run : real) apart = apart && run.at(b) > 1.05 * run.at(a);
      if (!apart) continue;
      INFO(a << " is clearly faster than " << b << " on the GPU");
      CHECK(pred[b] > 1.01 * pred[a]);
      ++compared;
    }
  }
  // none < selective < full and modules, and fused < none_foreach's neighbours, by policy:
  // at least the policy chain must have been compared.
  CHECK(compared >= 5);
  CHECK(pred["none_foreach"] < pred["selective_foreach"]);
  CHECK(pred["selective_foreach"] < pred["full_foreach"]);
  CHECK(pred["selective_foreach"] < pred["modules_foreach"]);
}
