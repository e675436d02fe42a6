#include "sim/search/optimize.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <exception>
#include <memory>

#include "allocator/caching_allocator.h"
#include "sim/analysis/headroom.h"
#include "sim/analysis/stream_run.h"
#include "sim/search/named_policies.h"
#include "sim/search/optimize_pipeline.h"
#include "sim/search/workers.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"

namespace memsim {

using graph::CheckpointPlan;
using graph::LayerCheckpoint;

namespace {

constexpr int64_t kNone = INT64_MIN;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The allocator never hands out less than the request rounded up to 512 bytes, so sums
// of these are a lower bound of allocated (and reserved) bytes.
int64_t rounded(uint64_t bytes) {
  if (bytes == 0) return 0;
  return static_cast<int64_t>(bytes < 512 ? 512 : (bytes + 511) / 512 * 512);
}

// What one calibration Program says (see the header, step 1).
struct Windows {
  std::vector<int64_t> stored, fwd, bwd, gap;
};

Windows windows_of(const Program& p, int32_t layers) {
  Windows w;
  w.stored.assign(layers, 0);
  w.fwd.assign(layers, kNone);
  w.bwd.assign(layers, kNone);
  w.gap.assign(layers + 1, kNone);
  size_t begin = 0, fwd_end = SIZE_MAX;
  bool begun = false;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type != EventType::mark) continue;
    const std::string& name = p.str(static_cast<uint32_t>(e.bytes));
    if (!begun && name == "measured_step_begin") {
      begin = i;
      begun = true;
    }
    if (name == "forward_end") fwd_end = i;  // the last one: the last micro-batch's
  }
  std::vector<int32_t> alloc_layer(p.tensors.size(), -1);
  std::vector<uint8_t> alive(p.tensors.size(), 0);
  int64_t live = 0;
  enum { none, in_fwd, in_bwd } last = none;
  int32_t last_layer = -1;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc) {
      live += rounded(e.bytes);
      alive[e.tensor] = 1;
      alloc_layer[e.tensor] = (i >= begin && e.phase == Phase::forward) ? e.layer : -1;
    } else if (e.type == EventType::free) {
      live -= rounded(p.tensors[e.tensor].bytes);
      alive[e.tensor] = 0;
    } else {
      if (i == fwd_end) {
        for (size_t t = 0; t < p.tensors.size(); ++t)
          if (alive[t] && alloc_layer[t] >= 0 && alloc_layer[t] < layers)
            w.stored[alloc_layer[t]] += rounded(p.tensors[t].bytes);
      }
      continue;
    }
    if (i < begin) continue;
    const bool layered = e.layer >= 0 && e.layer < layers;
    if (layered && e.phase == Phase::forward) {
      w.fwd[e.layer] = std::max(w.fwd[e.layer], live);
      last = in_fwd;
      last_layer = e.layer;
    } else if (layered && e.phase == Phase::backward) {
      w.bwd[e.layer] = std::max(w.bwd[e.layer], live);
      last = in_bwd;
      last_layer = e.layer;
    } else {
      // Between layers: layers 0..k-1 hold their stored bytes.
      const int32_t k = last == in_fwd ? last_layer + 1 : last == in_bwd ? last_layer : 0;
      w.gap[k] = std::max(w.gap[k], live);
    }
  }
  return w;
}

CheckpointPlan uniform_plan(int32_t layers, LayerCheckpoint c) {
  CheckpointPlan plan;
  plan.layers.assign(static_cast<size_t>(layers), c);
  return plan;
}

// The scenario with `plan` as its checkpoint section. The scenario's own
// checkpoint.reentrant stays: it changes what a checkpointed region holds (a reentrant
// re-run keeps its output alive through the region's backward), so plans must be
// calibrated and verified the way the user's script calls torch.utils.checkpoint.
Scenario with_plan(const Scenario& s, const CheckpointPlan& plan) {
  Scenario out = s;
  out.checkpoint = with_call_of(config_for_plan(plan), s.checkpoint);
  return out;
}

}  // namespace

namespace {

// Builds and runs the Programs of one scenario's plans, reusing storage from one to the
// next (results are those of build_program + execute + analyze on fresh storage).
class PlanSimulator {
 public:
  PlanSimulator(const Scenario& scenario, const TrainingScript& script)
      : scenario_(scenario), script_(script) {}

  // The Program of `plan`; valid until the next build or run.
  const Program& build(const CheckpointPlan& plan) {
    return build_program(with_plan(scenario_, plan), script_, build_);
  }
  // Builds and executes `plan` on an allocator that may use `capacity` bytes (0 =
  // unlimited); true when it runs without running out of memory (Analysis::fits).
  // stop_at_oom (issue #20): the build stops at the first out-of-memory
  // (sim/analysis/stream_run.h), so a plan that does not fit costs only the events up to
  // its failure; result() then has the verdict, the OOM point and the peaks before it, but
  // Analysis::events and FLOPs only of what was built. Every caller that reads result()
  // after a failing run asks for the whole run (simulate_plan).
  bool run(const CheckpointPlan& plan, uint64_t capacity, bool stop_at_oom = true) {
    return stream_last(with_plan(scenario_, plan), capacity, stop_at_oom);
  }
  // Same for a checkpoint config as the scenario would spell it (a named policy: its
  // segments of several layers have no per-layer plan spelling). The scenario's
  // checkpoint.reentrant and early_stop stay, as in with_plan.
  bool run_config(const CheckpointConfig& config, uint64_t capacity) {
    Scenario s = scenario_;
    s.checkpoint = with_call_of(config, scenario_.checkpoint);
    return stream_last(s, capacity, true);
  }
  // Another simulator of the same scenario and script, with storage of its own (for a
  // second worker thread).
  std::unique_ptr<PlanSimulator> fresh() const {
    return std::make_unique<PlanSimulator>(scenario_, script_);
  }
  // The last run, analysed (only runs that are reported need this).
  PlanRun result() const { return last_; }

 private:
  // Streamed (sim/analysis/stream_run.h): the analysis is analyze(execute(...))'s field for
  // field, without the per-event arrays (tests/test_stream_run.cpp); verification needs
  // peaks and the verdict, and the breakdown at the peak.
  bool stream_last(const Scenario& s, uint64_t capacity, bool stop_at_oom) {
    SimulatedDevice device(capacity == 0 ? unlimited_capacity(scenario_.allocator) : capacity, 0);
    StreamOptions options;
    options.stop_at_oom = stop_at_oom;
    StreamResult r = stream_run(
        build_.program, [&](Program&) { build_program(s, script_, build_); }, scenario_.allocator,
        device, options);
    last_ = PlanRun{std::move(r.analysis), r.final_stats};
    return !last_.analysis.oom.has_value();
  }

  const Scenario& scenario_;
  const TrainingScript& script_;
  BuildBuffers build_;
  PlanRun last_;
};

LayerCosts calibrate_with(PlanSimulator& sim, const Scenario& scenario,
                          const std::vector<LayerCheckpoint>& choices) {
  LayerCosts c;
  c.layers = static_cast<int32_t>(scenario.model.layers);
  c.choices = choices;
  // Gaps come from the keep Program (any choice would do: gaps differ only by what the
  // layers store).
  const size_t found = static_cast<size_t>(
      std::find(choices.begin(), choices.end(), LayerCheckpoint::keep) - choices.begin());
  const size_t ref = found < choices.size() ? found : 0;
  Windows keep;
  // One calibration Program per choice, each independent of the others: built and scanned
  // on the -j workers (sim/search/workers.h), worker 0 with the caller's simulator (its
  // storage then serves the verifying runs); assembled below in choice order.
  struct Measured {
    Windows w;
    double recompute = 0;
  };
  std::vector<Measured> measured(choices.size());
  std::vector<std::unique_ptr<PlanSimulator>> others(worker_count(0, choices.size()));
  std::vector<std::exception_ptr> failures(choices.size());
  run_parallel_workers(
      choices.size(),
      [&](size_t i, unsigned worker) {
        try {
          if (worker > 0 && !others[worker]) others[worker] = sim.fresh();
          PlanSimulator& mine = worker == 0 ? sim : *others[worker];
          const Program& p = mine.build(uniform_plan(c.layers, choices[i]));
          measured[i] = {windows_of(p, c.layers), p.flops.recompute};
        } catch (...) {
          failures[i] = std::current_exception();
        }
      },
      static_cast<unsigned>(others.size()));
  for (const std::exception_ptr& f : failures)  // the first in choice order, as a loop raises
    if (f) std::rethrow_exception(f);
  for (Measured& m : measured) {
    Windows w = std::move(m.w);
    std::vector<int64_t> window(c.layers, kNone);
    int64_t prefix = 0;
    for (int32_t l = 0; l < c.layers; ++l) {
      const int64_t peak = std::max(w.fwd[l], w.bwd[l]);
      if (peak != kNone) window[l] = peak - prefix;
      prefix += w.stored[l];
    }
    c.stored.push_back(w.stored);
    c.window.push_back(std::move(window));
    c.flops.push_back(c.layers > 0 ? std::llround(m.recompute / c.layers) : 0);
    if (c.stored.size() == ref + 1) keep = std::move(w);
  }
  c.gap.assign(c.layers + 1, kNone);
  int64_t prefix = 0;
  for (int32_t k = 0; k <= c.layers; ++k) {
    if (keep.gap[k] != kNone) c.gap[k] = keep.gap[k] - prefix;
    if (k < c.layers) prefix += c.stored[ref][k];
  }
  return c;
}

}  // namespace

LayerCosts calibrate(const Scenario& scenario, const TrainingScript& script,
                     const std::vector<LayerCheckpoint>& choices) {
  PlanSimulator sim(scenario, script);
  return calibrate_with(sim, scenario, choices);
}

int64_t model_peak(const LayerCosts& c, const CheckpointPlan& plan) {
  int64_t peak = kNone, stored = 0;
  for (int32_t l = 0; l <= c.layers; ++l) {
    if (c.gap[l] != kNone) peak = std::max(peak, stored + c.gap[l]);
    if (l == c.layers) break;
    const size_t ci = static_cast<size_t>(
        std::find(c.choices.begin(), c.choices.end(), plan.at(l)) - c.choices.begin());
    if (c.window[ci][l] != kNone) peak = std::max(peak, stored + c.window[ci][l]);
    stored += c.stored[ci][l];
  }
  return peak;
}

SearchResult search_plan(const LayerCosts& c, int64_t bound) {
  struct State {
    int64_t stored, recompute, peak;
    int32_t parent;
    uint8_t choice;
  };
  std::vector<std::vector<State>> levels(static_cast<size_t>(c.layers) + 1);
  levels[0].push_back({0, 0, kNone, -1, 0});
  std::vector<State> cand;       // one layer's candidates, before pruning
  std::vector<uint32_t> order;   // cand sorted, as indices
  for (int32_t l = 0; l < c.layers; ++l) {
    std::vector<State>& next = levels[l + 1];
    const std::vector<State>& cur = levels[l];
    cand.clear();
    for (size_t i = 0; i < cur.size(); ++i) {
      const State& s = cur[i];
      int64_t peak = s.peak;
      if (c.gap[l] != kNone) {
        if (s.stored + c.gap[l] > bound) continue;
        peak = std::max(peak, s.stored + c.gap[l]);
      }
      for (size_t k = 0; k < c.choices.size(); ++k) {
        const int64_t w = c.window[k][l];
        if (w != kNone && s.stored + w > bound) continue;
        cand.push_back({s.stored + c.stored[k][l], s.recompute + c.flops[k],
                        w == kNone ? peak : std::max(peak, s.stored + w),
                        static_cast<int32_t>(i), static_cast<uint8_t>(k)});
      }
    }
    // Pareto front on (stored, recompute); equal pairs keep the lower peak. Sorting
    // 4-byte indices instead of the 32-byte states is cheaper. Full ties are broken by
    // candidate index, so the order is total and the plan picked among modelled equals
    // does not depend on the standard library's (unstable) sort.
    order.resize(cand.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
    std::sort(order.begin(), order.end(), [&cand](uint32_t ia, uint32_t ib) {
      const State& a = cand[ia];
      const State& b = cand[ib];
      if (a.stored != b.stored) return a.stored < b.stored;
      if (a.recompute != b.recompute) return a.recompute < b.recompute;
      if (a.peak != b.peak) return a.peak < b.peak;
      return ia < ib;
    });
    int64_t best = INT64_MAX;
    for (uint32_t i : order) {
      const State& s = cand[i];
      if (s.recompute >= best) continue;
      best = s.recompute;
      next.push_back(s);
    }
    if (next.empty()) return {};
  }
  SearchResult r;
  int32_t pick = -1;
  for (size_t i = 0; i < levels[c.layers].size(); ++i) {
    const State& s = levels[c.layers][i];
    int64_t peak = s.peak;
    if (c.gap[c.layers] != kNone) {
      if (s.stored + c.gap[c.layers] > bound) continue;
      peak = std::max(peak, s.stored + c.gap[c.layers]);
    }
    if (pick < 0 || s.recompute < r.recompute || (s.recompute == r.recompute && peak < r.peak)) {
      pick = static_cast<int32_t>(i);
      r.recompute = s.recompute;
      r.peak = peak;
    }
  }
  if (pick < 0) return {};
  r.feasible = true;
  r.plan.layers.assign(static_cast<size_t>(c.layers), LayerCheckpoint::keep);
  for (int32_t l = c.layers; l > 0; --l) {
    const State& s = levels[l][pick];
    r.plan.layers[l - 1] = c.choices[s.choice];
    pick = s.parent;
  }
  return r;
}

SearchResult smallest_peak_plan(const LayerCosts& c) {
  return smallest_peak_by_bisection(
      [&c](int64_t bound) { return search_plan(c, bound); });
}

namespace {

// The exact phase of optimize_checkpointing: all plans whose modelled peak is within the
// bound, level by level of recompute FLOPs (ascending), each level's plans by modelled
// peak. Only for models small enough to enumerate (see kMaxSums, kMaxPlansPerLevel).
class LevelEnumerator {
 public:
  static constexpr size_t kMaxSums = 4096;          // distinct suffix recompute sums
  static constexpr size_t kMaxPlansPerLevel = 4096;
  // Search nodes over all levels: prefixes that reach a recompute total only by breaking
  // the bound are pruned late, so the walk can blow up on long chains; then give up.
  // 2^18 nodes cost ~8 ms; the enumerations that complete need far fewer (with 2^21, on
  // 66 optimisations of 8 to 20 layers over three families, every one either completed
  // under 2^18 or overflowed, after up to 60 ms for nothing).
  static constexpr size_t kMaxNodes = size_t{1} << 18;

  LevelEnumerator(const LayerCosts& c, int64_t bound) : c_(c), bound_(bound) {
    const int32_t L = c.layers;
    best_.assign(L + 1, kNone);
    sums_.assign(L + 1, {});
    best_[L] = c.gap[L];
    sums_[L] = {0};
    for (int32_t l = L - 1; l >= 0; --l) {
      int64_t best = INT64_MAX;
      std::vector<int64_t> sums;
      for (size_t k = 0; k < c.choices.size(); ++k) {
        int64_t m = std::max(c.gap[l], c.window[k][l]);
        if (best_[l + 1] != kNone) m = std::max(m, c.stored[k][l] + best_[l + 1]);
        best = std::min(best, m);
        for (int64_t r : sums_[l + 1]) sums.push_back(r + c.flops[k]);
      }
      std::sort(sums.begin(), sums.end());
      sums.erase(std::unique(sums.begin(), sums.end()), sums.end());
      if (sums.size() > kMaxSums) {
        usable_ = false;
        return;
      }
      best_[l] = best;
      sums_[l] = std::move(sums);
    }
  }
  bool usable() const { return usable_; }
  // Recompute totals that some plan reaches, ascending (memory not yet checked).
  const std::vector<int64_t>& levels() const { return sums_[0]; }

  // Plans with recompute exactly r and modelled peak <= bound, lowest peak first.
  std::vector<std::pair<int64_t, CheckpointPlan>> plans(int64_t r) {
    out_.clear();
    current_.layers.assign(static_cast<size_t>(c_.layers), LayerCheckpoint::keep);
    overflow_ = false;
    dfs(0, 0, 0, kNone, r);
    // Stable: plans of equal peak stay in search order (deterministic across libraries).
    std::stable_sort(out_.begin(), out_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    return std::move(out_);
  }
  bool overflowed() const { return overflow_; }

 private:
  void dfs(int32_t l, int64_t stored, int64_t rec, int64_t peak, int64_t target) {
    if (overflow_) return;
    if (++nodes_ > kMaxNodes) {
      overflow_ = true;
      return;
    }
    if (c_.gap[l] != kNone) {
      if (stored + c_.gap[l] > bound_) return;
      peak = std::max(peak, stored + c_.gap[l]);
    }
    if (l == c_.layers) {
      if (rec != target) return;
      if (out_.size() >= kMaxPlansPerLevel) {
        overflow_ = true;
        return;
      }
      out_.emplace_back(peak, current_);
      return;
    }
    for (size_t k = 0; k < c_.choices.size(); ++k) {
      const int64_t rest = target - rec - c_.flops[k];
      const auto& next = sums_[l + 1];
      if (!std::binary_search(next.begin(), next.end(), rest)) continue;
      const int64_t w = c_.window[k][l];
      if (w != kNone && stored + w > bound_) continue;
      const int64_t s = stored + c_.stored[k][l];
      if (best_[l + 1] != kNone && s + best_[l + 1] > bound_) continue;
      current_.layers[l] = c_.choices[k];
      dfs(l + 1, s, rec + c_.flops[k], w == kNone ? peak : std::max(peak, stored + w), target);
    }
  }

  const LayerCosts& c_;
  int64_t bound_;
  bool usable_ = true;
  bool overflow_ = false;
  size_t nodes_ = 0;
  std::vector<int64_t> best_;               // least peak a suffix adds to its stored prefix
  std::vector<std::vector<int64_t>> sums_;  // recompute totals a suffix can reach
  CheckpointPlan current_;
  std::vector<std::pair<int64_t, CheckpointPlan>> out_;
};

}  // namespace

uint64_t unlimited_capacity(const AllocatorConfig& allocator) {
  return unlimited_device_bytes(allocator);  // sim/analysis/headroom.h
}

PlanRun simulate_plan(const Scenario& scenario, const TrainingScript& script,
                      const CheckpointPlan& plan, uint64_t capacity) {
  PlanSimulator sim(scenario, script);
  sim.run(plan, capacity, /*stop_at_oom=*/false);  // reported as it is, OOM or not
  return sim.result();
}

namespace {

// Nothing fits: the plan with the smallest modelled peak, simulated without a limit.
OptimizeResult report_smallest(OptimizeResult out, const LayerCosts& costs, PlanSimulator& sim) {
  auto ts = std::chrono::steady_clock::now();
  const SearchResult smallest = smallest_peak_plan(costs);
  out.search_ms += ms_since(ts);
  out.fits = false;
  out.plan = smallest.plan;
  out.model_peak = smallest.peak;
  auto tv = std::chrono::steady_clock::now();
  sim.run(smallest.plan, 0);
  out.run = sim.result();
  out.verify_ms += ms_since(tv);
  return out;
}

}  // namespace

namespace {

// Steps 2 and 3 of the header (with the exact phase), then report_smallest when nothing fits.
OptimizeResult search_one_gpu(PlanSimulator& sim, const LayerCosts& costs, uint64_t budget,
                              const OptimizeOptions& options) {
  OptimizeResult out;
  int64_t bound = static_cast<int64_t>(std::min<uint64_t>(budget, INT64_MAX / 4));
  // Exact phase (small models): every plan the model allows, in recompute order. The
  // model's peak is a lower bound of the reserved peak, so no skipped plan could fit.
  int exact_tries = 0;
  auto ts0 = std::chrono::steady_clock::now();
  const SearchResult first = search_plan(costs, bound);
  out.search_ms += ms_since(ts0);
  if (costs.layers <= options.exact_max_layers) {
    auto ts = std::chrono::steady_clock::now();
    LevelEnumerator levels(costs, bound);
    out.search_ms += ms_since(ts);
    bool complete = levels.usable() && first.feasible;
    for (size_t i = 0; complete && i < levels.levels().size(); ++i) {
      const int64_t r = levels.levels()[i];
      if (r < first.recompute) continue;  // the DP proved nothing cheaper fits the model
      ts = std::chrono::steady_clock::now();
      const auto plans = levels.plans(r);
      out.search_ms += ms_since(ts);
      if (levels.overflowed()) complete = false;
      for (size_t k = 0; complete && k < plans.size(); ++k) {
        if (exact_tries >= options.max_verifications) {
          complete = false;
          break;
        }
        auto tv = std::chrono::steady_clock::now();
        const bool fits = sim.run(plans[k].second, budget);
        if (fits) out.run = sim.result();
        out.verify_ms += ms_since(tv);
        ++exact_tries;
        ++out.verifications;
        if (fits) {
          out.fits = true;
          out.plan = plans[k].second;
          out.model_peak = plans[k].first;
          return out;
        }
      }
    }
    // Every plan the model allows was simulated and none fits.
    if (complete && first.feasible) return report_smallest(std::move(out), costs, sim);
  }
  // Front walk (large models, or the exact phase gave up). `bound` is still the budget
  // here: the exact phase does not move it.
  // The first candidate is the DP's answer for the budget itself (already searched).
  bool first_candidate = true;
  while (out.verifications - exact_tries < options.max_verifications) {
    auto ts = std::chrono::steady_clock::now();
    const SearchResult r = first_candidate ? first : search_plan(costs, bound);
    first_candidate = false;
    out.search_ms += ms_since(ts);
    if (!r.feasible) break;
    auto tv = std::chrono::steady_clock::now();
    ++out.verifications;
    if (sim.run(r.plan, budget)) {
      out.run = sim.result();
      out.verify_ms += ms_since(tv);
      out.fits = true;
      out.plan = r.plan;
      out.model_peak = r.peak;
      return out;
    }
    // Does not fit: the next candidate must have a lower modelled peak.
    int64_t step = 1;
    if (out.verifications - exact_tries > options.exact_steps) {
      sim.run(r.plan, 0);
      step = std::max<int64_t>(1, static_cast<int64_t>(sim.result().analysis.peak_reserved) -
                                      static_cast<int64_t>(budget));
    }
    out.verify_ms += ms_since(tv);
    bound = r.peak - step;
  }
  return report_smallest(std::move(out), costs, sim);
}

// The modelled recompute of a plan of calibrated per-layer choices.
int64_t model_recompute(const LayerCosts& c, const CheckpointPlan& plan) {
  int64_t sum = 0;
  for (int32_t l = 0; l < c.layers; ++l)
    sum += c.flops[static_cast<size_t>(
        std::find(c.choices.begin(), c.choices.end(), plan.at(l)) - c.choices.begin())];
  return sum;
}

// Steps 4 and 5 of the header.
void try_named_policies(OptimizeResult& out, PlanSimulator& sim, const LayerCosts& costs,
                        uint64_t budget, const OptimizeOptions& options) {
  const std::vector<NamedPolicy> named = named_policies(costs.layers, options.choices);
  const size_t layer_choice = static_cast<size_t>(
      std::find(costs.choices.begin(), costs.choices.end(), LayerCheckpoint::layer) -
      costs.choices.begin());
  // What full recomputes: a segment of several layers re-runs at least each of its layers
  // (only its last layer's re-run may stop early), so uniform:K and sqrt never recompute less.
  const int64_t full = layer_choice < costs.choices.size()
                           ? costs.flops[layer_choice] * costs.layers
                           : INT64_MAX;
  const int64_t limit = static_cast<int64_t>(std::min<uint64_t>(budget, INT64_MAX / 4));
  int64_t answer = out.fits ? model_recompute(costs, out.plan) : INT64_MAX;
  auto tv = std::chrono::steady_clock::now();
  for (const NamedPolicy& p : named) {
    const int64_t recompute = p.per_layer ? model_recompute(costs, p.plan) : full;
    if (out.fits && (p.per_layer ? recompute >= answer : answer < full)) continue;
    int64_t peak = 0;
    if (p.per_layer) {
      peak = model_peak(costs, p.plan);  // a lower bound of its reserved peak
      if (peak > limit) continue;
    }
    ++out.verifications;
    if (!sim.run_config(p.config, budget)) continue;
    PlanRun r = sim.result();
    if (out.fits && r.analysis.flops.recompute >= out.run.analysis.flops.recompute) continue;
    out.fits = true;
    out.plan = p.plan;
    out.checkpoint = p.config;
    out.named_policy = p.spec;
    out.model_peak = peak;
    out.run = std::move(r);
    answer = recompute;
  }
  if (!out.fits) {
    // Nothing fits: the smallest reserved peak among the smallest modelled plan (already
    // simulated without a limit by report_smallest) and the uniform named policies.
    for (const NamedPolicy& p : named) {
      if (!p.uniform) continue;
      ++out.verifications;
      sim.run_config(p.config, 0);
      PlanRun r = sim.result();
      if (r.analysis.peak_reserved >= out.run.analysis.peak_reserved) continue;
      out.plan = p.plan;
      out.checkpoint = p.config;
      out.named_policy = p.spec;
      out.model_peak = p.per_layer ? model_peak(costs, p.plan) : 0;
      out.run = std::move(r);
    }
  }
  out.verify_ms += ms_since(tv);
}

OptimizeResult optimize_one_gpu(const Scenario& scenario, const TrainingScript& script,
                                uint64_t budget, const OptimizeOptions& options) {
  PlanSimulator sim(scenario, script);
  auto t0 = std::chrono::steady_clock::now();
  const LayerCosts costs = calibrate_with(sim, scenario, options.choices);
  const double calibrate_ms = ms_since(t0);
  OptimizeResult out = search_one_gpu(sim, costs, budget, options);
  out.calibrate_ms = calibrate_ms;
  out.checkpoint = config_for_plan(out.plan);
  try_named_policies(out, sim, costs, budget, options);
  return out;
}

}  // namespace

OptimizeResult optimize_checkpointing(const Scenario& scenario, const TrainingScript& script,
                                      uint64_t budget, const OptimizeOptions& options) {
  // Plans are costed from the measured step's layer windows (windows_of).
  if (scenario.step.measure_whole_run)
    throw ScenarioError(scenario.source +
                        ": step.measure: memsim optimize plans the measured step's "
                        "checkpointing; use step.measure: last-step");
  // Pipeline stages: one plan over each stage's local layers, the budget held on every
  // stage (the megatron family's loop is its own training script).
  if (scenario.parallel.pipeline > 1) {
    OptimizeResult out = optimize_pipeline_checkpointing(scenario, budget, options);
    out.checkpoint = config_for_plan(out.plan);
    return out;
  }
  OptimizeResult out = optimize_one_gpu(scenario, script, budget, options);
  out.flops = out.run.analysis.flops;
  return out;
}

std::string describe_plan(const CheckpointPlan& plan) {
  std::string s;
  size_t i = 0;
  while (i < plan.layers.size()) {
    size_t j = i;
    while (j + 1 < plan.layers.size() && plan.layers[j + 1] == plan.layers[i]) ++j;
    if (!s.empty()) s += ", ";
    s += (i == j ? "layer " + std::to_string(i)
                 : "layers " + std::to_string(i) + "-" + std::to_string(j)) +
         ": " + graph::to_string(plan.layers[i]);
    i = j + 1;
  }
  return s.empty() ? "no layers" : s;
}

}  // namespace memsim
