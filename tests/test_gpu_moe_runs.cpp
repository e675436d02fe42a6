// memsim's mixture-of-experts model (docs/moe.md) against transformers' own MoE models on a
// GPU: tools/gpu/measure_moe.py on a lent H200 (torch 2.11.0+cu130, transformers 5.17.0,
// 2026-11-27), routing forced through torch.topk so the tokens per expert are known.
// memsim's predictions were committed first (tests/data/gpu/moe_predictions.json). Of the
// 9 planned runs 2 were measured (Qwen3-MoE from_config, balanced and worst-case routing):
// the first attempt failed on two bugs of the script (the stand-ins' one_hot built on the
// CPU; the configs folder not sent), the retry had 48 s of device time left.
//
// 1. The blind record stays honest: each prediction equals what memsim predicts now.
// 2. Each measured run against memsim, within its measured error.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "json_test_support.h"
#include "real_run_test_support.h"

using namespace memsim;

namespace {

const std::string kPredictions = MEMSIM_SOURCE_DIR "/tests/data/gpu/moe_predictions.json";
const std::string kRuns = MEMSIM_SOURCE_DIR "/tests/data/gpu/moe/moe_runs.json";

struct Gap {
  double allocated, reserved;
  const char* why;
};
// The measured error, rounded up; causes not found (the snapshots are committed beside the
// runs for the next look).
const std::map<std::string, Gap> kGaps = {
    {"moe_tf_qwen3_moe_bf16_balanced", {0.0004, 0.0031, "not found"}},
    {"moe_tf_qwen3_moe_bf16_worst", {0.00003, 0.0031, "not found"}},
};

}  // namespace

TEST_CASE("MoE on a GPU (transformers 5.17 Qwen3-MoE): blind predictions, measured", "[moe][gpu]") {
  const nlohmann::json pred = memsim_test::load_json(kPredictions)["runs"];
  for (const auto& [name, p] : pred.items()) {
    INFO(name);
    if (!p.contains("peak_allocated_bytes")) continue;  // recorded as refused
    const memsim_test::SimulatedPeaks a =
        memsim_test::simulate_peaks(load_scenario(MEMSIM_SOURCE_DIR "/" + p["scenario"].get<std::string>()));
    CHECK(a.allocated == p["peak_allocated_bytes"].get<uint64_t>());
    CHECK(a.reserved == p["peak_reserved_bytes"].get<uint64_t>());
  }
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  memsim_test::print_comparison_header();
  size_t measured = 0;
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    INFO(name);
    const nlohmann::json& p = pred.at(name);
    const uint64_t pa = p["peak_allocated_bytes"], pr = p["peak_reserved_bytes"];
    const uint64_t ra = r["measured_step_peak_allocated"], rr = r["measured_step_peak_reserved"];
    const double ea = memsim_test::rel(pa, ra), er = memsim_test::rel(pr, rr);
    memsim_test::print_comparison_row(name, pa, ra, pr, rr, "(blind; H200, transformers 5.17)");
    const auto gap = kGaps.find(name);
    REQUIRE(gap != kGaps.end());
    INFO(gap->second.why);
    CHECK(std::fabs(ea) <= gap->second.allocated);
    CHECK(std::fabs(er) <= gap->second.reserved);
    ++measured;
  }
  CHECK(measured == 2);
}
