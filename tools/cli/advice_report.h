// `memsim run --advise` (issue #19 item 2): the changes memsim can simulate itself
// (sim/search/advice_candidates.h), each one simulated, with its effect.
//
// Contract:
//  - run_advice(candidates, load, threads) loads each candidate's scenario with
//    `load(candidate.sets)` (the caller appends the sets to the run's own --set overrides,
//    so an entry is exactly `memsim run ... --set KEY=VALUE` for its sets), builds its
//    Program as `run` does (build_run_program), executes it on the scenario's device and
//    analyzes it. A candidate whose scenario or Program is refused (ScenarioError,
//    ConfigError or any other std::exception but bad_alloc) is kept with ok = false and
//    the refusal: skipped, never approximated. For a candidate that does not fit, the
//    Program is also executed with unlimited memory (needed_bytes, as oom.needed_bytes).
//    Candidates run on `threads` threads (run_parallel, sim/search/sweep.h; 0 = all cores).
//  - The result is sorted by effect: those that fit first, by peak reserved, then those
//    that do not, by needed bytes; refused ones last, in candidate order (stable).
//  - JSON (advice_json): "advice": [{change, set: {KEY: VALUE}, peak_reserved_bytes,
//    peak_allocated_bytes, fits, needed_bytes (null when it fits), estimated_step_seconds
//    (the time model's total, null when it refuses)}], and "advice_skipped": [{change,
//    set, reason}].
//  - print_advice writes the ADVICE section: every entry (full), or for an OOM without
//    --advise a short one (the first kShortAdvice entries, a line naming --advise);
//    advice_lines gives the same entries as sentences (the HTML report's notes).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "scenario/scenario.h"
#include "sim/analysis/step_time.h"
#include "sim/search/advice_candidates.h"
#include "tools/cli/json_report.h"
#include "tools/cli/overrides.h"
#include "tools/cli/style.h"

namespace memsim::cli {

inline constexpr size_t kShortAdvice = 5;

struct AdviceResult {
  AdviceCandidate candidate;
  bool ok = false;
  std::string refused;  // why it was skipped (ok = false)
  bool fits = false;
  uint64_t peak_allocated = 0;
  uint64_t peak_reserved = 0;
  std::optional<uint64_t> needed;  // does not fit: peak reserved with unlimited memory
  StepTime time;
};

using AdviceLoader = std::function<Scenario(const Overrides& extra)>;

std::vector<AdviceResult> run_advice(const std::vector<AdviceCandidate>& candidates,
                                     const AdviceLoader& load, unsigned threads = 0);

void add_advice_json(Json& run, const std::vector<AdviceResult>& results);

void print_advice(std::FILE* out, const std::vector<AdviceResult>& results, bool full,
                  const Style& style);

// The same entries as print_advice, one plain sentence each, for the HTML report's notes:
// "CHANGE: fits, peak reserved X, step T (--set KEY=VALUE ...)".
std::vector<std::string> advice_lines(const std::vector<AdviceResult>& results, bool full);

}  // namespace memsim::cli
