// memsim's models of torch.compile (docs/compile.md), torchtitan's selective activation
// checkpointing (docs/torchtitan-recipes.md) and torchtune's chunked cross-entropy
// (docs/losses.md) against real runs on a GPU: tools/gpu/measure_stacks.py runs each
// configuration on the hf-llama stand-in (4 layers, d_model 1024, batch 4 x 1024, fp32).
// Its scenarios are tests/data/gpu/stacks/NAME.yaml and memsim's blind predictions
// tests/data/gpu/stacks_predictions.json, both written by tools/gpu/predict_stacks.py and
// committed before anything was measured.
//
// 1. Every scenario still loads and simulates, and every prediction in the file equals
//    what memsim predicts now (the blind record is what memsim said, not something
//    re-generated after the fact). Always runs.
// 2. Against the measurement (tests/data/gpu/stacks/stacks_runs.json, the script's
//    output, committed by whoever ran it): SKIPPED (ctest: not run) while the file is
//    absent. Once it is there: a table of real vs memsim (measured step, whole run,
//    marks); every run measured or its failure on record; the run is the configuration
//    the prediction assumed (feature keys, parameter count, on a GPU, not a dry run);
//    the measured step's peak allocated and reserved within the tolerance below (FAILS
//    beyond it). With the snapshots committed too (stacks_snapshots.tar.xz, unpacked by
//    CMake) each replays through the allocator emulator with no mismatch.
//
// Tolerances, stated before the measurement, from what each model leaves out:
//  - eager, loss torch / chunked:8, sac-layer:2: 0.5% allocated, 2% reserved. The eager
//    run is measure_cuda.py's llama_l4_d1024_s1024_b4_none, which memsim matched exactly
//    on an H100; the losses and whole-layer checkpointing are exact on CPU fixtures
//    (tests/data/torch_cpu/loss_impl.json, tests/data/torchtitan/sac_hf_llama.json).
//  - sac-op: 1% / 3%: the policy is read from torchtitan cfb93265 and checked on a
//    hand-written torch 1.13 emulation only (no selective checkpointing in 1.13).
//  - compile (model, block, budget 0.5): 10% / 15%: docs/compile.md's limits (the
//    backward is eager's, not fused: an upper bound; Inductor's buffer reuse and
//    peak-memory reordering are not modelled; the budget's knapsack was then solved
//    greedily, torch's default solver is dynamic programming).
// A gap beyond these is a rule to find (docs/compile.md, "Limits"), not a tolerance to
// widen without a named cause.
//
// Rules found from the measurement (issue #16; kChangedAfterMeasurement below), each
// checked here against the run it came from:
//  - chunked:8: a parameter used by several ops (the head, once per chunk) gets its grads
//    summed in its AccumulateGrad's InputBuffer; the first, TBackward0's view of the mm
//    result, is not added into in place, so the first two make a third weight-sized sum
//    (graph/runtime.cpp deliver); tensor_split makes every slice before any head mm
//    (graph/models/decoder_losses.cpp). Now exact: peak allocated and reserved to the byte.
//  - compile budget 0.5: the knapsack's items are the values the backward needs (torch's
//    dist_from_bw < 1e9: not the logits, a forward output only), solved by torch's
//    default dp_knapsack (graph/compile_partition.cpp). Forward end +0.58% (was -15%).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "allocator/snapshot/snapshot.h"
#include "json_test_support.h"
#include "real_run_test_support.h"
#include "replay/replay.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/parameter_count.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "tests/shared_dir_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kPredictions = MEMSIM_SOURCE_DIR + "/tests/data/gpu/stacks_predictions.json";
const std::string kRuns = MEMSIM_SOURCE_DIR + "/tests/data/gpu/stacks/stacks_runs.json";
const std::string kSnapshotArchive =
    MEMSIM_SOURCE_DIR + "/tests/data/gpu/stacks/stacks_snapshots.tar.xz";
const std::string kSnapshots = MEMSIM_STACKS_SNAPSHOTS;  // unpacked by CMake

// Largest relative error of the measured step's peaks allowed, per feature (see the top).
struct Tolerance {
  double allocated, reserved;
  const char* why;
};
Tolerance tolerance_of(const std::string& feature, const std::string& policy) {
  if (feature == "compile")
    return {0.10, 0.15, "compile: backward not fused, Inductor buffer reuse/reordering not "
                        "modelled, greedy knapsack (docs/compile.md, Limits)"};
  if (policy == "sac-op")
    return {0.01, 0.03, "sac-op: policy from torchtitan's source, checked on a torch 1.13 "
                        "emulation only"};
  return {0.005, 0.02, "eager, losses and layer checkpointing: exact on CPU fixtures and the "
                       "H100 eager run"};
}

// Measured on an H200 (2026-11-27, torch 2.11.0+cu130). Where a run came out beyond the
// tolerance stated above, its measured error (rounded up) and what is known of the cause:
// the stated tolerance was wrong for it, and the test says so rather than hiding it.
// (stacks_loss_chunked8 was here, -0.97% allocated, until the InputBuffer rule above.)
const std::map<std::string, Tolerance> kBeyondStated = {};

// Scenarios whose prediction changed after the measurement because a rule was found in
// it (the blind record stays as memsim said it; the first test checks it differs now).
const std::map<std::string, const char*> kChangedAfterMeasurement = {
    {"stacks_loss_chunked8", "the head's per-chunk weight grads meet in AccumulateGrad's "
                             "InputBuffer (out-of-place first sum); slices before the head mms"},
    {"stacks_compile_budget05", "knapsack items: only values the backward needs; dp solver"},
};

// A JSON value that may be null, as text (for comparing the run's spec with the entry's).
std::string text(const nlohmann::json& v) { return v.is_null() ? "null" : v.dump(); }

}  // namespace

TEST_CASE("the stacks GPU runs' blind predictions are what memsim predicts "
          "(tests/data/gpu/stacks_predictions.json)", "[stacks][gpu]") {
  const nlohmann::json fx = memsim_test::load_json(kPredictions);
  const nlohmann::json& preds = fx["predictions"];
  REQUIRE(preds.size() == 8);
  for (const auto& [name, entry] : preds.items()) {
    INFO(name << " (" << entry["scenario"].get<std::string>() << ")");
    REQUIRE_FALSE(entry.contains("refused"));  // memsim models every run measured
    const memsim_test::RunPrediction p = memsim_test::simulate_run(memsim_test::scenario_path_of(entry));
    if (const auto changed = kChangedAfterMeasurement.find(name);
        changed != kChangedAfterMeasurement.end()) {
      INFO("changed after the measurement: " << changed->second);
      CHECK(p.allocated != entry["peak_allocated_bytes"].get<uint64_t>());
      CHECK(p.parameters == entry["parameter_count"].get<uint64_t>());
      continue;
    }
    memsim_test::check_run_prediction(p, entry);
  }
  // The features differ from the eager run where their models say they must: a check that
  // the scenarios really turn them on (an ignored key would predict the eager bytes).
  const uint64_t eager = preds["stacks_eager"]["peak_allocated_bytes"].get<uint64_t>();
  for (const char* name : {"stacks_compile_model", "stacks_compile_block", "stacks_compile_budget05",
                           "stacks_sac_op", "stacks_sac_layer2", "stacks_loss_chunked8"}) {
    INFO(name);
    CHECK(preds[name]["peak_allocated_bytes"].get<uint64_t>() < eager);
  }
  CHECK(preds["stacks_sac_op"]["peak_allocated_bytes"].get<uint64_t>() <
        preds["stacks_sac_layer2"]["peak_allocated_bytes"].get<uint64_t>());
  CHECK(preds["stacks_compile_budget05"]["peak_allocated_bytes"].get<uint64_t>() <
        preds["stacks_compile_model"]["peak_allocated_bytes"].get<uint64_t>());
}

TEST_CASE("compile, torchtitan SAC and chunked loss on a GPU against memsim", "[stacks][gpu]") {
  const nlohmann::json fx = memsim_test::load_json(kPredictions);
  const nlohmann::json& preds = fx["predictions"];
  if (!std::filesystem::exists(kRuns)) {
    MEMSIM_SKIP("MEASUREMENT MISSING: " << kRuns << " does not exist: memsim's compile, "
                "torchtitan SAC and chunked-loss models have not been checked on a GPU. Run "
                "`python3 tools/gpu/measure_stacks.py OUT --budget 150` on one and commit "
                "OUT/stacks_runs.json (and stacks_snapshots.tar.xz) there. The blind "
                "predictions (memsim commit " << fx["memsim_commit"].get<std::string>()
                << ") are checked by the other test case.");
    return;
  }
  const nlohmann::json runs = memsim_test::load_json(kRuns);
  std::map<std::string, const nlohmann::json*> measured;
  for (const nlohmann::json& r : runs["results"]) measured[r["spec"]["name"]] = &r;
  // The real traces through the allocator emulator (streams as recorded).
  memsim_test::check_snapshot_replays(runs, kSnapshotArchive, kSnapshots, "stacks");
  // The eager runs' allocations of 1 MiB or more, one for one (the compiled runs allocate
  // Inductor's fused buffers, which memsim models as totals per region, not one by one).
  memsim_test::check_large_allocs_match(
      preds, {"stacks_eager", "stacks_loss_torch", "stacks_loss_chunked8", "stacks_sac_op", "stacks_sac_layer2"},
      kSnapshots, uint64_t{1} << 20);
  std::printf("\nStacks on %s (torch %s): measured step peaks, real vs memsim now (blind = "
              "memsim's committed prediction)\n",
              runs["results"].empty() ? "?"
                                      : runs["results"][0].value("gpu", std::string("?")).c_str(),
              runs["versions"].value("torch", std::string("?")).c_str());
  memsim_test::print_comparison_header();
  for (const auto& [name, entry] : preds.items()) {
    INFO(name);
    const auto it = measured.find(name);
    if (it == measured.end()) {
      // Not measured: the failure (or "not run: budget spent") must be on record.
      REQUIRE(runs["failures"].contains(name));
      WARN(name << " was not measured: "
                << runs["failures"][name].get<std::string>().substr(0, 600));
      continue;
    }
    const nlohmann::json& r = *it->second;
    const nlohmann::json& sp = r["spec"];
    // The run is the configuration the prediction assumed, measured on a GPU.
    REQUIRE_FALSE(r.contains("skipped"));
    REQUIRE(r.contains("measured_step_peak_allocated"));
    CHECK(sp["policy"].get<std::string>() == entry["checkpoint"].get<std::string>());
    CHECK(text(sp["compile_scope"]) == text(entry["compile_scope"]));
    CHECK(text(sp["memory_budget"]) == text(entry["compile_memory_budget"]));
    CHECK(sp["loss"].get<std::string>() == entry["loss"].get<std::string>());
    if (r.contains("dynamo_counters") && r["dynamo_counters"].contains("graph_break") &&
        !r["dynamo_counters"]["graph_break"].empty())
      WARN(name << ": Dynamo broke the graph (" << r["dynamo_counters"]["graph_break"].dump()
                << "); memsim assumes one graph per compiled region");
    const memsim_test::RunPrediction now = memsim_test::simulate_run(memsim_test::scenario_path_of(entry));
    CHECK(r["parameters"].get<uint64_t>() == now.parameters);
    const uint64_t real_alloc = r["measured_step_peak_allocated"].get<uint64_t>();
    const uint64_t real_reserved = r["measured_step_peak_reserved"].get<uint64_t>();
    const std::string blind = "blind " +
                              std::to_string(entry["peak_allocated_bytes"].get<uint64_t>()) +
                              " / " + std::to_string(entry["peak_reserved_bytes"].get<uint64_t>());
    memsim_test::print_comparison_row(name, now.allocated, real_alloc, now.reserved,
                                      real_reserved, blind);
    memsim_test::print_comparison_row(name + " (whole run)", now.whole_allocated,
                                      r["whole_run_peak_allocated"].get<uint64_t>(),
                                      now.whole_reserved,
                                      r["whole_run_peak_reserved"].get<uint64_t>());
    for (const auto& [mark, v] : now.marks) {
      if (!r["marks"].contains(mark)) continue;
      const nlohmann::json& m = r["marks"][mark];
      memsim_test::print_comparison_row(name + " @" + mark, v.first,
                                        m["allocated_bytes.all.current"].get<uint64_t>(),
                                        v.second, m["reserved_bytes.all.current"].get<uint64_t>());
    }
    const auto beyond = kBeyondStated.find(name);
    const Tolerance tol = beyond != kBeyondStated.end() ? beyond->second : tolerance_of(entry["feature"].get<std::string>(),
                                       entry["checkpoint"].get<std::string>());
    INFO(tol.why << ": allocated " << 100 * memsim_test::rel(now.allocated, real_alloc)
                 << "%, reserved " << 100 * memsim_test::rel(now.reserved, real_reserved) << "%");
    CHECK(std::abs(memsim_test::rel(now.allocated, real_alloc)) <= tol.allocated);
    CHECK(std::abs(memsim_test::rel(now.reserved, real_reserved)) <= tol.reserved);
    // The rules found in these runs (header): what they reproduce, checked on their run.
    if (name == "stacks_loss_chunked8") {
      CHECK(now.allocated == real_alloc);
      CHECK(now.reserved == real_reserved);
      CHECK(now.marks.at("forward_end").first ==
            r["marks"]["forward_end"]["allocated_bytes.all.current"].get<uint64_t>());
    }
    if (name == "stacks_compile_budget05") {
      const uint64_t real_fwd = r["marks"]["forward_end"]["allocated_bytes.all.current"].get<uint64_t>();
      CHECK(std::abs(memsim_test::rel(now.marks.at("forward_end").first, real_fwd)) <= 0.01);
      CHECK(std::abs(memsim_test::rel(now.allocated, real_alloc)) <= 0.01);
    }
  }
}
