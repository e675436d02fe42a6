// memsim optimize on pipeline scenarios: calibration, search and verification on every
// stage (sim/search/optimize_pipeline.h, "Verification").
#include "sim/search/optimize_pipeline.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include "scenario/pipeline_split.h"
#include "scenario/scenario_family.h"
#include "sim/search/pipeline_stage_sim.h"

namespace memsim {

using graph::CheckpointPlan;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Runs plans on every stage; remembers the stage that failed last (tried first next time)
// and each stage's peaks from the last complete run.
class StageVerifier {
 public:
  StageVerifier(const Scenario& scenario, int64_t stages)
      : sim_(scenario), stages_(stages), peaks_(static_cast<size_t>(stages)) {}

  // True when `plan` runs on every stage within `capacity` (0 = unlimited).
  bool fits(const CheckpointPlan& plan, uint64_t capacity) {
    for (int64_t i = 0; i < stages_; ++i) {
      const int64_t k = (first_ + i) % stages_;
      const bool ok = sim_.run(plan, k, capacity);
      StagePeak& s = peaks_[static_cast<size_t>(k)];
      const MemoryStats& st = sim_.timeline().final_stats;  // peaks reset at the measured step
      s.stage = k;
      s.peak_allocated = static_cast<uint64_t>(st.allocated_bytes.all.peak);
      s.peak_reserved = static_cast<uint64_t>(st.reserved_bytes.all.peak);
      s.fits = ok;
      s.flops = sim_.program().flops;
      if (!ok) {
        first_ = k;
        return false;
      }
    }
    return true;
  }
  // The stage that failed last.
  int64_t failed() const { return first_; }
  // Its peak reserved with no limit.
  uint64_t unlimited_peak(const CheckpointPlan& plan, int64_t stage) {
    sim_.run(plan, stage, 0);
    return static_cast<uint64_t>(sim_.timeline().final_stats.reserved_bytes.all.peak);
  }
  // After fits(plan, capacity) returned true: every stage's peaks, and the stage with the
  // largest peak reserved run again and analysed.
  void report(const CheckpointPlan& plan, uint64_t capacity, OptimizeResult& out) {
    out.stages = peaks_;
    out.flops = {};
    out.worst_stage = 0;
    for (const StagePeak& s : peaks_) {
      out.flops.forward += s.flops.forward;
      out.flops.backward += s.flops.backward;
      out.flops.recompute += s.flops.recompute;
      if (s.peak_reserved > peaks_[static_cast<size_t>(out.worst_stage)].peak_reserved)
        out.worst_stage = s.stage;
    }
    sim_.run(plan, out.worst_stage, capacity);
    out.run = {sim_.analysis(), sim_.timeline().final_stats};
  }

 private:
  StageSimulator sim_;
  int64_t stages_;
  int64_t first_ = 0;  // stage 0 holds the most micro-batches under 1F1B: first guess
  std::vector<StagePeak> peaks_;
};

OptimizeResult found(OptimizeResult out, StageVerifier& v, const CheckpointPlan& plan,
                     int64_t peak, uint64_t budget) {
  auto t = std::chrono::steady_clock::now();
  out.fits = true;
  out.plan = plan;
  out.model_peak = peak;
  v.report(plan, budget, out);
  out.verify_ms += ms_since(t);
  return out;
}

// Nothing fits: the plan with the smallest modelled peak, every stage without a limit.
OptimizeResult report_smallest(OptimizeResult out, const PipelineCosts& costs, StageVerifier& v) {
  auto ts = std::chrono::steady_clock::now();
  const SearchResult smallest = smallest_pipeline_peak_plan(costs);
  out.search_ms += ms_since(ts);
  out.fits = false;
  out.plan = smallest.plan;
  out.model_peak = smallest.peak;
  auto tv = std::chrono::steady_clock::now();
  v.fits(smallest.plan, 0);
  v.report(smallest.plan, 0, out);
  out.verify_ms += ms_since(tv);
  return out;
}

// Every plan of a small plan space whose modelled peak is within the bound, by recompute
// then modelled peak (then enumeration order): (recompute, peak, code), where code spells
// the plan's choice indices in base choices.size(), layer 0 least significant.
struct Candidate {
  int64_t recompute, peak;
  uint32_t code;
};
std::vector<Candidate> enumerate_plans(const PipelineCosts& c, int64_t bound) {
  std::vector<Candidate> out;
  const uint32_t C = static_cast<uint32_t>(c.choices.size());
  std::vector<uint8_t> idx(static_cast<size_t>(c.layers), 0);
  uint32_t code = 0;
  while (true) {
    const int64_t peak = pipeline_model_peak(c, idx.data());
    if (peak <= bound) {
      int64_t r = 0;
      for (int32_t l = 0; l < c.layers; ++l) r += c.flops[idx[l]];
      out.push_back({r, peak, code});
    }
    int32_t l = 0;  // odometer
    while (l < c.layers && ++idx[l] == C) idx[l++] = 0;
    if (l == c.layers) break;
    ++code;
  }
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.recompute != b.recompute) return a.recompute < b.recompute;
    if (a.peak != b.peak) return a.peak < b.peak;
    return a.code < b.code;
  });
  return out;
}

CheckpointPlan decode(const PipelineCosts& c, uint32_t code) {
  CheckpointPlan plan;
  plan.layers.resize(static_cast<size_t>(c.layers));
  const uint32_t C = static_cast<uint32_t>(c.choices.size());
  for (int32_t l = 0; l < c.layers; ++l, code /= C) plan.layers[l] = c.choices[code % C];
  return plan;
}

}  // namespace

OptimizeResult optimize_pipeline_checkpointing(const Scenario& scenario, uint64_t budget,
                                               const OptimizeOptions& options) {
  if (!family_row(scenario.model.family).tensor_parallel)
    throw ScenarioError(scenario.source +
                        ": parallel.pipeline: pipeline parallelism is modelled for model family "
                        "'megatron' only");
  // The cost model holds one plan of L/p layers for every stage (search_pipeline_plan):
  // an uneven split (scenario/pipeline_split.h) gives the stages different lengths.
  if (pipeline_split(scenario).uneven())
    throw ScenarioError(scenario.source +
                        ": parallel.pipeline_first_layers: memsim optimize searches one "
                        "checkpoint plan for stages of equal length; an uneven pipeline split "
                        "(parallel.pipeline_first_layers / pipeline_last_layers / "
                        "pipeline_account_for_*) is not searched (memsim run models it)");
  OptimizeResult out;
  auto t0 = std::chrono::steady_clock::now();
  const PipelineCosts costs = calibrate_pipeline(scenario, options.choices);
  out.calibrate_ms = ms_since(t0);
  StageVerifier verifier(scenario, costs.stages);
  int64_t bound = static_cast<int64_t>(std::min<uint64_t>(budget, INT64_MAX / 4));
  auto ts0 = std::chrono::steady_clock::now();
  const SearchResult first = search_pipeline_plan(costs, bound);
  out.search_ms += ms_since(ts0);
  if (!first.feasible) return report_smallest(std::move(out), costs, verifier);

  // Exact phase (small plan spaces): every plan the model admits, in recompute order. The
  // modelled peak is a lower bound of the reserved peak, so no plan left out could fit.
  int exact_tries = 0;
  double plans = 1;
  for (int32_t l = 0; l < costs.layers; ++l) plans *= static_cast<double>(costs.choices.size());
  if (plans <= static_cast<double>(options.exact_max_plans)) {
    auto ts = std::chrono::steady_clock::now();
    const std::vector<Candidate> all = enumerate_plans(costs, bound);
    out.search_ms += ms_since(ts);
    bool complete = true;
    for (const Candidate& cand : all) {
      if (exact_tries >= options.max_verifications) {
        complete = false;
        break;
      }
      const CheckpointPlan plan = decode(costs, cand.code);
      auto tv = std::chrono::steady_clock::now();
      const bool fits = verifier.fits(plan, budget);
      out.verify_ms += ms_since(tv);
      ++exact_tries;
      ++out.verifications;
      if (fits) return found(std::move(out), verifier, plan, cand.peak, budget);
    }
    if (complete) return report_smallest(std::move(out), costs, verifier);
  }
  // Front walk: the DP's answer for the bound, verified on every stage; a plan that does
  // not fit lowers the bound below its modelled peak (by one byte for the first
  // exact_steps, then by the failing stage's overshoot).
  bool first_candidate = true;
  while (out.verifications - exact_tries < options.max_verifications) {
    auto ts = std::chrono::steady_clock::now();
    const SearchResult r = first_candidate ? first : search_pipeline_plan(costs, bound);
    first_candidate = false;
    out.search_ms += ms_since(ts);
    if (!r.feasible) break;
    auto tv = std::chrono::steady_clock::now();
    ++out.verifications;
    const bool fits = verifier.fits(r.plan, budget);
    out.verify_ms += ms_since(tv);
    if (fits) return found(std::move(out), verifier, r.plan, r.peak, budget);
    int64_t step = 1;
    if (out.verifications - exact_tries > options.exact_steps) {
      tv = std::chrono::steady_clock::now();
      const uint64_t peak = verifier.unlimited_peak(r.plan, verifier.failed());
      step = std::max<int64_t>(1, static_cast<int64_t>(peak) - static_cast<int64_t>(budget));
      out.verify_ms += ms_since(tv);
    }
    bound = r.peak - step;
  }
  return report_smallest(std::move(out), costs, verifier);
}

}  // namespace memsim
