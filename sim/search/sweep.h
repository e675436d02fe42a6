// Sweeps: one scenario evaluated at many override points (memsim sweep), in parallel.
//
// Contract:
//  - A SweepRunner holds the scenario file's text (read once) and the base overrides;
//    evaluate() loads the scenario with base + point overrides, builds the Program,
//    executes it on a fresh allocator and device (the capacity semantics of
//    tools/cli/device.h) and analyzes it. It is const and thread-safe: every call owns
//    its allocator, device and Program.
//  - A point whose overrides make the scenario impossible (ScenarioError, or any other
//    std::exception from building it) is a result with ok = false and the message; the
//    sweep carries on.
//  - run_parallel() runs `count` independent tasks on `threads` std::threads (0 = all
//    cores), results in task order; `progress` (optional) is called after each task,
//    serialized, with (done, count).
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

#include "sim/analysis/analysis.h"

namespace memsim {

using SweepOverrides = std::vector<std::pair<std::string, std::string>>;

struct SweepAxis {
  std::string key;                  // scenario key, e.g. "batch.micro_batch"
  std::vector<std::string> values;  // as given on the command line
};

// Parses "KEY=V1,V2,..." where each item is a value or an inclusive integer range A..B.
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
};

class SweepRunner {
 public:
  // `text`: the scenario file's contents; `source`: its name in error messages.
  SweepRunner(std::string text, std::string source, SweepOverrides base = {});
  // Reads `path`; throws ScenarioError (file, line, key) when the file or `base` is bad.
  static SweepRunner from_file(const std::string& path, SweepOverrides base = {});

  SweepResult evaluate(const SweepOverrides& point,
                       const SweepEvaluateOptions& options = {}) const;
  const std::string& source() const { return source_; }

 private:
  std::string text_;
  std::string source_;
  SweepOverrides base_;
};

using SweepProgress = std::function<void(size_t done, size_t total)>;

void run_parallel(size_t count, const std::function<void(size_t task)>& task, unsigned threads,
                  const SweepProgress& progress = {});

struct MaxSearch {
  std::optional<int64_t> largest_fit;   // nullopt: not even `start` fits
  std::optional<int64_t> first_failure; // smallest failing value seen; nullopt: none up to `limit`
  std::string failure;                  // why first_failure fails ("OOM at ...", or the error)
  size_t evaluations = 0;
};

MaxSearch find_max(const SweepRunner& runner, const SweepOverrides& fixed, const std::string& key,
                   int64_t start = 1, int64_t limit = int64_t{1} << 40,
                   const SweepEvaluateOptions& options = {});

// "fits", "OOM at OP (PHASE, layer N)" or "error: MESSAGE".
std::string sweep_verdict(const SweepResult& result);

}  // namespace memsim
