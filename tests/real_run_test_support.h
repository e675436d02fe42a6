// Shared by the tests that compare memsim's predictions with real runs: the relative
// error, where the real snapshots are when ../shared is checked out, a scenario's
// simulated peaks, the large allocations of a trace and of a Program, and the comparison
// table the accuracy tests print, and the replay of a GPU script's committed snapshots.
#pragma once

#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "allocator/snapshot/snapshot.h"
#include "replay/replay.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/parameter_count.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "tests/shared_dir_test_support.h"
#include "tests/support/real_runs.h"
#include "test_paths.h"

namespace memsim_test {

// (predicted - real) / real.
inline double rel(uint64_t predicted, uint64_t real) {
  return (static_cast<double>(predicted) - static_cast<double>(real)) / static_cast<double>(real);
}

// Whether the real snapshots are checked out (their manifest.json is readable). When they
// are not, says so with MEMSIM_SKIP naming the missing folder and what goes unchecked,
// so a run without ../shared is a skipped test, never a silent pass (ctest lists it as
// not run; tests/shared_dir_test_support.h); the caller then returns. The
// predictions against the stored peaks are other test cases and run either way.
inline bool shared_snapshots_present(const std::string& unchecked) {
  if (std::ifstream(shared_snapshots_dir() + "manifest.json")) return true;
  MEMSIM_SKIP(shared_snapshots_dir() << "manifest.json not found (shared ground truth "
              "absent): " << unchecked << " not checked; the stored peaks stand alone");
  return false;
}

// The stored replay peaks of `snapshot` in `measured` (the test fails when absent).
inline const memsim::ReplayPeaks& find_measured(const std::vector<memsim::ReplayPeaks>& measured,
                                                const std::string& snapshot) {
  for (const memsim::ReplayPeaks& m : measured)
    if (m.snapshot == snapshot) return m;
  FAIL("no measured peaks for " << snapshot);
  throw 0;
}

// A scenario's peaks as `memsim run` reports them (built, executed on its device, analysed).
struct SimulatedPeaks {
  bool fits = false;
  uint64_t allocated = 0, reserved = 0;
};
inline SimulatedPeaks simulate_peaks(const memsim::Scenario& s, const memsim::Program& program) {
  memsim::SimulatedDevice device(s.device.capacity, s.device.cuda_context);
  const memsim::Timeline t = memsim::execute(program, s.allocator, device, memsim::ExecuteOptions{});
  const memsim::Analysis a = memsim::analyze(program, t);
  return {a.fits(), a.peak_allocated, a.peak_reserved};
}
inline SimulatedPeaks simulate_peaks(const memsim::Scenario& s) {
  return simulate_peaks(s, memsim::build_program(s));
}

// The sizes of the allocations above 1 MiB (the large pool), in order: from a trace, and
// from a simulated Program (requests rounded as the allocator rounds them).
inline std::vector<uint64_t> large_allocs(const memsim::Snapshot& snap) {
  std::vector<uint64_t> out;
  for (const memsim::SnapshotTraceEntry& e : snap.device_traces.at(0))
    if (e.action == memsim::TraceAction::alloc && e.size > (1u << 20)) out.push_back(e.size);
  return out;
}
inline std::vector<uint64_t> large_allocs(const memsim::Program& p) {
  std::vector<uint64_t> out;
  for (const memsim::MemoryEvent& e : p.events) {
    const uint64_t rounded = (e.bytes + 511) / 512 * 512;
    if (e.type == memsim::EventType::alloc && rounded > (1u << 20)) out.push_back(rounded);
  }
  return out;
}

// Allocation by allocation, ignoring order: for each size of at least `min_bytes`, how many
// more allocations of it the real trace made than memsim's Program (negative: memsim made
// more). Sizes that agree are left out, so an empty map is a one-for-one match.
inline std::map<uint64_t, int64_t> alloc_count_difference(const std::vector<uint64_t>& real,
                                                          const std::vector<uint64_t>& predicted,
                                                          uint64_t min_bytes) {
  std::map<uint64_t, int64_t> diff;
  for (uint64_t b : real)
    if (b >= min_bytes) ++diff[b];
  for (uint64_t b : predicted)
    if (b >= min_bytes) --diff[b];
  for (auto it = diff.begin(); it != diff.end();) it = it->second == 0 ? diff.erase(it) : std::next(it);
  return diff;
}

// alloc_count_difference as text ("8388608 B: 4 more in the real run; ..."), empty when
// they match: CHECK(text.empty()) prints what differs.
inline std::string describe_difference(const std::map<uint64_t, int64_t>& diff) {
  std::string out;
  for (const auto& [size, more] : diff)
    out += (out.empty() ? "" : "; ") + std::to_string(size) + " B: " +
           std::to_string(more > 0 ? more : -more) + (more > 0 ? " more in the real run" : " more in memsim");
  return out;
}

// The Markdown comparison table: predicted vs real peak allocated and reserved, bytes and %.
inline void print_comparison_header() {
  std::printf("\n| case | predicted allocated | real allocated | error | predicted reserved | "
              "real reserved | error |\n|---|---:|---:|---:|---:|---:|---:|\n");
}
inline void print_comparison_row(const std::string& id, uint64_t allocated,
                                 uint64_t real_allocated, uint64_t reserved,
                                 uint64_t real_reserved, const std::string& note = "") {
  std::printf("| %s | %llu | %llu | %+.3f%% | %llu | %llu | %+.3f%% |%s\n", id.c_str(),
              static_cast<unsigned long long>(allocated),
              static_cast<unsigned long long>(real_allocated),
              100 * rel(allocated, real_allocated), static_cast<unsigned long long>(reserved),
              static_cast<unsigned long long>(real_reserved), 100 * rel(reserved, real_reserved),
              note.empty() ? "" : ("  " + note).c_str());
}

// What memsim predicts now for a GPU script's scenario, in its predictions file's terms
// (the FSDP2 and stacks runs): the measured step's peaks, the whole run's, the marks, the
// allocation count at the end and the parameter count. REQUIREs that it fits.
struct RunPrediction {
  uint64_t allocated = 0, reserved = 0;                        // measured step
  uint64_t whole_allocated = 0, whole_reserved = 0;            // setup + warm-up + measured
  std::map<std::string, std::pair<uint64_t, uint64_t>> marks;  // allocated, reserved
  int64_t allocations = 0;                                     // allocation.all.allocated at the end
  uint64_t parameters = 0;
};

inline RunPrediction simulate_run(const std::string& scenario_path) {
  const memsim::Scenario s = memsim::load_scenario(scenario_path);
  const memsim::Program program = memsim::build_program(s);
  memsim::SimulatedDevice device(s.device.capacity, s.device.cuda_context);
  const memsim::Timeline t = memsim::execute(program, s.allocator, device, memsim::ExecuteOptions{});
  const memsim::Analysis a = memsim::analyze(program, t);
  REQUIRE(a.fits());
  RunPrediction p;
  p.allocated = a.peak_allocated;
  p.reserved = a.peak_reserved;
  p.whole_allocated = *std::max_element(t.allocated.begin(), t.allocated.end());
  p.whole_reserved = *std::max_element(t.reserved.begin(), t.reserved.end());
  for (const auto& [name, mark] : a.marks)
    if (mark) p.marks[name] = {mark->allocated, mark->reserved};
  p.allocations = t.final_stats.allocation.all.allocated;
  p.parameters = static_cast<uint64_t>(memsim::parameter_count(s.model));
  return p;
}

// memsim's prediction `p` equals a predictions file's record `entry` (written by the GPU
// scripts' predict_*.py before the run): both peaks of the measured step and of the whole
// run, the parameter count, the allocation count (`allocations_whole_run`, which the HF
// Trainer file does not record: `with_allocations` false), and every mark's allocated / reserved bytes. A null mark is
// one the scenario has no step for (optimizer_end with optimizer.in_backward): memsim must
// not report it either.
inline void check_run_prediction(const RunPrediction& p, const nlohmann::json& entry,
                                 bool with_allocations = true) {
  CHECK(p.allocated == entry["peak_allocated_bytes"].get<uint64_t>());
  CHECK(p.reserved == entry["peak_reserved_bytes"].get<uint64_t>());
  CHECK(p.whole_allocated == entry["whole_run_peak_allocated_bytes"].get<uint64_t>());
  CHECK(p.whole_reserved == entry["whole_run_peak_reserved_bytes"].get<uint64_t>());
  if (with_allocations)
    CHECK(p.allocations == entry["allocations_whole_run"].get<int64_t>());
  CHECK(p.parameters == entry["parameter_count"].get<uint64_t>());
  for (const auto& [mark, v] : entry["marks"].items()) {
    INFO(mark);
    if (v.is_null()) {
      CHECK(p.marks.count(mark) == 0);
      continue;
    }
    REQUIRE(p.marks.count(mark) == 1);
    CHECK(p.marks.at(mark).first == v["allocated"].get<uint64_t>());
    CHECK(p.marks.at(mark).second == v["reserved"].get<uint64_t>());
  }
}

// A predictions file entry's scenario, as a path from the source folder.
inline std::string scenario_path_of(const nlohmann::json& entry) {
  return std::string(MEMSIM_SOURCE_DIR + "/") + entry["scenario"].get<std::string>();
}

// Each measured run's snapshot (the GPU script's OUT/<topic>_snapshots.tar.xz, unpacked by
// CMake into `dir`) replays through the allocator emulator with no mismatch, from an empty
// allocator, to the run's whole-run peaks (`whole_run_peak_allocated` / `_reserved` of
// `runs["results"]`). A WARN says so when the archive was not committed.
inline void check_snapshot_replays(const nlohmann::json& runs, const std::string& archive,
                                   const std::string& dir, const char* what) {
  if (!std::filesystem::exists(archive)) {
    WARN("no " << archive << ": the " << what << " snapshots were not committed, so their "
         "replay through the allocator emulator is unchecked");
    return;
  }
  INFO("the archive is committed but not unpacked into " << dir << ": re-run cmake");
  REQUIRE(std::filesystem::is_directory(dir));
  for (const nlohmann::json& r : runs["results"]) {
    const std::string name = r["spec"]["name"];
    INFO(name);
    const memsim::Snapshot snap = memsim::read_snapshot_file(dir + "/" + name + ".pickle");
    const memsim::ReplayReport rep = memsim::replay_snapshot(snap);
    CHECK(rep.mismatches == 0);
    CHECK(rep.final_layout_match);
    CHECK(rep.seeded_segments == 0);  // recorded from an empty allocator
    CHECK(rep.peak_allocated_bytes == r["whole_run_peak_allocated"].get<uint64_t>());
    CHECK(rep.peak_reserved_bytes == r["whole_run_peak_reserved"].get<uint64_t>());
  }
}

// Allocation by allocation: each listed run's trace (its unpacked snapshot in `dir`) makes
// exactly the allocations of at least `min_bytes` that memsim's Program for its scenario
// (the predictions' "scenario") makes, by size, ignoring order. Peaks can hide a transient
// memsim lacks or adds; this cannot.
inline void check_large_allocs_match(const nlohmann::json& predictions, const std::vector<std::string>& names,
                                     const std::string& dir, uint64_t min_bytes) {
  for (const std::string& name : names) {
    INFO(name);
    const std::string path = dir + "/" + name + ".pickle";
    REQUIRE(std::filesystem::exists(path));
    const memsim::Program program =
        memsim::build_program(memsim::load_scenario(scenario_path_of(predictions.at(name))));
    CHECK(describe_difference(alloc_count_difference(large_allocs(memsim::read_snapshot_file(path)),
                                                     large_allocs(program), min_bytes)) == "");
  }
}

}  // namespace memsim_test
