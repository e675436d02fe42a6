// Analysis of a replayed PyTorch trace (replay/replay.h), in the same Analysis struct as a
// simulated run, so `memsim replay` reports the same keys as `memsim run`.
//
// What a trace can and cannot say:
//  - Indices are trace-entry indices of the replayed device; every block is of unknown
//    kind (TensorKind::other), op "alloc" (or "before trace" for blocks live when the
//    trace started), phase other, no layer; so the breakdown at the peak is all `other`.
//  - Peaks are the emulator's memory_stats peaks (absolute, the warm start's baseline
//    included, as ReplayReport defines them); the peak event is
//    ReplayReport::peak_allocated_event.
//  - Traces carry no phase marks (all marks are absent) and no FLOPs (zero).
//  - An `oom` entry in the trace becomes Analysis::oom (requested bytes and the free
//    bytes PyTorch traced; allocated/reserved are the emulator's at that entry; the
//    capacity and message are not in a trace: 0 and a reconstructed sentence).
// Requires a ReplayReport recorded with ReplayOptions::record_timeline for top peaks and
// per-event values; without it they are left empty / zero.
#pragma once

#include <vector>

#include "allocator/snapshot/snapshot.h"
#include "replay/replay.h"
#include "sim/analysis/analysis.h"

namespace memsim {

Analysis analyze_replay(const std::vector<SnapshotTraceEntry>& trace,
                        const PreparedReplay& prepared, const ReplayReport& report,
                        const AnalysisOptions& options = {});

}  // namespace memsim
