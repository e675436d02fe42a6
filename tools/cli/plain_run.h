// A `memsim run` without per-event outputs (issue #20): streamed, and stopped at the first
// out-of-memory.
//
// The run streams its events into the allocator emulator and the online analysis
// (sim/analysis/stream_run.h) with StreamOptions::stop_at_oom: at an out-of-memory the
// builder is stopped (StopEmitting, program/event_sink.h) at the next hand-over, at most
// one chunk (4096 events) later, or at the end of the setup phase or of a compiled region
// when the OOM is inside one; nothing after it is executed or kept.
//
// An OOM report also says what the run would need with unlimited memory
// (oom.needed_bytes, tools/cli/headroom_report.h), which takes the whole Program on an
// unlimited device: that second run (streamed too, nothing stored) also gives what the
// report states about the whole step, so the report of an OOM run is the one a complete
// build gives, field for field (tests/test_plain_run.cpp):
//  - Analysis::events: the Program's total event count (the stopped build's is partial);
//  - Analysis::flops, and PlainRun::program's cost (the time model's "with unlimited
//    memory" step time), rank, host memory and offload bytes: the complete build's;
//  - the names of the failing tensor and of the live set at the peak (a later op may name
//    a tensor: "saved input of ... (recomputed)"), matched by serial (Program::serial_of),
//    the same in both builds;
//  - the measured step's first mark (the summary labels events by it).
// Everything else (the verdict, the OOM point and state, peaks, breakdown, live set, marks,
// final memory_stats) is the stopped run's, which equals the complete run's up to the OOM.
// The scenario's Program does not depend on the device (both builds read the same
// scenario), so the events up to the OOM are the same in both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "allocator/memory_stats.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/step/generate.h"

namespace memsim::cli {

struct PlainRun {
  Program program;  // what the report reads beyond the analysis: the complete build's
  Analysis analysis;
  MemoryStats final_stats;          // at the end, or at the OOM
  size_t measured_from = 0;         // the measured step's first mark (0: none)
  std::optional<uint64_t> needed;   // an OOM: peak reserved with unlimited memory
  bool stopped = false;             // the build was stopped at its OOM
  size_t stopped_events = 0;        // events the stopped build handed on (for the log)
};

// `generate_facts`: filled by the complete build (step.kind generate). live_set false:
// Analysis::live_at_peak is left empty (--advise's candidates read only peaks, the
// verdict, the step time and the needed bytes).
PlainRun run_plain(const Scenario& scenario, GenerateFacts& generate_facts, bool live_set = true);

}  // namespace memsim::cli
