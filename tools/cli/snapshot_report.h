// The --snapshot report: the simulated run as a PyTorch memory snapshot (the pickle
// torch.cuda.memory._dump_snapshot writes), which pytorch.org/memory_viz opens.
//
// Contract:
//  - SnapshotRecorder, passed to execute() as ExecuteOptions::trace_observer, keeps every
//    allocator trace entry (alloc, free_requested, free_completed, segment_alloc,
//    segment_free, oom) in the order the emulator produced them, with time_us = the index
//    of the Program event that caused it (so the viewer's time axis is the event axis of
//    --timeline and --trace).
//  - write_run_snapshot() writes device_traces[0] = that trace and segments = the
//    allocator's final segments (ExecuteOptions::final_segments), with what each block is
//    (add_tensor_frames). Replaying the file (memsim replay, or replay/replay.h)
//    reproduces every traced address and cudaMalloc.
//  - add_tensor_frames(): memsim has no Python stacks, so each alloc / free_requested /
//    free_completed entry and each active block at the end gets two frames (innermost
//    first, PyTorch's {name, filename, line}): {tensor name (program/tensor_names.h),
//    module path or "model", layer or 0} and {allocating op, phase: setup / forward /
//    loss / backward / recompute / optimizer, 0}; and a 'category' (snapshot_category:
//    parameter, gradient, optimizer_state, activation, temporary, input, unknown) that
//    pytorch.org/memory_viz colours the Active Memory Timeline by. A free carries its
//    block's alloc frames (as PyTorch's do); segment and oom entries the frames of the
//    request that caused them and category "unknown".
//  - Write failures throw InputError naming the file.
#pragma once

#include <string>
#include <vector>

#include "allocator/allocator_config.h"
#include "allocator/snapshot/snapshot.h"
#include "sim/step/execute.h"

namespace memsim::cli {

class SnapshotRecorder : public ExecuteTraceObserver {
 public:
  void on_trace(size_t event_index, const TraceEntry& e) override {
    trace.push_back({e.action, e.address, e.size, e.stream, static_cast<int64_t>(event_index)});
  }
  std::vector<SnapshotTraceEntry> trace;
};

void add_tensor_frames(Snapshot& snapshot, const Program& program);

void write_run_snapshot(const std::string& path, const Program& program,
                        std::vector<SnapshotTraceEntry> trace, std::vector<SegmentInfo> segments,
                        const AllocatorConfig& config);

}  // namespace memsim::cli
