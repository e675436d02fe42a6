// memsim's mixture-of-experts model (docs/moe.md) against transformers' own MoE models on a
// GPU: tools/gpu/measure_moe.py on a lent H200 (torch 2.11.0+cu130, transformers 5.17.0,
// 2026-11-27), routing forced through torch.topk so the tokens per expert are known.
// memsim's predictions were committed first (tests/data/gpu/moe_predictions.json). 2 of the
// 9 runs were measured on the first lease (Qwen3-MoE from_config, balanced and worst-case
// routing: the first attempt failed on two bugs of the script, the retry had 48 s left),
// the other 7 on a second H200 lease the same day.
//
// 1. The blind record stays honest: each prediction equals what memsim predicts now.
// 2. Each measured run against memsim, within its measured error. Where the blind scenario
//    described the run wrongly (a bug of tools/gpu/predict_moe.py, not of memsim's model),
//    the gap lists the corrected keys; the blind row is printed beside the corrected one.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "json_test_support.h"
#include "real_run_test_support.h"

using namespace memsim;

namespace {

const std::string kPredictions = MEMSIM_SOURCE_DIR "/tests/data/gpu/moe_predictions.json";
const std::string kRuns = MEMSIM_SOURCE_DIR "/tests/data/gpu/moe/moe_runs.json";

struct Gap {
  double allocated, reserved;
  const char* why;
  std::vector<std::pair<std::string, std::string>> corrected;  // --set keys, empty: blind as is
};
// The measured error, rounded up, and its cause where found (the snapshots are committed
// beside the runs for the next look).
const std::map<std::string, Gap> kGaps = {
    {"moe_tf_qwen3_moe_bf16_balanced", {0.0004, 0.0031, "not found", {}}},
    {"moe_tf_qwen3_moe_bf16_worst", {0.00003, 0.0031, "not found", {}}},
    {"moe_tf_mixtral_bf16_balanced", {0.0017, 0.0, "allocated +1.9 MiB, not found", {}}},
    {"moe_tf_olmoe_bf16_skew", {0.0016, 0.003, "allocated +2.0 MiB, not found", {}}},
    {"moe_tf_qwen2_moe_bf16_balanced", {0.0012, 0.016, "reserved: one 22 MiB segment more, not found", {}}},
    {"moe_standin_mixtral_bf16_worst", {0.00006, 0.0154, "reserved: one 20 MiB segment more, not found", {}}},
    // The stand-in's qwen3 row ties the embeddings (tools/fixtures/gen_arch_fixtures.py
    // ARCH["qwen3"]: tied=True, as Qwen3's small checkpoints) and predict_moe.py wrote
    // tied_embeddings: false: the blind scenario had 4,194,304 parameters (vocab x d_model)
    // too many (+1.7% / +2.0% allocated). With the run's own configuration:
    {"moe_standin_qwen3_bf16_balanced",
     {0.0023, 0.0033, "corrected scenario; rest not found", {{"model.tied_embeddings", "true"}}}},
    {"moe_standin_qwen3_bf16_skew",
     {0.0004, 0.0283, "corrected scenario; reserved: segments, not found", {{"model.tied_embeddings", "true"}}}},
    // +32 MiB = one (T*K, d_model) bf16 tensor (16 MiB) per MoE layer x 2 layers. In the real
    // trace (frames stripped; sizes and order) the down projection's _grouped_mm output is
    // freed as soon as it is multiplied by the routing weights, so transformers 5.17's
    // grouped_mm_experts_forward keeps one (S, D) tensor fewer for backward than the
    // integrations/moe.py memsim models (huggingface/transformers 0261a46, read for
    // graph/models/decoder_moe.cpp: out_per_sample_g * sample_weights_g saves both), and it
    // copies gate_up once more (a 24 MiB block replaced right after the up projection).
    // 5.17's source was not readable here; the fix waits for it.
    {"moe_tf_qwen3_moe_bf16_balanced_grouped_mm",
     {0.0262, 0.0427, "5.17's grouped_mm saves one (S, D) fewer per layer", {}}},
};

}  // namespace

TEST_CASE("MoE on a GPU (transformers 5.17 and stand-ins): blind predictions, measured", "[moe][gpu]") {
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
    uint64_t pa = p["peak_allocated_bytes"], pr = p["peak_reserved_bytes"];
    const uint64_t ra = r["measured_step_peak_allocated"], rr = r["measured_step_peak_reserved"];
    memsim_test::print_comparison_row(name, pa, ra, pr, rr, "(blind; H200, transformers 5.17)");
    const auto gap = kGaps.find(name);
    REQUIRE(gap != kGaps.end());
    INFO(gap->second.why);
    if (!gap->second.corrected.empty()) {
      const memsim_test::SimulatedPeaks c = memsim_test::simulate_peaks(
          load_scenario(MEMSIM_SOURCE_DIR "/" + p["scenario"].get<std::string>(), gap->second.corrected));
      pa = c.allocated;
      pr = c.reserved;
      memsim_test::print_comparison_row(name + " (corrected scenario)", pa, ra, pr, rr, gap->second.why);
    }
    const double ea = memsim_test::rel(pa, ra), er = memsim_test::rel(pr, rr);
    CHECK(std::fabs(ea) <= gap->second.allocated);
    CHECK(std::fabs(er) <= gap->second.reserved);
    ++measured;
  }
  CHECK(measured == 9);
}
