// memsim's FSDP2 model (sim/parallel/fsdp2.h) against FSDP2 on a GPU: tools/gpu/
// measure_fsdp2.py runs each configuration on one GPU as rank 0 of a fake process group
// (docs/fsdp2.md, "Measuring FSDP2 on one GPU"). Its scenarios are tests/data/gpu/fsdp2/
// NAME.yaml and memsim's blind predictions tests/data/gpu/fsdp2_predictions.json, both
// written by tools/gpu/predict_fsdp2.py and committed before anything was measured.
//
// 1. Every scenario still loads and simulates (or is refused where the file recorded a
//    refusal).
// 2. Until the measurement is committed (tests/data/gpu/fsdp2/fsdp2_runs.json, the
//    script's output), a visible WARN says it is missing, and every prediction in the file
//    must equal what memsim predicts now: the blind record is what memsim said, not
//    something re-generated after the fact.
// 3. Once it is there: a table of real vs memsim (the measured step's and the whole run's
//    peaks, the marks), the blind prediction beside memsim's current one; each run must
//    have been measured or have its failure recorded, with the configuration and
//    parameter count the prediction assumed; runs named in kTolerance must be within it
//    (filled in after the measurement, with the reason for each gap), the others WARN.
//    With the snapshots committed too (tests/data/gpu/fsdp2/fsdp2_snapshots.tar.xz,
//    unpacked by CMake), each replays through the allocator emulator (its streams
//    included) with no mismatch and the run's whole-run peaks; without them a WARN says
//    the replay is unchecked.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "allocator/snapshot/snapshot.h"
#include "json_test_support.h"
#include "real_run_test_support.h"
#include "replay/replay.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/parameter_count.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kPredictions = MEMSIM_SOURCE_DIR + "/tests/data/gpu/fsdp2_predictions.json";
const std::string kRuns = MEMSIM_SOURCE_DIR + "/tests/data/gpu/fsdp2/fsdp2_runs.json";
const std::string kSnapshotArchive = MEMSIM_SOURCE_DIR + "/tests/data/gpu/fsdp2/fsdp2_snapshots.tar.xz";
const std::string kSnapshots = MEMSIM_FSDP2_SNAPSHOTS;  // unpacked by CMake

// Largest relative error allowed per run, and why (to be filled once measured).
struct Tolerance {
  double allocated, reserved;
  const char* why;
};
// Measured on an H200 (torch 2.11.0+cu130, 2026-11-27; blind: the predictions file was
// committed first). 7 of 9 runs on the first lease; the meta-init and world-4 runs (cut by
// its budget) on a second H200 lease the same day.
const std::map<std::string, Tolerance> kTolerance = {
    {"fsdp2_w8_fp32_reshard2", {0.0, 0.0, "exact"}},
    // Meta-device init then to_empty + reset_parameters on the GPU: exact in both.
    {"fsdp2_w8_bf16_reduce_fp32_meta", {0.0, 0.0, "exact"}},
    // Allocated exact. Reserved: every side stream's pool is exact (bytes and segments,
    // tests/test_setup_cache.cpp); the difference is the default stream's: the real run
    // keeps one more 128 MiB attention-scores segment (fsdp2_w8_fp32), memsim 122 MiB more
    // in the HSDP runs (tools/reserved_report.py on the snapshots): not found.
    {"fsdp2_w8_fp32", {0.0, 0.024, "reserved: default-stream segments, not found"}},
    {"hsdp_r2_s4_fp32", {0.0, 0.0195, "reserved: default-stream segments, not found"}},
    // World 4: each rank's shard is the HSDP r2 s4 run's, and so are both numbers.
    {"fsdp2_w4_fp32", {0.0, 0.0195, "reserved: default-stream segments, not found"}},
    // Reserved exact; allocated 0.5 MiB over at the peak: not found.
    {"fsdp2_w8_fp32_noreshard", {0.00011, 0.0, "allocated +512 KiB, not found"}},
    // Mixed precision (bf16 params, fp32 reduce): allocated within 0.08%, the bf16 cast
    // temporaries' placement; not found.
    {"fsdp2_w8_bf16_reduce_fp32", {0.00024, 0.0062, "mixed precision, not found"}},
    {"fsdp2_w8_bf16_reduce_fp32_fullac", {0.00034, 0.0, "mixed precision, not found"}},
    {"hsdp_r2_s4_bf16", {0.0008, 0.0045, "mixed precision, not found"}},
};


bool refused(const nlohmann::json& entry) { return entry.contains("refused"); }

}  // namespace

TEST_CASE("the FSDP2 GPU runs' scenarios still load (tests/data/gpu/fsdp2)", "[fsdp2][gpu]") {
  const nlohmann::json fx = memsim_test::load_json(kPredictions);
  REQUIRE(fx["predictions"].size() >= 9);
  for (const auto& [name, entry] : fx["predictions"].items()) {
    INFO(name);
    if (refused(entry)) {
      CHECK_THROWS_AS(build_program(load_scenario(memsim_test::scenario_path_of(entry))), ScenarioError);
    } else {
      const Program p = build_program(load_scenario(memsim_test::scenario_path_of(entry)));
      CHECK(p.events.size() > 1000);
    }
  }
}

TEST_CASE("FSDP2 on a GPU (fake process group, rank 0) against memsim", "[fsdp2][gpu]") {
  const nlohmann::json fx = memsim_test::load_json(kPredictions);
  const nlohmann::json& preds = fx["predictions"];
  REQUIRE(preds.size() >= 9);
  if (!std::filesystem::exists(kRuns)) {
    WARN("MEASUREMENT MISSING: " << kRuns << " does not exist: memsim's FSDP2 model has not "
         "been checked on a GPU. Run tools/gpu/measure_fsdp2.py on one (docs/fsdp2.md) and "
         "commit its fsdp2_runs.json there. Until then this test only checks that the blind "
         "predictions (" << kPredictions << ", memsim commit "
         << fx["memsim_commit"].get<std::string>() << ") are still what memsim predicts.");
    for (const auto& [name, entry] : preds.items()) {
      INFO(name << " (" << entry["scenario"].get<std::string>() << ")");
      if (refused(entry)) {
        CHECK_THROWS_AS(build_program(load_scenario(memsim_test::scenario_path_of(entry))), ScenarioError);
        continue;
      }
      const memsim_test::RunPrediction p = memsim_test::simulate_run(memsim_test::scenario_path_of(entry));
      memsim_test::check_run_prediction(p, entry);
    }
    return;
  }

  const nlohmann::json runs = memsim_test::load_json(kRuns);
  std::map<std::string, const nlohmann::json*> measured;
  for (const nlohmann::json& r : runs["results"]) measured[r["spec"]["name"]] = &r;
  // The real traces through the allocator emulator (streams as recorded).
  memsim_test::check_snapshot_replays(runs, kSnapshotArchive, kSnapshots, "FSDP2");
  // Every allocation of 1 MiB or more, one for one (this found that embedding backward at
  // <= 3072 tokens takes CUDA's direct kernel: no sort buffers, graph/ops/ops_nn.cpp).
  {
    std::vector<std::string> names;
    for (const nlohmann::json& r : runs["results"]) names.push_back(r["spec"]["name"]);
    memsim_test::check_large_allocs_match(preds, names, kSnapshots, uint64_t{1} << 20);
  }
  std::printf("\nFSDP2 on %s (torch %s), one GPU as rank 0 of a fake process group: measured "
              "step peaks, real vs memsim now (blind = memsim's committed prediction)\n",
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
      WARN(name << " was not measured: " << runs["failures"][name].get<std::string>().substr(0, 600));
      continue;
    }
    const nlohmann::json& r = *it->second;
    // The run is the configuration the prediction assumed.
    const nlohmann::json& sp = r["spec"];
    CHECK(sp["world"].get<int>() == entry["world"].get<int>());
    CHECK(sp["replicate"].get<int>() == entry["replicate"].get<int>());
    CHECK(sp["reshard"].get<std::string>() == entry["reshard_after_forward"].get<std::string>());
    CHECK(sp["policy"].get<std::string>() == entry["checkpoint"].get<std::string>());
    CHECK(sp["init"].get<std::string>() == entry["init"].get<std::string>());
    CHECK(sp["param_dtype"] == entry["param_dtype"]);
    CHECK(sp["reduce_dtype"] == entry["reduce_dtype"]);
    CHECK_FALSE(r["dry_run"].get<bool>());
    if (refused(entry)) {
      WARN(name << ": memsim refused it (" << entry["refused"].get<std::string>()
           << "); measured peak allocated " << r["measured_step_peak_allocated"].get<uint64_t>());
      continue;
    }
    const memsim_test::RunPrediction now = memsim_test::simulate_run(memsim_test::scenario_path_of(entry));
    CHECK(r["parameters"].get<uint64_t>() == now.parameters);
    const uint64_t real_alloc = r["measured_step_peak_allocated"].get<uint64_t>();
    const uint64_t real_reserved = r["measured_step_peak_reserved"].get<uint64_t>();
    const std::string blind = "blind " + std::to_string(entry["peak_allocated_bytes"].get<uint64_t>()) +
                              " / " + std::to_string(entry["peak_reserved_bytes"].get<uint64_t>());
    memsim_test::print_comparison_row(name, now.allocated, real_alloc, now.reserved, real_reserved,
                                      blind);
    memsim_test::print_comparison_row(name + " (whole run)", now.whole_allocated,
                                      r["whole_run_peak_allocated"].get<uint64_t>(),
                                      now.whole_reserved,
                                      r["whole_run_peak_reserved"].get<uint64_t>());
    for (const auto& [mark, v] : now.marks) {
      const nlohmann::json& m = r["marks"][mark];
      memsim_test::print_comparison_row(name + " @" + mark, v.first,
                                        m["allocated_bytes.all.current"].get<uint64_t>(), v.second,
                                        m["reserved_bytes.all.current"].get<uint64_t>());
    }
    const double ea = memsim_test::rel(now.allocated, real_alloc);
    const double er = memsim_test::rel(now.reserved, real_reserved);
    const auto tol = kTolerance.find(name);
    if (tol == kTolerance.end()) {
      WARN(name << ": no tolerance set yet (kTolerance): allocated " << 100 * ea
           << "%, reserved " << 100 * er << "% against the measurement");
    } else {
      INFO(tol->second.why);
      CHECK(std::abs(ea) <= tol->second.allocated);
      CHECK(std::abs(er) <= tol->second.reserved);
    }
  }
}
