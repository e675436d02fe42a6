#include "sim/search/sweep.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "scenario/scenario.h"
#include "sim/analysis/stream_run.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "sim/step/training_script.h"

namespace memsim {

namespace {

// The device of tools/cli/device.cpp (make_device), which the sim library cannot link:
// capacity 0 means unlimited (2^60 bytes), the CUDA context is taken off the total.
constexpr uint64_t kUnlimitedDevice = uint64_t{1} << 60;

uint64_t device_total(const DeviceConfig& d) {
  return d.capacity == 0 ? kUnlimitedDevice : d.capacity;
}
uint64_t device_context(const DeviceConfig& d) {
  return d.capacity == 0 ? d.cuda_context : std::min(d.cuda_context, d.capacity);
}

bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty()) return false;
  size_t used = 0;
  try {
    out = std::stoll(s, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == s.size();
}

}  // namespace

SweepAxis parse_sweep_axis(const std::string& arg) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0)
    throw std::invalid_argument("--vary " + arg + ": expected KEY=V1,V2,...");
  SweepAxis axis{arg.substr(0, eq), {}};
  std::stringstream items(arg.substr(eq + 1));
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t dots = item.find("..");
    if (dots == std::string::npos) {
      if (item.empty()) throw std::invalid_argument("--vary " + arg + ": empty value");
      axis.values.push_back(item);
      continue;
    }
    // A..B, or A..B..S (every S-th value from A, as bash's {A..B..S}).
    int64_t a = 0, b = 0, step = 1;
    const size_t dots2 = item.find("..", dots + 2);
    const std::string last =
        item.substr(dots + 2, dots2 == std::string::npos ? std::string::npos : dots2 - dots - 2);
    if (!parse_int(item.substr(0, dots), a) || !parse_int(last, b) || b < a ||
        (dots2 != std::string::npos && (!parse_int(item.substr(dots2 + 2), step) || step < 1)))
      throw std::invalid_argument("--vary " + arg + ": '" + item +
                                  "' is not an integer range A..B or A..B..STEP with A <= B, STEP >= 1");
    if ((b - a) / step >= 1'000'000)
      throw std::invalid_argument("--vary " + arg + ": range '" + item + "' is too long");
    for (int64_t v = a; v <= b; v += step) {
      axis.values.push_back(std::to_string(v));
      if (b - v < step) break;  // no overflow past B
    }
  }
  if (axis.values.empty()) throw std::invalid_argument("--vary " + arg + ": no values");
  return axis;
}

std::vector<SweepOverrides> sweep_points(const std::vector<SweepAxis>& axes) {
  std::vector<SweepOverrides> points{{}};
  for (const SweepAxis& axis : axes) {
    std::vector<SweepOverrides> next;
    next.reserve(points.size() * axis.values.size());
    for (const SweepOverrides& p : points)
      for (const std::string& v : axis.values) {
        next.push_back(p);
        next.back().emplace_back(axis.key, v);
      }
    points = std::move(next);
  }
  return points;
}

SweepRunner::SweepRunner(std::string text, std::string source, SweepOverrides base)
    : text_(std::move(text)), source_(std::move(source)), base_(std::move(base)) {}

SweepRunner SweepRunner::from_file(const std::string& path, SweepOverrides base) {
  // Loading it once first gives the loader's own errors (file, line, key) for a bad file
  // or a bad --set, before any point runs.
  load_scenario(path, base);
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || in.bad()) throw ScenarioError(path + ":1: (file): cannot read the scenario file");
  return SweepRunner(text.str(), path, std::move(base));
}

Scenario SweepWorkspace::scenario(const SweepRunner& runner, const SweepOverrides& overrides) {
  if (!parsed || parsed_for != &runner) {
    parsed = std::make_unique<ParsedScenario>(runner.text(), runner.source());
    parsed_for = &runner;
  }
  return parsed->with(overrides);
}

SweepResult SweepRunner::evaluate(const SweepOverrides& point,
                                  const SweepEvaluateOptions& options) const {
  SweepWorkspace workspace;
  return evaluate(point, options, workspace);
}

SweepResult SweepRunner::evaluate(const SweepOverrides& point, const SweepEvaluateOptions& options,
                                  SweepWorkspace& ws) const {
  SweepResult result;
  try {
    SweepOverrides overrides = base_;
    overrides.insert(overrides.end(), point.begin(), point.end());
    const Scenario scenario = ws.scenario(*this, overrides);
    if (options.stop_at_oom && !options.record_by_kind) {
      // Most points of a grid run out of memory within their first events: streamed, the
      // build stops there instead of emitting the whole step.
      SimulatedDevice device(device_total(scenario.device), device_context(scenario.device));
      StreamOptions stream;
      stream.analysis = options.analysis;
      stream.stop_at_oom = true;
      stream.verdict_only = options.verdict_only;
      stream.pipelined = options.pipelined;
      const TrainingScript script = default_script(scenario);
      StreamResult r = stream_run(
          ws.build.program, [&](Program&) { build_program(scenario, script, ws.build); },
          scenario.allocator, device, stream);
      result.analysis = std::move(r.analysis);
    } else {
      const Program& program = build_program(scenario, default_script(scenario), ws.build);
      result.analysis = execute_and_analyze(program, scenario, options, ws.exec);
    }
    result.ok = true;
  } catch (const std::bad_alloc&) {
    throw;  // host memory is exhausted: not a property of this point
  } catch (const std::exception& e) {
    // ScenarioError (an impossible combination), or a family the builder rejects.
    result.ok = false;
    result.error = e.what();
  }
  return result;
}

Analysis execute_and_analyze(const Program& program, const Scenario& scenario,
                             const SweepEvaluateOptions& options, ExecuteBuffers& buffers) {
  SimulatedDevice device(device_total(scenario.device), device_context(scenario.device));
  ExecuteOptions exec;
  exec.record_by_kind = options.record_by_kind;
  exec.buffers = &buffers;
  const Timeline& timeline = buffers.timeline =
      execute(program, scenario.allocator, device, exec);
  return analyze(program, timeline, options.analysis);
}

std::string sweep_verdict(const SweepResult& r) {
  if (!r.ok) return "error: " + r.error;
  if (r.analysis.fits()) return "fits";
  const OomReport& o = *r.analysis.oom;
  std::string s = "OOM at " + o.op + " (" + to_string(o.phase);
  if (o.layer >= 0) s += ", layer " + std::to_string(o.layer);
  return s + ")";
}

namespace {

// find_max's search as a state machine, so that the probes it may ask for next are known
// ahead (speculation) while the probes it does ask for stay those of the plain loop:
// doubling from `start` while values fit, then bisecting between the last fit (lo) and the
// first failure (hi).
struct MaxState {
  bool bisect = false;
  bool done = false;
  int64_t lo = 0;  // largest value known to fit (start - 1: none yet)
  int64_t hi = 0;  // the doubling phase's next probe; in bisection the smallest failure
};

int64_t probe_of(const MaxState& s) { return s.bisect ? s.lo + (s.hi - s.lo) / 2 : s.hi; }

MaxState step(MaxState s, bool fit, int64_t limit) {
  if (!s.bisect) {
    if (fit) {
      s.lo = s.hi;
      if (s.hi > limit / 2) {  // doubling would pass the limit (or overflow): no failure
        s.done = true;
        return s;
      }
      s.hi *= 2;
      s.done = s.hi > limit;
      return s;
    }
    s.bisect = true;  // hi fails: bisect between lo and hi
  } else {
    const int64_t mid = probe_of(s);
    (fit ? s.lo : s.hi) = mid;
  }
  s.done = s.hi - s.lo <= 1;
  return s;
}

}  // namespace

MaxSearch find_max(const SweepRunner& runner, const SweepOverrides& fixed, const std::string& key,
                   int64_t start, int64_t limit, const SweepEvaluateOptions& options) {
  SweepWorkspace workspace;
  return find_max(runner, fixed, key, &workspace, 1, start, limit, options);
}

MaxSearch find_max(const SweepRunner& runner, const SweepOverrides& fixed, const std::string& key,
                   SweepWorkspace& workspace, int64_t start, int64_t limit,
                   const SweepEvaluateOptions& options) {
  return find_max(runner, fixed, key, &workspace, 1, start, limit, options);
}

MaxSearch find_max(const SweepRunner& runner, const SweepOverrides& fixed, const std::string& key,
                   SweepWorkspace* workspaces, size_t workers, int64_t start, int64_t limit,
                   const SweepEvaluateOptions& options) {
  MaxSearch out;
  if (start > limit) return out;
  workers = std::max<size_t>(workers, 1);
  std::map<int64_t, SweepResult> known;  // evaluated values, the search's and speculative
  // The search reads verdicts only (fits(), sweep_verdict()): no probe summarises its live
  // set or follows its peaks.
  SweepEvaluateOptions probe_options = options;
  probe_options.analysis.live_set = false;
  probe_options.verdict_only = true;
  // A round's probes seldom keep every core busy (a probe that fails stops early; the last
  // round has one probe): each builds on one thread and executes on another.
  probe_options.pipelined = true;
  auto evaluate = [&](int64_t v, SweepWorkspace& ws) {
    SweepOverrides point = fixed;
    point.emplace_back(key, std::to_string(v));
    return runner.evaluate(point, probe_options, ws);
  };
  MaxState s;
  s.lo = start - 1;
  s.hi = start;
  while (!s.done) {
    const int64_t v = probe_of(s);
    if (known.find(v) == known.end()) {
      // This probe, and with more workers the probes that may follow it (breadth first,
      // the "fits" branch first), evaluated at once. Results do not depend on it: only the
      // probes the search asks for are read and counted.
      std::vector<int64_t> batch{v};
      std::vector<MaxState> frontier{s};
      for (size_t f = 0; f < frontier.size() && batch.size() < workers; ++f) {
        for (const bool fit : {true, false}) {
          const MaxState next = step(frontier[f], fit, limit);
          if (next.done || batch.size() >= workers) continue;
          const int64_t w = probe_of(next);
          if (known.count(w) || std::find(batch.begin(), batch.end(), w) != batch.end()) continue;
          batch.push_back(w);
          frontier.push_back(next);
        }
      }
      std::vector<SweepResult> results(batch.size());
      if (batch.size() == 1) {
        results[0] = evaluate(v, workspaces[0]);
      } else {
        run_parallel_workers(
            batch.size(),
            [&](size_t i, unsigned w) { results[i] = evaluate(batch[i], workspaces[w]); },
            static_cast<unsigned>(batch.size()));
      }
      for (size_t i = 0; i < batch.size(); ++i) known.emplace(batch[i], std::move(results[i]));
    }
    const SweepResult& r = known.at(v);
    ++out.evaluations;
    if (!r.fits() && (!out.first_failure || v < *out.first_failure)) {
      out.first_failure = v;
      out.failure = sweep_verdict(r);
    }
    s = step(s, r.fits(), limit);
  }
  if (s.lo >= start) out.largest_fit = s.lo;
  return out;
}

}  // namespace memsim
