// memsim's generation model (step.kind: generate; docs/generate.md) against transformers'
// own model.generate() on a GPU: tools/gpu/measure_generate.py on a lent H200 (torch
// 2.11.0+cu130, transformers 5.17.0, 2026-11-27). memsim's predictions were committed
// first (tests/data/gpu/generate_predictions.json, memsim 36059ec); memsim models v4.45's
// generate(), the file lists what 5.x does differently. 2 of 6 runs were measured (the
// lease's budget: the third timed out at 40 s, the rest were not started); Qwen3 dynamic and
// static and Mistral with a 256-token window on a second H200 lease the same day, the SDPA
// run on a third: all 6 measured.
//
// 1. The blind record stays honest: each prediction in the file equals what memsim
//    predicts now for its committed scenario (a change that moves one must update this
//    test with the reason, beside the measurement).
// 2. Each measured run against memsim: within the measured error, with its cause.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "json_test_support.h"
#include "real_run_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kPredictions = MEMSIM_SOURCE_DIR + "/tests/data/gpu/generate_predictions.json";
const std::string kRuns = MEMSIM_SOURCE_DIR + "/tests/data/gpu/generate/generate_runs.json";

memsim_test::SimulatedPeaks simulate(const std::string& scenario) {
  const memsim_test::SimulatedPeaks p = memsim_test::simulate_peaks(load_scenario(MEMSIM_SOURCE_DIR + "/" + scenario));
  REQUIRE(p.fits);
  return p;
}

// The largest relative error allowed (the measured one, rounded up) and why.
struct Gap {
  double allocated, reserved;
  const char* why;
};
const std::map<std::string, Gap> kGaps = {
    // 4 KiB over: 5.x's special-token and stopping-criteria tensors (512 B blocks) differ.
    {"gen_llama_l4_d1024_b4_p512_n64_dynamic", {0.00001, 0.0, "5.x's small tensors"}},
    // 1 MiB under: 5.x allocates the StaticCache's layers lazily inside the prefill (the
    // predictions file's expected difference); same bytes, another moment.
    {"gen_llama_l4_d1024_b4_p512_n64_static", {0.0022, 0.0, "5.x's lazy StaticCache"}},
    // Qwen3 (q/k norms, head_dim 32 in a d1024 model): the same 4 KiB as Llama.
    {"gen_qwen3_l4_d1024_b4_p512_n64_dynamic", {0.00001, 0.0, "5.x's small tensors"}},
    // 1.75 MiB under allocated and one 20 MiB segment over reserved: 5.x's lazy StaticCache
    // again (its layers allocated inside the prefill, between Qwen3's norm temporaries, so
    // the real run reuses a segment that v4.45's up-front cache keeps busy); not traced
    // block by block.
    {"gen_qwen3_l4_d1024_b4_p512_n64_static", {0.0038, 0.0394, "5.x's lazy StaticCache"}},
    // Mistral with sliding_window 256 < prompt 512 (5.x: DynamicSlidingWindowLayer, v4.45:
    // every token kept): at the peak (the prefill's last softmax) only the small tensors
    // differ (3.5 KiB); the window's saving after the prefill is not at the peak.
    {"gen_mistral_l4_d1024_b4_p512_n64_w256_dynamic", {0.00001, 0.0, "5.x's small tensors"}},
    // SDPA: the same 4 KiB, reserved exact.
    {"gen_llama_l4_d1024_b4_p512_n64_dynamic_sdpa", {0.00002, 0.0, "5.x's small tensors"}},
    // 5.x's offloaded cache (generate.cache_classes: v5), predicted before its run on a fifth
    // lease: 2 MiB under allocated (the size of one layer's K and V here), reserved exact
    // (the side stream's pool included); not traced.
    {"gen_llama_l4_d1024_b4_p512_n64_offloaded", {0.0046, 0.0, "2 MiB under, not traced"}},
};

}  // namespace

TEST_CASE("Generate on a GPU (transformers 5.17): blind predictions, measured", "[generate][gpu]") {
  const nlohmann::json pred = memsim_test::load_json(kPredictions);
  std::map<std::string, nlohmann::json> blind;
  for (const nlohmann::json& p : pred["runs"]) {
    INFO(p["name"].get<std::string>());
    const memsim_test::SimulatedPeaks now = simulate(p["scenario"]);
    CHECK(now.allocated == p["predicted_peak_allocated_bytes"].get<uint64_t>());
    CHECK(now.reserved == p["predicted_peak_reserved_bytes"].get<uint64_t>());
    blind[p["name"]] = p;
  }
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  memsim_test::print_comparison_header();
  size_t measured = 0;
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    INFO(name);
    REQUIRE(blind.count(name));
    const uint64_t pa = blind[name]["predicted_peak_allocated_bytes"], pr = blind[name]["predicted_peak_reserved_bytes"];
    const uint64_t ra = r["generate_peak_allocated"], rr = r["generate_peak_reserved"];
    const double ea = memsim_test::rel(pa, ra), er = memsim_test::rel(pr, rr);
    memsim_test::print_comparison_row(name, pa, ra, pr, rr, "(blind; H200, transformers 5.17)");
    const auto gap = kGaps.find(name);
    REQUIRE(gap != kGaps.end());
    INFO(gap->second.why);
    CHECK(std::fabs(ea) <= gap->second.allocated);
    CHECK(std::fabs(er) <= gap->second.reserved);
    ++measured;
  }
  CHECK(measured == 7);
  for (const auto& [name, why] : runs["failures"].items()) WARN(name << " not measured: " << why.get<std::string>());
}

// After the measurement: memsim's 5.x cache classes (generate.cache_classes: v5, built after
// these runs from transformers' cache_utils.py; docs/generate.md) allocate a StaticCache's
// layers lazily inside the prefill, the cause named for the static runs' gaps above. With
// them the two static runs come within 22 KiB allocated and reserved exact (the Qwen3 run's
// extra 20 MiB segment included), and the dynamic runs keep their blind numbers. Not blind:
// the key was written after the runs were seen.
TEST_CASE("Generate on a GPU: the static runs with 5.x's cache classes", "[generate][gpu]") {
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  const nlohmann::json pred = memsim_test::load_json(kPredictions);
  std::map<std::string, std::string> scenario;
  for (const nlohmann::json& p : pred["runs"]) scenario[p["name"]] = p["scenario"];
  memsim_test::print_comparison_header();
  size_t compared = 0;
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    if (r["spec"]["cache"] != "static") continue;
    INFO(name);
    const memsim_test::SimulatedPeaks v5 = memsim_test::simulate_peaks(
        load_scenario(MEMSIM_SOURCE_DIR + "/" + scenario.at(name), {{"generate.cache_classes", "v5"}}));
    const uint64_t ra = r["generate_peak_allocated"], rr = r["generate_peak_reserved"];
    memsim_test::print_comparison_row(name + " (cache_classes v5)", v5.allocated, ra, v5.reserved, rr,
                                      "(after the measurement)");
    CHECK(std::fabs(memsim_test::rel(v5.allocated, ra)) <= 0.00005);
    CHECK(v5.reserved == rr);
    ++compared;
  }
  CHECK(compared == 2);
}
