// Execution: runs a Program through the caching-allocator emulator and records the
// Timeline (allocated / reserved / requested bytes after every event, by tensor kind).
//
// Contract:
//  - Events run strictly in order. An alloc that the allocator cannot serve (after its
//    release-and-retry) stops execution there, as PyTorch's OutOfMemoryError would:
//    Timeline::oom is set and the timeline ends at that event.
//  - The hot loop allocates nothing per event beyond the Timeline's preallocated arrays
//    and does no logging.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "allocator/caching_allocator.h"
#include "program/program.h"
#include "sim/step/executor.h"

namespace memsim {

// OomPoint and ExecuteTraceObserver: sim/step/executor.h (the per-event loop).

struct Timeline {
  // One entry per executed event, the state after that event.
  std::vector<uint64_t> allocated;  // allocated_bytes.all.current (rounded block sizes)
  std::vector<uint64_t> reserved;   // reserved_bytes.all.current
  std::vector<uint64_t> requested;  // requested_bytes.all.current
  // Allocated (rounded) bytes by TensorKind after each event.
  std::vector<std::array<uint64_t, kTensorKindCount>> by_kind;
  std::optional<OomPoint> oom;
  MemoryStats final_stats;          // memory_stats() at the end (or at the OOM)

  size_t size() const { return allocated.size(); }
};

// Storage execute() may reuse from one call to the next (ExecuteOptions::buffers), so that
// repeated runs (memsim optimize) touch memory already mapped. Hand a Timeline that is no
// longer needed back into `timeline` to have its arrays reused by the next call.
struct ExecuteBuffers {
  Timeline timeline;
  std::vector<BlockId> block_of;
  std::vector<uint64_t> rounded_of;
};

struct ExecuteOptions {
  bool record_by_kind = true;  // sweeps may turn the per-kind arrays off for speed
  // Peak statistics are reset at the first mark of this name, as a script calling
  // torch.cuda.reset_peak_memory_stats() before the measured step would.
  const char* reset_peaks_at_mark = "measured_step_begin";
  // Optional, not owned: sees every allocator trace entry (costs nothing when null).
  ExecuteTraceObserver* trace_observer = nullptr;
  // Optional, not owned: receives the allocator's final segments() (at the end, or at
  // the OOM), for snapshot writers.
  std::vector<SegmentInfo>* final_segments = nullptr;
  // Optional, not owned: storage to reuse (its contents are discarded, the result is the
  // same as without it).
  ExecuteBuffers* buffers = nullptr;
};

// Executes `program` on a fresh allocator with `config` over `device`.
Timeline execute(const Program& program, const AllocatorConfig& config, DeviceMemory& device,
                 const ExecuteOptions& options = {});

}  // namespace memsim
