// The other assignment2-systems snapshots of shared/groundtruth/snapshots (SOURCES.md)
// that memsim's cs336 family expresses end to end: silmont2000's fp32 and bf16 autocast
// no_grad forwards of their own model (scenario key model.swiglu: projections-first),
// MAGMA27's gradient-accumulating forward + backward and Charan6924's five recorded
// no_grad forwards.
// docs/real-runs-other.md has the evidence per run (script, commit, stack frames) and
// the runs left out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/support/real_runs.h"

namespace memsim {

// The measured peaks of the snapshots below (copied from memsim replay, so tests run
// without shared/; tests/test_other_runs.cpp re-replays them when shared/ exists).
const std::vector<ReplayPeaks>& other_runs_measured();

// The runs, each with the script's recording window as the measured step: silmont2000
// fp32 and bf16, MAGMA27, and Charan6924 (step.measure whole-run: recording starts
// before the first forward).
std::vector<RealRun> other_real_runs();

}  // namespace memsim
