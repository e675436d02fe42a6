// memsim's mixture-of-experts model (docs/moe.md) against transformers' own MoE models on a
// GPU: tools/gpu/measure_moe.py on a lent H200 (torch 2.11.0+cu130, transformers 5.17.0,
// 2026-11-27), routing forced through torch.topk so the tokens per expert are known.
// memsim's predictions were committed first (tests/data/gpu/moe_predictions.json). 2 of the
// 9 runs were measured on the first lease (Qwen3-MoE from_config, balanced and worst-case
// routing: the first attempt failed on two bugs of the script, the retry had 48 s left),
// the other 7 on a second H200 lease the same day.
//
// 1. The blind record stays as it was: tests/data/gpu/moe_predictions.json is not rewritten.
//    Where memsim's model has not changed since, each prediction equals what memsim predicts
//    now; where it has (kRemodelled: transformers 5.17's router and experts, modelled after
//    these runs from the installed 5.17 sources), the blind numbers are printed beside
//    memsim's current ones and must differ from them (the list stays honest).
// 2. Each measured run against memsim now, within its measured error. Where the blind
//    scenario described the run wrongly (a bug of tools/gpu/predict_moe.py, not of memsim's
//    model), the gap lists the corrected keys.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "json_test_support.h"
#include "real_run_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kPredictions = MEMSIM_SOURCE_DIR + "/tests/data/gpu/moe_predictions.json";
const std::string kRuns = MEMSIM_SOURCE_DIR + "/tests/data/gpu/moe/moe_runs.json";

// Runs whose prediction changed when memsim moved to transformers 5.17's MoE code (the
// installed sources, read after the runs): the Qwen-style routers (Qwen2/Qwen3/OLMoE) return
// the raw bf16 logits (alive as the block's `_`) and cast the top-k weights to bf16, so the
// eager loop's routing product is bf16 (no n x D fp32 transient, no .to copy);
// Qwen2-MoE adds its shared expert out of place; grouped_mm drops index_add_ (the traced
// sequence, graph/models/decoder_moe.cpp). Mixtral's router and the eager loop are
// unchanged, so its two runs keep their blind numbers.
const std::map<std::string, const char*> kRemodelled = {
    {"moe_tf_qwen3_moe_bf16_balanced", "5.17 router: bf16 top-k weights, raw logits kept"},
    {"moe_tf_qwen3_moe_bf16_worst", "5.17 router: bf16 top-k weights, raw logits kept"},
    {"moe_tf_olmoe_bf16_skew", "5.17 router (OlmoeTopKRouter as Qwen2's)"},
    {"moe_tf_qwen2_moe_bf16_balanced", "5.17 router; shared expert added out of place"},
    {"moe_tf_qwen3_moe_bf16_balanced_grouped_mm", "5.17 grouped_mm_experts_forward and router"},
    // The stand-in runs ran tools/fixtures/moe_models.py as it was then (the earlier v5
    // router: router_logits rebound to the fp32 probabilities, fp32 weights); memsim now
    // models 5.17 for the qwen row, with no switch back to the old router (no release
    // transformers ships runs it with the 5.17 experts): their gaps below are memsim's 5.17
    // model against the old stand-in code.
    {"moe_standin_qwen3_bf16_balanced", "5.17 router; the run used the earlier stand-in router"},
    {"moe_standin_qwen3_bf16_skew", "5.17 router; the run used the earlier stand-in router"},
    // 5.17's masking_utils eager mask (2026-11-28, graph/models/decoder_mask_v5.h): the
    // prediction moved where the (B, 1, S, S) bf16 mask changes a peak or a segment.
    {"moe_tf_mixtral_bf16_balanced", "5.17's eager mask modelled"},
    // And 5.17's MLA attention (2026-11-28, after the measurement: the even/odd RoPE,
    // expand_kv's slice copies; graph/models/decoder_mla.cpp) with DeepseekV3MoE's view of
    // the experts' input (graph/models/decoder_moe_deepseek.cpp), found from these traces.
    // moe_tf_deepseek_v3_bf16_worst is not listed: with both changes memsim predicts its
    // blind numbers again, to the byte (1,602,065,920 / 1,730,150,400; with the mask alone
    // the reserved was 1,734,344,704), so the test holds it to them.
    {"moe_tf_deepseek_v3_bf16_balanced", "5.17's eager mask, MLA attention and experts' input view modelled"},
};

struct Gap {
  double allocated, reserved;
  const char* why;
  std::vector<std::pair<std::string, std::string>> corrected;  // --set keys, empty: blind as is
};
// memsim now against the measurement: the error, rounded up, and its cause where found (the
// snapshots are committed beside the runs for the next look).
const std::map<std::string, Gap> kGaps = {
    // With 5.17's router the eager Qwen3-MoE runs' allocated peaks move by under 1 MiB
    // (blind: +0.037% / -0.003%); balanced's reserved is now exact, worst-case's one 12 MiB
    // segment high (blind: +4 MiB).
    // Since 2026-11-28 (modelled after the measurement) the rows build 5.17's masking_utils
    // eager mask, (B, 1, S, S) bf16 = 2 MiB here (Qwen2-MoE: the full and the sliding one;
    // docs/transformers5-mask.md); the bounds before it are in the causes.
    {"moe_tf_qwen3_moe_bf16_balanced", {0.00006, 0.0, "allocated -65 KiB (-577 KiB before the mask), not found", {}}},
    {"moe_tf_qwen3_moe_bf16_worst",
     {0.00006, 0.015, "reserved: one 20 MiB segment more (12 MiB, 0.0089, before the mask), not found", {}}},
    {"moe_tf_mixtral_bf16_balanced",
     {0.00006, 0.0, "allocated -65 KiB; its +1.9 MiB before was 5.17's 2 MiB eager mask", {}}},
    {"moe_tf_olmoe_bf16_skew", {0.00075, 0.0, "allocated +959 KiB (+1.9 MiB before the mask), not found", {}}},
    {"moe_tf_qwen2_moe_bf16_balanced",
     {0.0012, 0.0087, "allocated -1.6 MiB (+2.4 MiB before the two masks); reserved: one 12 MiB segment fewer, not found", {}}},
    {"moe_standin_mixtral_bf16_worst", {0.00006, 0.0154, "reserved: one 20 MiB segment more, not found", {}}},
    // The stand-in's qwen3 row ties the embeddings (tools/fixtures/gen_arch_fixtures.py
    // ARCH["qwen3"]: tied=True, as Qwen3's small checkpoints) and predict_moe.py wrote
    // tied_embeddings: false: the blind scenario had 4,194,304 parameters (vocab x d_model)
    // too many (+1.7% / +2.0% allocated). With the run's own configuration, and memsim's 5.17
    // router against the earlier stand-in router the runs executed: allocated -0.008% each
    // (memsim's earlier-router model gave -0.22% / +0.04%: the two models' peaks differ by
    // 2.6 MB of large-pool block rounding while their requested bytes differ by 32 KiB, so the
    // closer number says little about the router); skew's reserved from -2.8% to -2.5%.
    {"moe_standin_qwen3_bf16_balanced",
     {0.00009, 0.0032, "corrected scenario; earlier stand-in router in the run", {{"model.tied_embeddings", "true"}}}},
    {"moe_standin_qwen3_bf16_skew",
     {0.00009, 0.0252, "corrected scenario; reserved: segments, not found", {{"model.tied_embeddings", "true"}}}},
    // Blind: +2.6% / +4.3% (the earlier v5 grouped_mm, index_add_ saving one more (S, D) per
    // layer). 5.17's grouped_mm_experts_forward, modelled from the installed source and layer
    // 0's trace: -65 KiB allocated (as the eager runs), reserved exact.
    {"moe_tf_qwen3_moe_bf16_balanced_grouped_mm", {0.00006, 0.0, "allocated -65 KiB, not found", {}}},
    // DeepSeek-V3 (MLA, group-limited sigmoid router, a shared expert, first layer dense),
    // transformers 5.17 from_config, measured on a fifth lease after the prediction was
    // committed: allocated -65 KiB in both (as the eager runs), reserved +12 MiB / +48 MiB
    // (+0.76% / +3.0%): not found; the first place to look is 5.17's MLA attention, which
    // builds its rope and expanded keys with slice copies memsim does not model yet
    // (docs/deepseek.md).
    // With 5.17's eager mask (2026-11-28): reserved +16 MiB / +52 MiB (0.0076 / 0.0300 before).
    // With 5.17's attention and the experts' input view (2026-11-28, after the measurement)
    // every allocation of 1 MiB or more is the trace's, one for one and in the trace's
    // order, and so is every free of that size but three, moved by a few events (the mask,
    // the previous step's logits); reserved +28 MiB / +48 MiB (+1.76% / +3.00%), which is what the real trace
    // itself reaches when replayed through the emulator with memsim's rising segment
    // addresses (tools/segment_placement.py "asc": +1.76% / +3.00%; with the trace's own
    // addresses it is exact): the remaining gap is the driver's segment placement
    // (docs/segment-placement.md), not the model.
    {"moe_tf_deepseek_v3_bf16_balanced", {0.00005, 0.0177, "reserved: segment placement (the trace replayed: the same)", {}}},
    {"moe_tf_deepseek_v3_bf16_worst", {0.00005, 0.0300, "reserved: segment placement (the trace replayed: the same)", {}}},
};

}  // namespace

TEST_CASE("MoE on a GPU (transformers 5.17 and stand-ins): blind predictions, measured", "[moe][gpu]") {
  const nlohmann::json pred = memsim_test::load_json(kPredictions)["runs"];
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  memsim_test::print_comparison_header();
  size_t measured = 0;
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    INFO(name);
    const nlohmann::json& p = pred.at(name);
    const uint64_t ba = p["peak_allocated_bytes"], br = p["peak_reserved_bytes"];
    const uint64_t ra = r["measured_step_peak_allocated"], rr = r["measured_step_peak_reserved"];
    const std::string scenario = MEMSIM_SOURCE_DIR + "/" + p["scenario"].get<std::string>();
    const memsim_test::SimulatedPeaks blind_now = memsim_test::simulate_peaks(load_scenario(scenario));
    const auto changed = kRemodelled.find(name);
    if (changed == kRemodelled.end()) {
      CHECK(blind_now.allocated == ba);
      CHECK(blind_now.reserved == br);
    } else {
      CHECK((blind_now.allocated != ba || blind_now.reserved != br));
    }
    memsim_test::print_comparison_row(name, ba, ra, br, rr, "(blind; H200, transformers 5.17)");
    const auto gap = kGaps.find(name);
    REQUIRE(gap != kGaps.end());
    INFO(gap->second.why);
    memsim_test::SimulatedPeaks now = blind_now;
    if (!gap->second.corrected.empty())
      now = memsim_test::simulate_peaks(load_scenario(scenario, gap->second.corrected));
    if (changed != kRemodelled.end() || !gap->second.corrected.empty())
      memsim_test::print_comparison_row(name + " (memsim now)", now.allocated, ra, now.reserved, rr,
                                        changed != kRemodelled.end() ? changed->second : gap->second.why);
    const double ea = memsim_test::rel(now.allocated, ra), er = memsim_test::rel(now.reserved, rr);
    CHECK(std::fabs(ea) <= gap->second.allocated);
    CHECK(std::fabs(er) <= gap->second.reserved);
    ++measured;
  }
  // The 9 runs of the two 2026-11-27 leases, and any later run the lead has added.
  CHECK(measured >= 9);
  CHECK(measured <= pred.size());
}

// Predictions committed before their measurement (the DeepSeek-V3 runs of transformers 5.17,
// tools/gpu/measure_moe.py moe_tf_deepseek_v3_*): until moe_runs.json has their result, the
// blind record must still be what memsim predicts now (or be listed in kRemodelled), so that
// the comparison the measurement brings is with the model that made the prediction.
TEST_CASE("MoE on a GPU: predictions awaiting their measurement are memsim's current ones", "[moe][gpu]") {
  const nlohmann::json pred = memsim_test::load_json(kPredictions)["runs"];
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  std::set<std::string> measured;
  for (const nlohmann::json& r : runs["results"]) measured.insert(r["spec"]["name"].get<std::string>());
  size_t pending = 0;
  for (auto it = pred.begin(); it != pred.end(); ++it) {
    if (measured.count(it.key()) != 0) continue;
    INFO(it.key());
    const nlohmann::json& p = it.value();
    REQUIRE(p.contains("peak_allocated_bytes"));
    const memsim_test::SimulatedPeaks now = memsim_test::simulate_peaks(
        load_scenario(MEMSIM_SOURCE_DIR + "/" + p["scenario"].get<std::string>()));
    if (kRemodelled.find(it.key()) == kRemodelled.end()) {
      CHECK(now.allocated == p["peak_allocated_bytes"].get<uint64_t>());
      CHECK(now.reserved == p["peak_reserved_bytes"].get<uint64_t>());
    }
    ++pending;
  }
  CHECK(pending + measured.size() == pred.size());
}

// Allocation by allocation: every allocation of 4 MiB or more that transformers 5.17 made in
// the measured runs (the snapshots' traces: warm-up and measured step), by size and in
// order, against memsim's Program for the same scenario. The peaks above can hide a transient that
// memsim lacks or adds; this cannot. It found Qwen3's q/k-norm grad copies (the first
// view's backward reshapes a grad laid out as (B,h,S,hd): graph/models/decoder_attention.cpp).
// Sizes are compared as the allocator rounds them (512 B). Below 4 MiB the runs differ by
// 2 MiB blocks in every run (2 in Mixtral's, 4 in Qwen2-MoE's: not found; none is at the
// peak). Not compared: the stand-in runs (they executed an earlier stand-in router).
// DeepSeek-V3 is compared since memsim models 5.17's MLA attention (before it: 6 x 8 MiB,
// 12 x 12 MiB and 54 x 2 MiB more in the real run, 30 x 4 MiB more in memsim; now every
// allocation of 1 MiB or more matches; docs/deepseek.md).
TEST_CASE("MoE on a GPU: the large allocations match the real traces one for one", "[moe][gpu]") {
  const std::string dir = MEMSIM_MOE_SNAPSHOTS;
  INFO("tests/data/gpu/moe/moe_snapshots.tar.xz is committed but not unpacked into " << dir
                                                                                    << ": re-run cmake");
  REQUIRE(std::filesystem::is_directory(dir));
  const nlohmann::json pred = memsim_test::load_json(kPredictions)["runs"];
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  size_t compared = 0;
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    if (name.rfind("moe_tf_", 0) != 0) continue;
    INFO(name);
    const Program program =
        build_program(load_scenario(MEMSIM_SOURCE_DIR + "/" + pred.at(name)["scenario"].get<std::string>()));
    const std::vector<uint64_t> real = memsim_test::large_allocs(read_snapshot_file(dir + "/" + name + ".pickle"));
    const std::vector<uint64_t> predicted = memsim_test::large_allocs(program);
    CHECK(memsim_test::describe_difference(memsim_test::alloc_count_difference(real, predicted, uint64_t{4} << 20)) == "");
    // And in order: counted by size alone, two errors of one size in different places
    // cancel. Qwen2-MoE's did until 2026-11-28: memsim summed its biased q/k/v input grads in
    // place (the trace: out of place, one 8 MiB tensor per layer and step) and its MoE block's
    // 2-D input grads out of place (the trace: in place), 4 x 8 MiB each (docs/input-buffer.md).
    auto at_least_4mib = [](const std::vector<uint64_t>& v) {
      std::vector<uint64_t> out;
      for (uint64_t b : v)
        if (b >= (uint64_t{4} << 20)) out.push_back(b);
      return out;
    };
    CHECK(at_least_4mib(real) == at_least_4mib(predicted));
    ++compared;
  }
  // Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE balanced / worst-case / grouped_mm, DeepSeek-V3
  // balanced / worst-case.
  CHECK(compared == 8);
}

// DeepSeek-V3 with transformers 5.17's MLA attention (graph/models/decoder_mla.cpp), in
// order: every allocation above 1 MiB of the two traces (setup, warm-up and measured step;
// the half-width RoPE products, the CopySlices copies and the strided slices' grads
// included) is memsim's, one for one and in the same order. The f5a9ec51 attention memsim
// modelled before failed this (6 x 8 MiB, 12 x 12 MiB and 54 x 2 MiB allocations fewer,
// 30 x 4 MiB more; docs/deepseek.md).
TEST_CASE("MoE on a GPU: DeepSeek-V3's large allocations are the trace's, in order", "[moe][gpu][deepseek]") {
  const std::string dir = MEMSIM_MOE_SNAPSHOTS;
  REQUIRE(std::filesystem::is_directory(dir));
  const nlohmann::json pred = memsim_test::load_json(kPredictions)["runs"];
  for (const std::string name : {"moe_tf_deepseek_v3_bf16_balanced", "moe_tf_deepseek_v3_bf16_worst"}) {
    INFO(name);
    const Program program =
        build_program(load_scenario(MEMSIM_SOURCE_DIR + "/" + pred.at(name)["scenario"].get<std::string>()));
    const std::vector<uint64_t> real = memsim_test::large_allocs(read_snapshot_file(dir + "/" + name + ".pickle"));
    const std::vector<uint64_t> sim = memsim_test::large_allocs(program);
    CHECK(real.size() > 1000);
    CHECK(sim == real);
  }
}
