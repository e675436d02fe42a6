// The real CS336 runs of shared/groundtruth/snapshots, as memsim inputs: for each
// recorded snapshot that memsim's cs336 family can express, the Scenario and the
// TrainingScript that reproduce the run (read from the run's own script, SOURCES.md,
// and the snapshot's stack traces). Tests and reports compare predictions with the
// measured peaks of these runs.
#pragma once

#include <string>
#include <vector>

#include "scenario/scenario.h"
#include "sim/step/training_script.h"

namespace memsim {

struct RealRun {
  std::string id;        // short name, e.g. "wedsonlin medium train S128"
  std::string snapshot;  // manifest.json "file" of the recorded snapshot
  Scenario scenario;
  TrainingScript script;
};

// What `memsim replay FILE --json -` reports for one snapshot (the trace replayed from
// the allocator state at its start: max_memory_allocated / max_memory_reserved over the
// recorded window, as torch would have reported them). Copied into the code so the
// accuracy tests run without shared/; they re-replay the snapshots when it exists.
struct ReplayPeaks {
  std::string snapshot;  // manifest.json "file"
  uint64_t peak_allocated = 0, peak_reserved = 0, peak_requested = 0;
};

// fp32 runs whose configuration is known; see real_runs.cpp for the evidence per run.
std::vector<RealRun> cs336_real_runs();
// The bf16 autocast runs (tests/support/real_runs_bf16.cpp): same scripts under torch.autocast.
std::vector<RealRun> cs336_bf16_real_runs();

// What memsim predicts for the measured step (from the "measured_step_begin" mark on,
// as torch.cuda.reset_peak_memory_stats() / the start of recording would see it).
struct MeasuredStep {
  uint64_t peak_allocated = 0;  // max_memory_allocated
  uint64_t peak_reserved = 0;   // max_memory_reserved
  uint64_t peak_requested = 0;
  uint64_t allocated_at_begin = 0, reserved_at_begin = 0;
  size_t peak_event = 0;        // first event reaching peak_allocated
  uint32_t peak_alloc_ordinal = 0;  // allocs from the mark up to the peak event, inclusive
  uint32_t n_allocs = 0;        // allocs in the measured step
  std::string peak_op;          // op name of the peak event
  int32_t peak_layer = -1;
  Phase peak_phase = Phase::other;
  size_t events = 0;            // program size
};
// Builds the program and runs it through the allocator emulator on a device of the
// scenario's capacity.
MeasuredStep predict_measured_step(const Scenario& scenario, const TrainingScript& script);

}  // namespace memsim
