// Analysis: what a Timeline says about a Program. Peaks, what is live at the peak, the
// memory at the phase marks, the out-of-memory point and the FLOPs, in plain structs the
// report writers (tools/cli/) turn into JSON, CSV and terminal tables.
//
// Contract:
//  - The "measured" part of the run starts at the first mark named
//    AnalysisOptions::measured_from_mark ("measured_step_begin", where execute() resets the
//    allocator's peak statistics) when that mark was executed, else at event 0. Peaks,
//    top peaks and marks are taken from the measured part only.
//  - Peak values are the maxima of the Timeline over the measured part. When
//    use_final_stats is set (the default), Timeline::final_stats' peaks (reset by
//    execute() at the same mark) are taken as a floor: they also see states inside one
//    malloc that the per-event Timeline does not.
//  - The peak event is the first event where the measured maximum of allocated bytes is
//    reached. Its breakdown comes from Timeline::by_kind (the allocator's rounded sizes, so
//    the six entries sum to the allocated bytes at that event); when by_kind was not
//    recorded it falls back to the live set's requested sizes.
//  - analyze() never throws on a consistent (Program, Timeline) pair; an empty Timeline
//    (empty Program, or OOM at the very first alloc) gives zero peaks and no peak event.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "program/program.h"
#include "sim/analysis/live_set.h"
#include "sim/step/execute.h"

namespace memsim {

// One moment of the Timeline, located in the Program.
struct EventPoint {
  size_t index = 0;
  std::string op;  // op name; for a mark, the mark's name
  Phase phase = Phase::other;
  int32_t layer = -1;
  uint64_t allocated = 0;
  uint64_t reserved = 0;
  uint64_t requested = 0;
};

// The user-facing breakdown. Mapping from TensorKind: parameter, gradient,
// optimizer_state, activation and temporary map to their own entry; input (the batch),
// loss and other all go to `other`.
struct Breakdown {
  uint64_t parameters = 0;
  uint64_t gradients = 0;
  uint64_t optimizer_state = 0;
  uint64_t activations = 0;
  uint64_t temporaries = 0;
  uint64_t other = 0;
  uint64_t total() const {
    return parameters + gradients + optimizer_state + activations + temporaries + other;
  }
};
Breakdown to_breakdown(const std::array<uint64_t, kTensorKindCount>& by_kind);

// Allocated / reserved right after a named mark.
struct MarkPoint {
  std::string name;
  size_t index = 0;
  uint64_t allocated = 0;
  uint64_t reserved = 0;
};

// The failing allocation of an out-of-memory, located in the Program.
struct OomReport {
  size_t index = 0;
  std::string op;
  Phase phase = Phase::other;
  int32_t layer = -1;
  TensorKind kind = TensorKind::other;
  std::string tensor;          // name of the tensor that could not be allocated
  uint64_t requested_bytes = 0;
  uint64_t allocated_bytes = 0;  // after the allocator's cache flush, as PyTorch reports
  uint64_t reserved_bytes = 0;
  uint64_t capacity_bytes = 0;   // cudaMemGetInfo total of the device
  uint64_t free_bytes = 0;       // cudaMemGetInfo free at the failure
  std::string message;           // PyTorch's OutOfMemoryError text
  // What was allocated when the request failed (the state after the event before it),
  // by the same mapping as breakdown_at_peak; zero when the very first event failed.
  Breakdown breakdown;
};

struct AnalysisOptions {
  std::string measured_from_mark = "measured_step_begin";
  bool use_final_stats = true;
  size_t top_peaks = 5;
  // A local maximum is a distinct peak only if the curve falls at least this fraction of
  // the measured peak on both sides before rising higher (see sim/analysis/peaks.h).
  double min_peak_prominence = 0.01;
  size_t top_tensors = 10;
  // false: Analysis::live_at_peak is left empty and everything else is unchanged (the
  // breakdown at the peak included). For callers that report peaks and verdicts only
  // (a sweep without --json, sweep --max): summarising the live set (names, patterns)
  // was a tenth of a grid point, and a streamed run then keeps no per-tensor lifetimes.
  bool live_set = true;
  // The marks reported in Analysis::marks, in this order.
  std::vector<std::string> marks = {"forward_end", "backward_end", "optimizer_end"};
};

struct Analysis {
  size_t events = 0;           // events in the Program
  size_t events_executed = 0;  // entries in the Timeline (fewer after an OOM)
  size_t measured_begin = 0;   // first event of the measured part

  uint64_t peak_allocated = 0;
  uint64_t peak_reserved = 0;
  uint64_t peak_requested = 0;
  std::optional<EventPoint> peak;  // first event at the measured allocated maximum
  Breakdown breakdown_at_peak;
  LiveSet live_at_peak;            // empty when there is no peak event

  std::vector<EventPoint> top_peaks;  // distinct local maxima of allocated, highest first
  // One entry per AnalysisOptions::marks name: the last such mark executed in the
  // measured part (with gradient accumulation, the last micro-batch's), or nullopt.
  std::vector<std::pair<std::string, std::optional<MarkPoint>>> marks;

  std::optional<OomReport> oom;
  Flops flops;

  bool fits() const { return !oom.has_value(); }
};

Analysis analyze(const Program& program, const Timeline& timeline,
                 const AnalysisOptions& options = {});

// The Timeline entry `index` as an EventPoint (index must be < timeline.size()).
EventPoint event_point(const Program& program, const Timeline& timeline, size_t index);

}  // namespace memsim
