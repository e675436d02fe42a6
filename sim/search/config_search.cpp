#include "sim/search/config_search.h"

#include <algorithm>

#include "sim/step/checkpoint_policy.h"
#include "sim/step/schedule.h"

namespace memsim {

namespace {

std::vector<OptimizerImpl> implementations(const OptimizerConfig& o) {
  const bool torch_adam = (o.type == OptimizerType::adam || o.type == OptimizerType::adamw) &&
                          (o.impl == OptimizerImpl::for_loop || o.impl == OptimizerImpl::foreach ||
                           o.impl == OptimizerImpl::fused);
  if (!torch_adam) return {o.impl};
  return {OptimizerImpl::for_loop, OptimizerImpl::foreach, OptimizerImpl::fused};
}

// a is better than b for the objective (then the other measure).
bool better(const ConfigCandidate& a, const ConfigCandidate& b, Objective objective) {
  const double ta = a.time.seconds, tb = b.time.seconds;
  const uint64_t ma = a.result.run.analysis.peak_reserved, mb = b.result.run.analysis.peak_reserved;
  if (objective == Objective::time) return ta != tb ? ta < tb : ma < mb;
  return ma != mb ? ma < mb : ta < tb;
}

}  // namespace

ConfigSearch search_configurations(const Scenario& scenario, uint64_t budget, Objective objective,
                                   int64_t global_batch, std::vector<int64_t> micro_batches) {
  ConfigSearch out;
  out.global_batch = global_batch;
  if (micro_batches.empty())
    for (int64_t m = 1; m <= global_batch; ++m)
      if (global_batch % m == 0) micro_batches.push_back(m);
  for (int64_t m : micro_batches) {
    for (OptimizerImpl impl : implementations(scenario.optimizer)) {
      ConfigCandidate c;
      c.micro_batch = m;
      c.grad_accum = global_batch / m;
      c.optimizer = impl;
      Scenario s = scenario;
      s.batch.micro_batch = m;
      s.batch.grad_accum = c.grad_accum;
      s.optimizer.impl = impl;
      const TrainingScript script = default_script(s);
      c.result = optimize_checkpointing(s, script, budget);
      if (c.result.fits) {
        Scenario planned = s;
        planned.checkpoint = c.result.checkpoint;
        planned.checkpoint.reentrant = s.checkpoint.reentrant;
        const Program p = build_program(planned, script);
        c.time = estimate_step_time(p.cost, s.device);
      }
      out.candidates.push_back(std::move(c));
    }
  }
  // The Pareto front over (peak reserved, step seconds) of the fitting, estimated points.
  bool any_time = false;
  for (size_t i = 0; i < out.candidates.size(); ++i) {
    ConfigCandidate& a = out.candidates[i];
    if (!a.result.fits || !a.time.estimated) continue;
    any_time = true;
    a.pareto = true;
    for (const ConfigCandidate& b : out.candidates) {
      if (&a == &b || !b.result.fits || !b.time.estimated) continue;
      const uint64_t ma = a.result.run.analysis.peak_reserved, mb = b.result.run.analysis.peak_reserved;
      const bool no_worse = mb <= ma && b.time.seconds <= a.time.seconds;
      const bool strictly = mb < ma || b.time.seconds < a.time.seconds;
      if (no_worse && strictly) {
        a.pareto = false;
        break;
      }
    }
  }
  const Objective used = objective == Objective::time && !any_time ? Objective::memory : objective;
  for (size_t i = 0; i < out.candidates.size(); ++i) {
    const ConfigCandidate& c = out.candidates[i];
    if (!c.result.fits) continue;
    if (used == Objective::time && !c.time.estimated) continue;
    if (out.chosen < 0 || better(c, out.candidates[out.chosen], used)) out.chosen = static_cast<int>(i);
  }
  if (out.chosen < 0) {
    out.why = "no configuration fits the budget";
  } else if (objective == Objective::time && used == Objective::memory) {
    const std::string refused = out.candidates[out.chosen].time.refused;
    out.why = "the least peak reserved: the time model gives no estimate (" + refused + ")";
  } else if (used == Objective::time) {
    out.why = "the least estimated step time among the configurations that fit";
  } else {
    out.why = "the least peak reserved among the configurations that fit (ties: the faster)";
  }
  return out;
}

}  // namespace memsim
