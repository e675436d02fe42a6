// Replaying real PyTorch snapshots (§15): every traced alloc must get the traced address
// and every traced cudaMalloc must be reproduced, with peaks equal to manifest.json's.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "allocator/snapshot/snapshot.h"
#include "replay/replay.h"
#include "tests/shared_dir_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kGroundTruth = memsim_test::shared_root() + "/groundtruth/snapshots";

bool exists(const std::string& path) { return std::ifstream(path).good(); }

std::string describe(const ReplayReport& r) {
  std::string s = "events " + std::to_string(r.events) + ", allocs " + std::to_string(r.allocs) +
                  ", segment_allocs " + std::to_string(r.segment_allocs) + ", mismatches " +
                  std::to_string(r.mismatches);
  for (const ReplayMismatch& m : r.first_mismatches) s += "\n  " + m.describe();
  if (!r.first_segment_difference.empty()) s += "\n  final state: " + r.first_segment_difference;
  return s;
}

}  // namespace

TEST_CASE("Replay of the bundled small snapshots has no mismatch and the manifest's peaks", "[replay]") {
  struct Case {
    const char* file;
    uint64_t peak_allocated, peak_reserved, peak_requested;
    size_t allocs, segment_allocs;
  };
  // Peaks from shared/groundtruth/snapshots/manifest.json (peak_*_in_trace).
  // For these three the trace holds no unsplit remainder, so memory_stats' allocated peak
  // equals the manifest's trace estimate.
  const Case cases[] = {
      {"silmont2000_mem_snapshot.pickle", 3249144832ull, 3781165056ull, 3249143816ull, 36, 9},
      {"magma27_memory_snapshot.pickle", 13927832064ull, 14180941824ull, 13923997700ull, 1721, 0},
      {"bolongcheng_xl_fwd_cl512_fp32_expandable.pickle", 42537453568ull, 43132125184ull,
       42537453568ull, 1704, 0},
  };
  for (const Case& c : cases) {
    INFO(c.file);
    const Snapshot snap = read_snapshot_file(std::string(MEMSIM_SOURCE_DIR + "/tests/data/") + c.file);
    const ReplayReport r = replay_snapshot(snap);
    INFO(describe(r));
    CHECK(r.mismatches == 0);
    CHECK(r.allocs == c.allocs);
    CHECK(r.segment_allocs == c.segment_allocs);
    CHECK(r.final_layout_match);
    CHECK(r.trace_estimate_peak_allocated_bytes == c.peak_allocated);
    CHECK(r.peak_allocated_bytes == c.peak_allocated);
    CHECK(r.peak_reserved_bytes == c.peak_reserved);
    CHECK(r.peak_requested_bytes == c.peak_requested);
  }
}

TEST_CASE("Replay of all real snapshots in shared/groundtruth", "[replay][groundtruth]") {
  const std::string manifest_path = kGroundTruth + "/manifest.json";
  if (!exists(manifest_path)) {
    MEMSIM_SKIP(manifest_path << " not found (shared ground truth absent): the replay of the real "
                "snapshots is not checked");
    return;
  }
  std::ifstream in(manifest_path);
  const nlohmann::json manifest = nlohmann::json::parse(in);
  size_t files = 0, total_allocs = 0, total_segment_allocs = 0, total_mismatches = 0;
  for (const auto& entry : manifest) {
    const std::string file = entry.at("file").get<std::string>();
    INFO(file);
    const Snapshot snap = read_snapshot_file(kGroundTruth + "/" + file);
    const ReplayReport r = replay_snapshot(snap);
    INFO(describe(r));
    CHECK(r.mismatches == 0);
    CHECK(r.allocs == entry.at("n_allocs").get<size_t>());
    // The manifest's allocated peak is the trace-only estimate (512-rounded request
    // sizes); memory_stats' allocated also counts unsplit remainders (§4.8).
    CHECK(r.trace_estimate_peak_allocated_bytes == entry.at("peak_allocated_in_trace").get<uint64_t>());
    CHECK(r.final_layout_match);
    CHECK(r.peak_reserved_bytes == entry.at("peak_reserved_in_trace").get<uint64_t>());
    CHECK(r.peak_requested_bytes == entry.at("peak_requested_in_trace").get<uint64_t>());
    ++files;
    total_allocs += r.allocs;
    total_segment_allocs += r.segment_allocs;
    total_mismatches += r.mismatches;
  }
  CHECK(files == 46);
  CHECK(total_mismatches == 0);
  CHECK(total_allocs == 137831);
  CHECK(total_segment_allocs == 3006);
}

TEST_CASE("program_from_trace turns a trace into alloc/free events", "[replay]") {
  const Snapshot snap =
      read_snapshot_file(std::string(MEMSIM_SOURCE_DIR + "/tests/data/silmont2000_mem_snapshot.pickle"));
  const Program program = program_from_trace(snap);
  size_t allocs = 0, frees = 0;
  for (const MemoryEvent& e : program.events) {
    allocs += e.type == EventType::alloc;
    frees += e.type == EventType::free;
  }
  CHECK(allocs == 36);
  CHECK(program.tensors.size() == 36);
  CHECK(frees <= allocs);
}
