// Sweeps: one scenario evaluated at many override points (memsim sweep), in parallel.
//
// Contract:
//  - A SweepRunner holds the scenario file's text (read once) and the base overrides;
//    evaluate() loads the scenario with base + point overrides, builds the Program,
//    executes it on a fresh allocator and device (the capacity semantics of
//    tools/cli/device.h) and analyzes it. It is const and thread-safe: every call owns
//    its allocator and device, and its Program and parsed scenario are the caller's
//    SweepWorkspace (one per thread) or the call's own.
//  - A SweepWorkspace is one worker's reusable state: the scenario parsed once
//    (scenario/parsed_scenario.h: overrides are applied to the parsed document, with the
//    errors and results of a fresh load) and the Program / allocator arrays of its last
//    point (storage only: no result depends on what a workspace evaluated before).
//  - A point whose overrides make the scenario impossible (ScenarioError, or any other
//    std::exception from building it) is a result with ok = false and the message; the
//    sweep carries on.
//  - run_parallel() and worker_count(): sim/search/workers.h (threads 0 = the -j default,
//    all cores unless set).
//  - find_max() finds the largest integer value of one key that fits, assuming that
//    fitting is monotone in it (more batch or sequence never uses less memory): probes
//    1, 2, 4, ... until a value fails (does not fit, or is an impossible scenario), then
//    bisects between the last fit and the first failure. O(log v) evaluations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <memory>

#include "scenario/parsed_scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "sim/search/workers.h"

namespace memsim {

using SweepOverrides = std::vector<std::pair<std::string, std::string>>;

struct SweepAxis {
  std::string key;                  // scenario key, e.g. "batch.micro_batch"
  std::vector<std::string> values;  // as given on the command line
};

// Parses "KEY=V1,V2,..." where each item is a value, an inclusive integer range A..B, or
// A..B..STEP (A, A+STEP, ... up to B, as bash's {A..B..STEP}).
// Throws std::invalid_argument with a message naming the argument when malformed.
SweepAxis parse_sweep_axis(const std::string& arg);

// The cartesian product of the axes: one override list per point, the first axis
// varying slowest. No axes gives one empty point.
std::vector<SweepOverrides> sweep_points(const std::vector<SweepAxis>& axes);

struct SweepResult {
  bool ok = false;     // false: the point's scenario is impossible (see error)
  std::string error;
  Analysis analysis;   // valid when ok
  bool fits() const { return ok && analysis.fits(); }
};

struct SweepEvaluateOptions {
  // Per-kind timeline arrays: off by default, a sweep only needs peaks and the verdict.
  bool record_by_kind = false;
  AnalysisOptions analysis;
  // Stream the point's events into the allocator and stop building at its first OOM
  // (sim/analysis/stream_run.h; issue #20 item 1): the verdict, peaks, breakdown and OOM
  // report are the stored run's; Analysis::events (and FLOPs) count what was built. Not
  // with record_by_kind.
  bool stop_at_oom = true;
  // With stop_at_oom: only the verdict and the OOM report (StreamOptions::verdict_only),
  // for searches that read nothing else (find_max's probes).
  bool verdict_only = false;
  // With stop_at_oom: the allocator on a second thread while the point builds
  // (StreamOptions::pipelined; find_max's probes, whose rounds often leave a core idle).
  bool pipelined = false;
};

class SweepRunner;

// One worker's reusable state (see the contract above). Movable, not shared between threads.
struct SweepWorkspace {
  std::unique_ptr<ParsedScenario> parsed;  // the runner's text, parsed on first use
  const SweepRunner* parsed_for = nullptr; // which runner `parsed` belongs to
  BuildBuffers build;
  ExecuteBuffers exec;

  // The scenario of `overrides` (base + point) for `runner`, parsing its text once.
  Scenario scenario(const SweepRunner& runner, const SweepOverrides& overrides);
};

class SweepRunner {
 public:
  // `text`: the scenario file's contents; `source`: its name in error messages.
  SweepRunner(std::string text, std::string source, SweepOverrides base = {});
  // Reads `path`; throws ScenarioError (file, line, key) when the file or `base` is bad.
  static SweepRunner from_file(const std::string& path, SweepOverrides base = {});

  SweepResult evaluate(const SweepOverrides& point,
                       const SweepEvaluateOptions& options = {}) const;
  // Same result, with `workspace`'s parsed scenario and storage.
  SweepResult evaluate(const SweepOverrides& point, const SweepEvaluateOptions& options,
                       SweepWorkspace& workspace) const;
  const std::string& source() const { return source_; }
  const std::string& text() const { return text_; }
  const SweepOverrides& base() const { return base_; }

 private:
  std::string text_;
  std::string source_;
  SweepOverrides base_;
};

// The execute + analyze half of evaluate(): `program` run on the allocator and device of
// `scenario` (allocator.*, device.capacity, device.cuda_context), `buffers` reused.
Analysis execute_and_analyze(const Program& program, const Scenario& scenario,
                             const SweepEvaluateOptions& options, ExecuteBuffers& buffers);

struct MaxSearch {
  std::optional<int64_t> largest_fit;   // nullopt: not even `start` fits
  std::optional<int64_t> first_failure; // smallest failing value seen; nullopt: none up to `limit`
  std::string failure;                  // why first_failure fails ("OOM at ...", or the error)
  size_t evaluations = 0;
};

MaxSearch find_max(const SweepRunner& runner, const SweepOverrides& fixed, const std::string& key,
                   int64_t start = 1, int64_t limit = int64_t{1} << 40,
                   const SweepEvaluateOptions& options = {});
// Same, evaluating in `workspace`.
MaxSearch find_max(const SweepRunner& runner, const SweepOverrides& fixed, const std::string& key,
                   SweepWorkspace& workspace, int64_t start = 1,
                   int64_t limit = int64_t{1} << 40, const SweepEvaluateOptions& options = {});
// Same, with `workers` threads (workspaces[0 .. workers-1]): each probe is evaluated
// together with the probes that may follow it (speculation), so a search takes about
// log2(workers + 1) times fewer rounds; the probes the search reads, the result and
// `evaluations` (those probes) are those of the one-thread search.
MaxSearch find_max(const SweepRunner& runner, const SweepOverrides& fixed, const std::string& key,
                   SweepWorkspace* workspaces, size_t workers, int64_t start = 1,
                   int64_t limit = int64_t{1} << 40, const SweepEvaluateOptions& options = {});

// "fits", "OOM at OP (PHASE, layer N)" or "error: MESSAGE".
std::string sweep_verdict(const SweepResult& result);

}  // namespace memsim
