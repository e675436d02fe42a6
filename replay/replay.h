// Replaying a real PyTorch memory snapshot through the allocator emulator
// (shared/docs/pytorch-allocator.md §15): rebuild the allocator state at the start of
// the trace from the final segments minus the trace, then run every traced request and
// check that the emulator picks exactly the traced address and makes exactly the traced
// cudaMalloc calls.
//
// Contract:
//  - prepare_replay() does all parsing-like work (start-state reconstruction, resolving
//    every free to the alloc it frees); run_replay() is the hot loop and may be run many
//    times on one PreparedReplay. replay_snapshot() = both.
//  - A mismatch never aborts the replay: it is counted, the first few are described, and
//    the emulator continues with its own decision (so later events may cascade).
//  - Peaks are absolute (the warm start's baseline included) and come from the
//    emulator's memory_stats: allocated uses real block sizes (an unsplit block counts
//    whole), requested uses the traced byte counts.
//  - Supported trace actions: alloc, free_requested, free_completed, segment_alloc,
//    segment_free (a run of them outside a malloc is replayed as empty_cache()),
//    snapshot. oom, segment_map and segment_unmap are counted as `unsupported_events`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "allocator/allocator_config.h"
#include "allocator/caching_allocator.h"
#include "allocator/snapshot/snapshot.h"
#include "program/program.h"

namespace memsim {

struct ReplayMismatch {
  size_t event_index = 0;  // index into the device's trace
  std::string what;        // e.g. "alloc address", "cudaMalloc size", "unexpected cudaMalloc"
  uint64_t expected = 0;
  uint64_t got = 0;
  std::string describe() const;
};

struct ReplayTimelinePoint {
  uint64_t allocated = 0;
  uint64_t reserved = 0;
  uint64_t requested = 0;
};

struct ReplayReport {
  size_t events = 0;           // trace entries replayed
  size_t allocs = 0;
  size_t frees = 0;
  size_t segment_allocs = 0;   // traced cudaMallocs
  size_t segment_frees = 0;    // traced cudaFrees
  size_t unsupported_events = 0;
  size_t mismatches = 0;
  std::vector<ReplayMismatch> first_mismatches;  // up to ReplayOptions::keep_mismatches

  // Warm start reconstructed from the snapshot (§15).
  size_t seeded_segments = 0;
  size_t seeded_live_blocks = 0;
  size_t inferred_block_sizes = 0;  // pre-trace blocks whose size absorbed a <= 1 MiB tail
  uint64_t baseline_allocated_bytes = 0;
  uint64_t baseline_reserved_bytes = 0;
  uint64_t baseline_requested_bytes = 0;

  // Peaks over the trace, absolute (baseline included), from the emulator's stats.
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  uint64_t peak_requested_bytes = 0;
  size_t peak_allocated_event = 0;  // trace index at which allocated first reached its peak
  // The trace-only estimate of allocated bytes that needs no emulator (the convention of
  // shared/groundtruth/snapshots/manifest.json): the snapshot's final allocated bytes
  // minus the trace's net 512-rounded alloc/free sizes gives a baseline, plus the running
  // sum of rounded sizes. It misses unsplit remainders (§4.8), so it can differ from
  // peak_allocated_bytes, which is what memory_stats() reports.
  uint64_t trace_estimate_peak_allocated_bytes = 0;

  // Final state vs the snapshot's segments.
  bool final_segments_match = false;  // every field, stale requested_size included
  bool final_layout_match = false;    // addresses, sizes and states (requested_size of
                                      // inactive blocks ignored: unknowable for a warm start)
  std::string first_segment_difference;

  MemoryStats final_stats;
  std::vector<ReplayTimelinePoint> timeline;  // one per trace entry, when requested
};

struct ReplayOptions {
  int device = 0;
  size_t keep_mismatches = 10;
  bool record_timeline = false;
  // Compare the final state with the snapshot's segments (costs a segments() walk).
  bool check_final_state = true;
  // Replaces the snapshot's own allocator_settings (e.g. memsim replay --set).
  std::optional<AllocatorConfig> config;
};

// The compiled form of a snapshot's trace plus its reconstructed start state.
struct PreparedReplay {
  enum class Kind : uint8_t { alloc, free, segment_alloc, segment_free, ignore, unsupported };
  struct Step {
    Kind kind;
    uint32_t trace_index;
    uint32_t slot;  // alloc/free: handle slot
    StreamId stream;
    uint64_t address;
    uint64_t size;
  };
  struct Seed {
    SegmentInfo segment;
    std::vector<uint32_t> slots;  // per allocated block in address order; UINT32_MAX = none
  };

  AllocatorConfig config;
  std::vector<Step> steps;
  std::vector<Seed> seeds;
  uint32_t slot_count = 0;
  size_t trace_events = 0;
  size_t inferred_block_sizes = 0;
  uint64_t trace_estimate_peak_allocated = 0;  // see ReplayReport
  std::vector<SegmentInfo> final_segments;  // the snapshot's, for the end comparison
};

PreparedReplay prepare_replay(const Snapshot& snapshot, const ReplayOptions& options = {});
ReplayReport run_replay(const PreparedReplay& prepared, const ReplayOptions& options = {});
ReplayReport replay_snapshot(const Snapshot& snapshot, const ReplayOptions& options = {});

// The trace as a memsim Program (for the shared timeline/analysis/report path): one
// `other` tensor per traced alloc, freed where the trace frees it. Blocks older than the
// trace are not in it (a Program starts empty), and frees of such blocks are dropped, so
// its absolute numbers lack the warm start's baseline; a run of cudaFrees outside a malloc
// becomes an empty_cache event. Stream handles are numbered 0, 1, ... in order of first
// appearance (the default stream 0 stays 0); `streams` (optional) receives the handles.
Program program_from_trace(const Snapshot& snapshot, int device = 0,
                           std::vector<StreamId>* streams = nullptr);

// First difference between two segment lists ("" when equal). With
// ignore_inactive_requested, inactive blocks' requested_size is not compared.
std::string compare_segments(const std::vector<SegmentInfo>& expected,
                             const std::vector<SegmentInfo>& got,
                             bool ignore_inactive_requested);

}  // namespace memsim
