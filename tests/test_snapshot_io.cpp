// Reading and writing PyTorch memory snapshots: a bundled real file field by field,
// round trips, structural errors with key paths, and (when the shared ground truth is
// present) all 46 real snapshots against manifest.json.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "allocator/snapshot/pickle.h"
#include "allocator/snapshot/snapshot.h"
#include "tests/shared_dir_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kSilmont = MEMSIM_SOURCE_DIR + "/tests/data/silmont2000_mem_snapshot.pickle";
const std::string kGroundTruth = memsim_test::shared_root() + "/groundtruth/snapshots";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const char* action_key(TraceAction a) {
  switch (a) {
    case TraceAction::alloc: return "alloc";
    case TraceAction::free_requested: return "free_requested";
    case TraceAction::free_completed: return "free_completed";
    case TraceAction::segment_alloc: return "segment_alloc";
    case TraceAction::segment_free: return "segment_free";
    case TraceAction::segment_map: return "segment_map";
    case TraceAction::segment_unmap: return "segment_unmap";
    case TraceAction::oom: return "oom";
    case TraceAction::snapshot: return "snapshot";
  }
  return "?";
}

// Structural equality of everything a Snapshot holds; returns the first difference.
std::string difference(const Snapshot& a, const Snapshot& b) {
  if (a.segments.size() != b.segments.size()) return "segment count";
  for (size_t s = 0; s < a.segments.size(); ++s) {
    const SegmentInfo& x = a.segments[s].info;
    const SegmentInfo& y = b.segments[s].info;
    const std::string at = "segments[" + std::to_string(s) + "]";
    if (a.segments[s].device != b.segments[s].device || x.address != y.address || x.total_size != y.total_size ||
        x.allocated_size != y.allocated_size || x.active_size != y.active_size ||
        x.requested_size != y.requested_size || x.stream != y.stream || x.is_small != y.is_small ||
        x.is_expandable != y.is_expandable || x.blocks.size() != y.blocks.size()) {
      return at;
    }
    for (size_t k = 0; k < x.blocks.size(); ++k) {
      const BlockInfo& p = x.blocks[k];
      const BlockInfo& q = y.blocks[k];
      if (p.address != q.address || p.size != q.size || p.requested_size != q.requested_size || p.state != q.state) {
        return at + ".blocks[" + std::to_string(k) + "]";
      }
    }
  }
  if (a.device_traces.size() != b.device_traces.size()) return "device_traces count";
  for (size_t d = 0; d < a.device_traces.size(); ++d) {
    if (a.device_traces[d].size() != b.device_traces[d].size()) return "device_traces[" + std::to_string(d) + "] size";
    for (size_t e = 0; e < a.device_traces[d].size(); ++e) {
      const SnapshotTraceEntry& p = a.device_traces[d][e];
      const SnapshotTraceEntry& q = b.device_traces[d][e];
      if (p.action != q.action || p.address != q.address || p.size != q.size || p.stream != q.stream ||
          p.time_us != q.time_us) {
        return "device_traces[" + std::to_string(d) + "][" + std::to_string(e) + "]";
      }
    }
  }
  const AllocatorConfig& c = a.config;
  const AllocatorConfig& k = b.config;
  if (c.max_split_size != k.max_split_size || c.expandable_segments != k.expandable_segments ||
      c.garbage_collection_threshold != k.garbage_collection_threshold ||
      c.roundup_power2_divisions != k.roundup_power2_divisions || a.alloc_conf_string != b.alloc_conf_string) {
    return "allocator_settings";
  }
  return "";
}

std::string read_error(const std::string& pickle) {
  try {
    read_snapshot_bytes(pickle, "<memory>");
  } catch (const SnapshotError& e) {
    return e.what();
  }
  return "(no error)";
}

// A minimal valid snapshot written with PickleWriter; `mutate` picks one defect.
enum class Defect { none, size_is_str, gap, sum, state, action, shared_segment, device_free };
std::string small_snapshot(Defect defect) {
  PickleWriter w;
  w.begin_dict(3);
  w.string("segments");
  w.begin_list(1);
  w.begin_dict(9);
  w.string("device"); w.integer(0);
  w.string("address"); w.unsigned_integer(0x7f0000000000);
  w.string("total_size"); w.integer(defect == Defect::sum ? 4194304 : 2097152);
  w.string("allocated_size"); w.integer(1024);
  w.string("active_size"); w.integer(1024);
  w.string("requested_size"); w.integer(1000);
  w.string("stream"); w.integer(0);
  w.string("segment_type"); w.string("small");
  w.string("blocks");
  w.begin_list(2);
  w.begin_dict(4);
  w.string("address"); w.unsigned_integer(0x7f0000000000);
  w.string("size");
  if (defect == Defect::size_is_str) w.string("1024"); else w.integer(1024);
  w.string("requested_size"); w.integer(1000);
  w.string("state"); w.string(defect == Defect::state ? "active_awaiting_free" : "active_allocated");
  w.end_dict();
  w.begin_dict(4);
  w.string("address"); w.unsigned_integer(0x7f0000000000 + 1024 + (defect == Defect::gap ? 512 : 0));
  w.string("size"); w.integer(2097152 - 1024);
  w.string("requested_size"); w.integer(0);
  w.string("state"); w.string("inactive");
  w.end_dict();
  w.end_list();
  w.end_dict();
  w.end_list();
  w.string("device_traces");
  w.begin_list(1);
  w.begin_list(2);
  w.begin_dict(5);
  w.string("action"); w.string(defect == Defect::action ? "malloc" : "alloc");
  w.string("addr"); w.unsigned_integer(0x7f0000000000);
  w.string("size"); w.integer(1000);
  w.string("stream"); w.integer(0);
  w.string("time_us"); w.integer(1772688692031317);
  w.end_dict();
  w.begin_dict(5);
  w.string("action"); w.string("oom");
  w.string(defect == Defect::device_free ? "addr" : "device_free"); w.integer(123456);
  w.string("size"); w.integer(1 << 30);
  w.string("stream"); w.integer(0);
  w.string("time_us"); w.integer(1772688692031318);
  w.end_dict();
  w.end_list();
  w.end_list();
  w.string("allocator_settings");
  w.begin_dict(4);
  w.string("PYTORCH_CUDA_ALLOC_CONF"); w.string("max_split_size_mb:128,roundup_power2_divisions:[256:1,>:8]");
  w.string("max_split_size"); w.integer(128 << 20);
  w.string("garbage_collection_threshold"); w.real(0.6);
  w.string("roundup_power2_divisions");
  w.begin_dict(3);
  w.string("1"); w.integer(1);
  w.string("256"); w.integer(1);
  w.string("32768"); w.integer(8);
  w.end_dict();
  w.end_dict();
  w.end_dict();
  std::string out = w.finish();
  if (defect == Defect::shared_segment) {
    // Rewrite "segments: [S]" as "[S, S]" by hand: the list's one-item APPEND becomes
    // APPEND + BINGET of S's memo slot (3: after the top dict, 'segments' and the list) +
    // APPEND. The APPEND is the one right before the next key, 'device_traces'.
    const size_t next_key = out.find("\x8c\x0d" "device_traces");
    REQUIRE(next_key != std::string::npos);
    REQUIRE(out[next_key - 1] == 'a');
    out.insert(next_key, std::string("h\x03" "a", 3));
  }
  return out;
}

}  // namespace

TEST_CASE("Bundled snapshot: segments, blocks, trace and settings", "[snapshot]") {
  const Snapshot s = read_snapshot_file(kSilmont);
  // Values from Python's pickle.load of the same file and from manifest.json.
  REQUIRE(s.segments.size() == 9);
  size_t small = 0, blocks = 0, inactive = 0, allocated_blocks = 0;
  uint64_t reserved = 0, allocated = 0, requested = 0;
  for (const SnapshotSegment& seg : s.segments) {
    CHECK(seg.device == 0);
    CHECK(seg.info.stream == 0);
    CHECK_FALSE(seg.info.is_expandable);
    small += seg.info.is_small;
    blocks += seg.info.blocks.size();
    reserved += seg.info.total_size;
    allocated += seg.info.allocated_size;
    requested += seg.info.requested_size;
    for (const BlockInfo& b : seg.info.blocks) {
      inactive += b.state == BlockState::inactive;
      allocated_blocks += b.state == BlockState::active_allocated;
    }
  }
  CHECK(small == 1);
  CHECK(blocks == 20);
  CHECK(inactive == 10);
  CHECK(allocated_blocks == 10);
  CHECK(reserved == 3781165056ull);
  CHECK(allocated == 31719936ull);  // manifest allocated_end
  CHECK(requested == 31719428ull);  // manifest requested_end
  const SegmentInfo& first = s.segments[0].info;
  CHECK(first.address == 139777059848192ull);
  CHECK(first.total_size == 536870912ull);
  CHECK_FALSE(first.is_small);
  REQUIRE(first.blocks.size() == 1);
  CHECK(first.blocks[0].requested_size == 536870912ull);  // stale, inactive (§9.3)
  CHECK(first.blocks[0].state == BlockState::inactive);

  REQUIRE(s.device_traces.size() == 1);
  const auto& trace = s.device_traces[0];
  REQUIRE(trace.size() == 97);
  std::map<std::string, size_t> actions;
  for (const SnapshotTraceEntry& e : trace) ++actions[action_key(e.action)];
  CHECK(actions == std::map<std::string, size_t>{
                       {"alloc", 36}, {"free_requested", 26}, {"free_completed", 26}, {"segment_alloc", 9}});
  CHECK(trace.front().action == TraceAction::segment_alloc);
  CHECK(trace.front().address == 139781763760128ull);
  CHECK(trace.front().size == 20971520ull);
  CHECK(trace.front().time_us == 1772688692031317ll);
  CHECK(trace.back().action == TraceAction::free_completed);
  CHECK(trace.back().address == 139780117496320ull);
  CHECK(trace.back().size == 4);

  CHECK(s.alloc_conf_string.empty());
  CHECK(s.config.max_split_size == AllocatorConfig::kUnlimited);
  CHECK_FALSE(s.config.expandable_segments);
  CHECK(s.config.garbage_collection_threshold == 0.0);
  for (uint32_t d : s.config.roundup_power2_divisions) CHECK(d == 0);
}

TEST_CASE("Round trip: read, write, read again gives the same snapshot", "[snapshot]") {
  const std::string original = slurp(kSilmont);
  const Snapshot a = read_snapshot_bytes(original, "silmont");
  const std::string written = write_snapshot_bytes(a);
  const Snapshot b = read_snapshot_bytes(written, "written");
  CHECK(difference(a, b).empty());
  // Frames are dropped, so the file shrinks; and writing again is stable.
  CHECK(written.size() < original.size());
  CHECK(write_snapshot_bytes(b) == written);
  // The writer uses only memory_viz's opcodes (§10.1): no BINUNICODE8/BINBYTES/etc.
  // Checked by re-reading with the strict reader plus tools/check_snapshot_pickle.py.

  const std::string path = MEMSIM_BINARY_DIR + "/roundtrip_snapshot_test.pickle";
  write_snapshot_file(a, path);
  CHECK(difference(a, read_snapshot_file(path)).empty());
  std::remove(path.c_str());
}

TEST_CASE("Round trip of a non-default config, oom entries and expandable segments", "[snapshot]") {
  const Snapshot a = read_snapshot_bytes(small_snapshot(Defect::none), "small");
  REQUIRE(a.segments.size() == 1);
  CHECK(a.segments[0].info.is_small);
  CHECK(a.config.max_split_size == (128u << 20));
  CHECK(a.config.garbage_collection_threshold == 0.6);
  CHECK(a.config.roundup_power2_divisions[0] == 1);
  CHECK(a.config.roundup_power2_divisions[8] == 1);
  CHECK(a.config.roundup_power2_divisions[15] == 8);
  CHECK(a.alloc_conf_string == "max_split_size_mb:128,roundup_power2_divisions:[256:1,>:8]");
  REQUIRE(a.device_traces.size() == 1);
  REQUIRE(a.device_traces[0].size() == 2);
  CHECK(a.device_traces[0][1].action == TraceAction::oom);
  CHECK(a.device_traces[0][1].address == 123456);  // device_free

  Snapshot m = a;
  m.config.expandable_segments = true;
  m.segments[0].info.is_expandable = true;
  m.segments[0].info.stream = 0x55d0c0ffee00;
  const Snapshot b = read_snapshot_bytes(write_snapshot_bytes(m), "written");
  CHECK(difference(m, b).empty());
}

TEST_CASE("An old-format snapshot (bare segments list) reads as segments only", "[snapshot]") {
  // torch.cuda.memory_snapshot() returns only the segments list.
  const auto bare = [](bool with_blocks) {
    PickleWriter w;
    w.begin_list(1);
    w.begin_dict(with_blocks ? 9 : 8);
    w.string("device"); w.integer(1);
    w.string("address"); w.integer(4096);
    w.string("total_size"); w.integer(2097152);
    w.string("allocated_size"); w.integer(0);
    w.string("active_size"); w.integer(0);
    w.string("requested_size"); w.integer(0);
    w.string("stream"); w.integer(0);
    w.string("segment_type"); w.string("small");
    if (with_blocks) {
      w.string("blocks");
      w.begin_list(1);
      w.begin_dict(4);
      w.string("address"); w.integer(4096);
      w.string("size"); w.integer(2097152);
      w.string("requested_size"); w.integer(0);
      w.string("state"); w.string("inactive");
      w.end_dict();
      w.end_list();
    }
    w.end_dict();
    w.end_list();
    return w.finish();
  };
  CHECK(read_error(bare(false)) == "<memory>: segments[0]: missing key 'blocks'");
  const Snapshot s = read_snapshot_bytes(bare(true), "bare");
  REQUIRE(s.segments.size() == 1);
  CHECK(s.segments[0].device == 1);
  CHECK(s.device_traces.empty());
  // Written back, device_traces is padded to cover device 1: viewers index it by device.
  const Snapshot back = read_snapshot_bytes(write_snapshot_bytes(s), "written");
  CHECK(back.segments.size() == 1);
  REQUIRE(back.device_traces.size() == 2);
  CHECK(back.device_traces[1].empty());
}

TEST_CASE("Structural errors name the key path", "[snapshot]") {
  CHECK(read_error(small_snapshot(Defect::size_is_str)) ==
        "<memory>: segments[0].blocks[0].size: expected int, got str");
  CHECK(read_error(small_snapshot(Defect::gap)) ==
        "<memory>: segments[0].blocks[1].address: blocks do not tile the segment: expected address "
        "139637976728576, got 139637976729088");
  CHECK(read_error(small_snapshot(Defect::sum)) ==
        "<memory>: segments[0].total_size: 4194304 != 2097152, the sum of its block sizes");
  CHECK(read_error(small_snapshot(Defect::state)) ==
        "<memory>: segments[0].blocks[0].state: unknown block state 'active_awaiting_free'");
  CHECK(read_error(small_snapshot(Defect::action)) ==
        "<memory>: device_traces[0][0].action: unknown trace action 'malloc'");
  CHECK(read_error(small_snapshot(Defect::device_free)) ==
        "<memory>: device_traces[0][1]: missing key 'device_free'");
  CHECK(read_error(small_snapshot(Defect::shared_segment)).find("segments[1]: the same object appears twice") !=
        std::string::npos);
  CHECK(read_error(std::string("\x80\x04N.", 4)) ==
        "<memory>: expected a dict (or a list of segments) at the top, got None");
}

TEST_CASE("Truncated and corrupted real files are rejected cleanly", "[snapshot]") {
  const std::string original = slurp(kSilmont);
  REQUIRE(original.size() > 1000);
  size_t cuts = 0;
  for (size_t cut = 0; cut < original.size(); cut += 97) {
    CHECK_THROWS_AS(read_snapshot_bytes(original.substr(0, cut), "cut"), SnapshotError);
    ++cuts;
  }
  CHECK_THROWS_AS(read_snapshot_bytes(original.substr(0, original.size() - 1), "cut"), SnapshotError);
  CHECK(cuts > 700);
  CHECK(read_error(original.substr(0, 2)) == "<memory>: byte 2: truncated pickle: no STOP opcode");

  // Byte flips (deterministic LCG): each either parses or throws SnapshotError.
  uint64_t state = 12345;
  size_t rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bad = original;
    for (int k = 0; k < 4; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      bad[(state >> 17) % bad.size()] = static_cast<char>(state >> 56);
    }
    try {
      read_snapshot_bytes(bad, "flip");
    } catch (const SnapshotError&) {
      ++rejected;
    }
  }
  CHECK(rejected > 0);
}

TEST_CASE("A nonexistent file is a SnapshotError naming it", "[snapshot]") {
  CHECK_THROWS_WITH(read_snapshot_file("/nonexistent/x.pickle"),
                    Catch::Matchers::StartsWith("/nonexistent/x.pickle: cannot open"));
  CHECK_THROWS_AS(write_snapshot_file(Snapshot{}, "/nonexistent/dir/x.pickle"), SnapshotError);
}

TEST_CASE("All real snapshots read and match manifest.json, and round trips are exact", "[snapshot]") {
  const std::string manifest_path = kGroundTruth + "/manifest.json";
  if (!std::filesystem::exists(manifest_path)) {
    MEMSIM_SKIP("shared ground truth not found at " << kGroundTruth << ": the 46-file check is not run");
    return;
  }
  const nlohmann::json manifest = nlohmann::json::parse(slurp(manifest_path));
  REQUIRE(manifest.size() == 46);
  double slowest_ms = 0;
  size_t biggest = 0;
  for (const nlohmann::json& entry : manifest) {
    const std::string file = entry["file"].get<std::string>();
    INFO(file);
    const std::string bytes = slurp(kGroundTruth + "/" + file);
    REQUIRE(bytes.size() == entry["bytes"].get<size_t>());
    const auto t0 = std::chrono::steady_clock::now();
    const Snapshot s = read_snapshot_bytes(bytes, file);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (bytes.size() > biggest) {
      biggest = bytes.size();
      slowest_ms = ms;
    }

    CHECK(s.segments.size() == entry["n_segments"].get<size_t>());
    uint64_t allocated = 0, reserved = 0, requested = 0;
    for (const SnapshotSegment& seg : s.segments) {
      allocated += seg.info.allocated_size;
      reserved += seg.info.total_size;
      requested += seg.info.requested_size;
    }
    CHECK(allocated == entry["allocated_end"].get<uint64_t>());
    CHECK(reserved == entry["reserved_end"].get<uint64_t>());
    CHECK(requested == entry["requested_end"].get<uint64_t>());
    size_t events = 0;
    std::map<std::string, size_t> actions;
    for (const auto& trace : s.device_traces) {
      events += trace.size();
      for (const SnapshotTraceEntry& e : trace) ++actions[action_key(e.action)];
    }
    CHECK(events == entry["n_trace_events"].get<size_t>());
    CHECK(actions == entry["actions"].get<std::map<std::string, size_t>>());
    const nlohmann::json& settings = entry["allocator_settings"];
    CHECK(s.config.expandable_segments == settings["expandable_segments"].get<bool>());
    CHECK(s.alloc_conf_string == settings["PYTORCH_CUDA_ALLOC_CONF"].get<std::string>());

    const Snapshot again = read_snapshot_bytes(write_snapshot_bytes(s), file + " (rewritten)");
    CHECK(difference(s, again).empty());
  }
  WARN("largest snapshot (" << biggest << " bytes) parsed in " << slowest_ms << " ms");
}
