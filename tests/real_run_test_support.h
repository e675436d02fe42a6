// Shared by the tests that compare memsim's predictions with real runs: the relative
// error, where the real snapshots are when ../shared is checked out, a scenario's
// simulated peaks, the large allocations of a trace and of a Program, and the comparison
// table the accuracy tests print, and the replay of a GPU script's committed snapshots.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "allocator/snapshot/snapshot.h"
#include "replay/replay.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "tests/shared_dir_test_support.h"
#include "tests/support/real_runs.h"

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

}  // namespace memsim_test
