#include "sim/search/sweep_grid.h"

#include <mutex>
#include <new>
#include <unordered_map>

#include "sim/step/training_script.h"

namespace memsim {

namespace {

bool is_allocator_key(const std::string& key) { return key.rfind("allocator.", 0) == 0; }

// The part of a point that decides its Program: its overrides of every other key.
std::string program_key(const SweepOverrides& point) {
  std::string k;
  for (const auto& [key, value] : point) {
    if (allocator_only_key(key)) continue;
    k += key;
    k += '\0';
    k += value;
    k += '\0';
  }
  return k;
}

// The allocator.* overrides of a point, which a pipeline scenario's Program depends on.
SweepOverrides allocator_values(const SweepOverrides& point) {
  SweepOverrides out;
  for (const auto& kv : point)
    if (is_allocator_key(kv.first)) out.push_back(kv);
  return out;
}

// Points that share a Program, in point order; split so that `workers` have work.
std::vector<std::vector<size_t>> chunks_of(const std::vector<SweepOverrides>& points,
                                           unsigned workers) {
  std::vector<std::vector<size_t>> groups;
  std::unordered_map<std::string, size_t> group_of;
  for (size_t i = 0; i < points.size(); ++i) {
    const auto [it, added] = group_of.emplace(program_key(points[i]), groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  if (groups.size() >= workers) return groups;
  std::vector<std::vector<size_t>> chunks;
  for (const std::vector<size_t>& g : groups) {
    const size_t pieces = std::min<size_t>(workers, g.size());
    for (size_t p = 0; p < pieces; ++p) {
      const size_t begin = g.size() * p / pieces, end = g.size() * (p + 1) / pieces;
      chunks.emplace_back(g.begin() + static_cast<std::ptrdiff_t>(begin),
                          g.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }
  return chunks;
}

}  // namespace

bool allocator_only_key(const std::string& key) {
  return key == "device.capacity" || key == "device.cuda_context" || is_allocator_key(key);
}

std::vector<SweepResult> evaluate_grid(const SweepRunner& runner,
                                       const std::vector<SweepOverrides>& points,
                                       unsigned threads, const SweepProgress& progress,
                                       const SweepEvaluateOptions& options) {
  std::vector<SweepResult> results(points.size());
  const unsigned workers = worker_count(threads, points.size());
  const std::vector<std::vector<size_t>> chunks = chunks_of(points, workers);
  std::vector<SweepWorkspace> spaces(workers);
  std::mutex progress_mutex;
  size_t done = 0;

  auto run_chunk = [&](size_t c, unsigned worker) {
    SweepWorkspace& ws = spaces[worker];
    const SweepOverrides* built_for = nullptr;  // the point whose Program ws.build holds
    bool pipeline = false;
    for (const size_t i : chunks[c]) {
      SweepResult& r = results[i];
      if (chunks[c].size() == 1) {
        // Nothing to share: the point streams and stops at its first OOM (SweepRunner::evaluate).
        r = runner.evaluate(points[i], options, ws);
        if (progress) {
          std::lock_guard<std::mutex> lock(progress_mutex);
          progress(++done, points.size());
        }
        continue;
      }
      try {
        SweepOverrides overrides = runner.base();
        overrides.insert(overrides.end(), points[i].begin(), points[i].end());
        const Scenario scenario = ws.scenario(runner, overrides);
        if (built_for == nullptr ||
            (pipeline && allocator_values(points[i]) != allocator_values(*built_for))) {
          built_for = nullptr;  // a build that throws leaves nothing reusable
          build_program(scenario, default_script(scenario), ws.build);
          built_for = &points[i];
          pipeline = scenario.parallel.pipeline > 1;
        }
        r.analysis = execute_and_analyze(ws.build.program, scenario, options, ws.exec);
        r.ok = true;
      } catch (const std::bad_alloc&) {
        throw;  // host memory is exhausted: not a property of this point
      } catch (const std::exception& e) {
        r.ok = false;
        r.error = e.what();
      }
      if (progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        progress(++done, points.size());
      }
    }
  };
  run_parallel_workers(chunks.size(), run_chunk, workers);
  return results;
}

}  // namespace memsim
