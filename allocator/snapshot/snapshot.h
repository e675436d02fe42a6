// PyTorch memory snapshots (torch.cuda.memory._snapshot / _dump_snapshot, §9):
// the in-memory model, reading the pickle files, and writing them back.
//
// Contract:
//  - read_snapshot_file() accepts the pickle subset _dump_snapshot writes (protocols 2-4,
//    and 5's framing) and rejects anything else with a SnapshotError whose message names
//    the file and what is wrong (byte offset for malformed pickles, key path for wrong
//    fields). It never crashes or hangs on hostile input.
//  - write_snapshot_file() writes protocol 4 with plain dict/list/tuple/str/int/float/
//    bool/None only, which pytorch.org/memory_viz and torch.cuda._memory_viz load.
//  - A snapshot that reads is a possible allocator state: every segment's blocks tile it,
//    its size sums match, it ends at or below kMaxDeviceAddress, no two segments of one
//    device overlap, and every traced size and address (oom's requested size excepted)
//    lies within kMaxDeviceAddress.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "allocator/allocator_config.h"
#include "allocator/caching_allocator.h"

namespace memsim {

// The largest device address a snapshot may name (segment ends, traced allocations): 2^57.
// Virtual addresses are at most 57 bits on every platform CUDA runs on (x86-64 with 5-level
// paging; CUDA's unified address space is 47-49 bits, and every real snapshot in
// shared/groundtruth ends below 2^47). A larger size or end is a corrupt or hostile file,
// and refusing it keeps every sum of sizes (the allocator's int64 statistics, the
// replay's running totals) far from overflow.
inline constexpr uint64_t kMaxDeviceAddress = uint64_t{1} << 57;

// One stack frame as PyTorch records it: {'name', 'filename', 'line'} (innermost first).
// memsim's writer fills them with what a tensor is (tools/cli/snapshot_report.h); the
// allocator itself never sees them.
struct SnapshotFrame {
  std::string name;
  std::string filename;
  int64_t line = 0;
};

struct SnapshotTraceEntry {
  TraceAction action = TraceAction::alloc;
  uint64_t address = 0;  // for oom: device_free
  uint64_t size = 0;
  StreamId stream = 0;
  int64_t time_us = 0;
  // Written only: 1 + index into Snapshot::frame_sets / Snapshot::categories, 0 for none
  // (then the entry has no 'frames' / 'category' key, as PyTorch writes an entry without
  // a recorded stack). The reader leaves both 0.
  uint32_t frames = 0;
  uint32_t category = 0;
};

struct SnapshotSegment {
  int device = 0;
  SegmentInfo info;  // blocks in address order
  // Written only: per block of info.blocks, 1 + index into Snapshot::frame_sets (0 or a
  // missing entry: 'frames' is []).
  std::vector<uint32_t> block_frames;
};

struct Snapshot {
  std::vector<SnapshotSegment> segments;
  std::vector<std::vector<SnapshotTraceEntry>> device_traces;  // one list per device
  std::vector<std::vector<SnapshotFrame>> frame_sets;  // shared by trace entries and blocks
  // 'category' values (memory_viz colours the Active Memory Timeline by them).
  std::vector<std::string> categories;
  AllocatorConfig config;           // from allocator_settings (defaults if absent)
  std::string alloc_conf_string;    // allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]
};

class SnapshotError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

Snapshot read_snapshot_file(const std::string& path);
// `name` is used in error messages (a file name, or "<memory>").
Snapshot read_snapshot_bytes(const std::string& bytes, const std::string& name);

void write_snapshot_file(const Snapshot& snapshot, const std::string& path);
std::string write_snapshot_bytes(const Snapshot& snapshot);

}  // namespace memsim
