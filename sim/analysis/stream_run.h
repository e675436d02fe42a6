// Streaming execution (issue #20 item 1): a Program's events go through the allocator
// emulator and the analysis while the builder emits them, so that no per-event array is
// kept and a run can stop at its first out-of-memory.
//
// StreamRun is the Program's EventSink (program/event_sink.h). For each event it runs the
// Executor (sim/step/executor.h, the loop execute() runs too) and updates online what
// analyze() (sim/analysis/analysis.h) computes from a stored Program and Timeline:
//  - the measured part starts at the first executed mark AnalysisOptions::measured_from_mark;
//    until then the statistics run from event 0 (as analyze() does when that mark never
//    executes), and they start over at the mark;
//  - the peak (first event at the maximum of allocated bytes), with the per-kind bytes
//    there (copied at each new maximum: 8 words); peak reserved and requested;
//  - the top peaks (sim/analysis/online_peaks.h: the same distinct maxima as
//    find_top_peaks, without the curve);
//  - the last measured occurrence of each AnalysisOptions::marks name;
//  - the out-of-memory point with the per-kind bytes before it;
//  - the live set at the peak: a record per live tensor id (ids are recycled in a
//    streamed Program, program/program.h), plus copies (with TensorInfo, what names a
//    tensor) of the tensors live at the current peak and freed since, dropped when the
//    peak moves; both bounded by the live tensors, not the events. Tensors are listed by
//    serial (Program::serial_of), the id a stored build gives them.
//
// Contract: stream_run(program, build, ...) gives the Analysis and final MemoryStats that
// analyze(program, execute(program, ...)) gives for the same build, field for field
// (tests/test_stream_run.cpp compares every shipped scenario, fitting and not), except:
// with StreamOptions::stop_at_oom the builder is stopped at the out-of-memory, so
// Analysis::events counts only the events handed on until then (the chunk with the OOM
// and those before it), and FLOPs, cost, host memory and the names of the OOM tensor and
// of the live set (a name a later op gives, program/tensor_names.h) only what was built
// (tools/cli/plain_run.h takes those from a complete build: StreamOptions::name_serials).
// The Program keeps its strings, rank, FLOPs and cost and a tensor table of recycled ids;
// its `events` holds only an unflushed tail (Program::flushed()).
// With StreamOptions::verdict_only the events only go through the allocator: the Analysis
// then holds the verdict and the OOM report (fits(), oom, with its breakdown) and the
// final stats, not the peak points, top peaks, marks or live set.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "program/program.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/live_set.h"

namespace memsim {

struct StreamOptions {
  AnalysisOptions analysis;
  // As ExecuteOptions::reset_peaks_at_mark.
  const char* reset_peaks_at_mark = "measured_step_begin";
  // Stop the build at the first out-of-memory (StopEmitting, program/event_sink.h):
  // faster, but Analysis::events is then the events emitted so far.
  bool stop_at_oom = false;
  size_t chunk = 4096;  // events per hand-over (program/event_sink.h)
  // Only the verdict (issue #20, sweep --max): nothing is observed per event, so the
  // Analysis has fits(), the OOM report and the final stats' peaks only (find_max's
  // probes read nothing else; the observation was about a sixth of a cs336-xl probe).
  bool verdict_only = false;
  // The TensorInfo (what names a tensor) of the tensors with these serials
  // (Program::serial_of: their stored-build ids) as a stored run has it at the end
  // (StreamResult::final_infos): `memsim run` names a stopped run's failing tensor and live
  // set from a complete build this way (a later op may name a tensor: "saved input of").
  std::vector<uint32_t> name_serials;
  // Keep the live set at the peak unsummarised too (StreamResult::live_allocs).
  bool keep_live_allocs = false;
  // Run the allocator and the analysis on a second thread while the builder emits the next
  // chunk (each chunk handed on with what the consumer reads of the Program copied: an
  // alloc's serial, a free's TensorInfo, a mark's name), when the machine has two cores or
  // more. The result is the same, except that with stop_at_oom the build stops up to two
  // chunks later (Analysis::events counts those) and a stopped run's live set at the peak
  // keeps the TensorInfo a tensor freed in those chunks had at its free (the same bytes; a
  // later name: what a complete build names it, tools/cli/plain_run.h).
  bool pipelined = false;
};

struct StreamResult {
  Analysis analysis;
  MemoryStats final_stats;  // memory_stats() at the end, or at the OOM
  bool complete = true;     // false: the build was stopped at the OOM (stop_at_oom)
  // The first mark named AnalysisOptions::measured_from_mark among the events emitted,
  // executed or not (after an OOM the events are still scanned for it, unless stopped).
  std::optional<size_t> measured_mark;
  // The out-of-memory's tensor as a serial (Program::serial_of): the same in every build
  // of the same scenario, whatever ids were recycled.
  uint32_t oom_serial = 0;
  // The most bytes reserved after any executed event, from event 0 on (never reset by the
  // measured step): with final_stats' peak, what unlimited_peak_reserved computes from a
  // stored Timeline (sim/analysis/headroom.h).
  uint64_t reserved_high = 0;
  // By StreamOptions::name_serials position: the TensorInfo at its free or at the end
  // (nullopt: not built).
  std::vector<std::optional<TensorInfo>> final_infos;
  MemoryEvent oom_alloc;  // the failing alloc event (with an OOM)
  // With StreamOptions::keep_live_allocs: what Analysis::live_at_peak summarises (tensor =
  // serial), to summarise again with other TensorInfos (summarize_live_set).
  std::vector<LiveAlloc> live_allocs;
};

// Attaches a StreamRun to `program`, calls build(program) (a builder that clears and fills
// it, e.g. build_program's family rows), finishes the Program and returns the result. The
// sink is detached again before returning (also when build throws).
StreamResult stream_run(Program& program, const std::function<void(Program&)>& build,
                        const AllocatorConfig& config, DeviceMemory& device,
                        const StreamOptions& options = {});

}  // namespace memsim
