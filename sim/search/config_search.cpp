#include "sim/search/config_search.h"

#include <algorithm>

#include "scenario/loss_impl.h"
#include "scenario/scenario_family.h"
#include "sim/search/offload_search.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/modelled_features.h"
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

uint64_t peak_of(const ConfigCandidate& c) { return c.result.run.analysis.peak_reserved; }

// a is better than b for the objective (then the other measure).
bool better(const ConfigCandidate& a, const ConfigCandidate& b, Objective objective) {
  const double ta = a.time.seconds, tb = b.time.seconds;
  const uint64_t ma = peak_of(a), mb = peak_of(b);
  if (objective == Objective::time) return ta != tb ? ta < tb : ma < mb;
  return ma != mb ? ma < mb : ta < tb;
}

// Whether memsim models the candidate's scenario (require_modelled and the loss rows).
bool modelled(const Scenario& s) {
  if (!loss_impl_refusal(s.model.family, s.loss.impl).empty()) return false;
  try {
    require_modelled(s);
  } catch (const ScenarioError&) {
    return false;
  }
  return true;
}

// Grid and axis candidates but offload: optimize_checkpointing's plan, and its time.
void plan_candidate(const Scenario& base, uint64_t budget, ConfigCandidate& c) {
  const Scenario s = candidate_scenario(base, c);
  const TrainingScript script = default_script(s);
  c.result = optimize_checkpointing(s, script, budget);
  if (c.result.fits) {
    Scenario planned = s;
    planned.checkpoint = c.result.checkpoint;
    planned.checkpoint.reentrant = s.checkpoint.reentrant;
    const Program p = build_program(planned, script);
    c.time = estimate_step_time(p.cost, s.device);
  }
}

}  // namespace

Scenario candidate_scenario(const Scenario& base, const ConfigCandidate& c) {
  Scenario s = base;
  s.batch.micro_batch = c.micro_batch;
  s.batch.grad_accum = c.grad_accum;
  s.optimizer.type = c.optimizer_type;
  s.optimizer.impl = c.optimizer;
  s.loss = c.loss;
  s.allocator.expandable_segments = c.expandable_segments;
  return s;
}

ConfigSearch search_configurations(const Scenario& scenario, uint64_t budget, Objective objective,
                                   int64_t global_batch, std::vector<int64_t> micro_batches) {
  ConfigSearch out;
  out.global_batch = global_batch;
  if (micro_batches.empty())
    for (int64_t m = 1; m <= global_batch; ++m)
      if (global_batch % m == 0) micro_batches.push_back(m);
  const OptimizerType type = scenario.optimizer.type;
  const bool adam = type == OptimizerType::adam || type == OptimizerType::adamw;
  for (int64_t m : micro_batches) {
    ConfigCandidate point;
    point.micro_batch = m;
    point.grad_accum = global_batch / m;
    point.optimizer = scenario.optimizer.impl;
    point.optimizer_type = type;
    point.loss = scenario.loss;
    point.expandable_segments = scenario.allocator.expandable_segments;
    for (OptimizerImpl impl : implementations(scenario.optimizer)) {
      ConfigCandidate c = point;
      c.optimizer = impl;
      plan_candidate(scenario, budget, c);
      out.candidates.push_back(std::move(c));
    }
    // The other axes, one at a time on this micro-batch (see the header).
    std::vector<ConfigCandidate> axes;
    if (adam && family_row(scenario.model.family).adam8bit) {
      ConfigCandidate c = point;
      c.optimizer_type = type == OptimizerType::adamw ? OptimizerType::adamw8bit : OptimizerType::adam8bit;
      c.optimizer = OptimizerImpl::foreach;  // bitsandbytes has no variants (the key's default)
      c.axis = "8-bit";
      axes.push_back(std::move(c));
    }
    const LossFunction loss = scenario.loss.impl;
    if (loss == LossFunction::automatic || loss == LossFunction::torch || loss == LossFunction::torch_float) {
      ConfigCandidate c = point;
      c.loss = LossConfig{};
      c.loss.impl = LossFunction::chunked;
      c.loss.chunks = 8;  // torchtune's recipes' num_output_chunks
      c.loss.positions = scenario.loss.positions;
      c.axis = "loss " + loss_impl_label(c.loss);
      axes.push_back(std::move(c));
    }
    if (!scenario.allocator.expandable_segments) {
      ConfigCandidate c = point;
      c.expandable_segments = true;
      c.axis = "expandable segments";
      axes.push_back(std::move(c));
    }
    for (ConfigCandidate& c : axes) {
      if (!modelled(candidate_scenario(scenario, c))) continue;
      plan_candidate(scenario, budget, c);
      out.candidates.push_back(std::move(c));
    }
    {
      ConfigCandidate c = point;
      Scenario s = candidate_scenario(scenario, c);
      s.checkpoint = parse_policy("offload");
      if (modelled(s)) {
        s.checkpoint = CheckpointConfig{};
        const OffloadFit fit = least_offload(s, default_script(s), budget);
        c.result = fit.result;
        c.time = fit.time;
        c.host_offload_bytes = fit.host_offload_bytes;
        c.axis = fit.result.named_policy;
        out.candidates.push_back(std::move(c));
      }
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
      const bool no_worse = peak_of(b) <= peak_of(a) && b.time.seconds <= a.time.seconds;
      const bool strictly = peak_of(b) < peak_of(a) || b.time.seconds < a.time.seconds;
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
    std::string refused;
    for (const ConfigCandidate& c : out.candidates)
      if (c.result.fits && !c.time.refused.empty()) {
        refused = c.time.refused;
        break;
      }
    out.why = "the least peak reserved: the time model gives no estimate (" + refused + ")";
  } else if (used == Objective::time) {
    out.why = "the least estimated step time among the configurations that fit";
  } else {
    out.why = "the least peak reserved among the configurations that fit (ties: the faster)";
  }
  const ConfigCandidate* chosen = out.chosen >= 0 ? &out.candidates[static_cast<size_t>(out.chosen)] : nullptr;
  if (chosen != nullptr) {
    size_t fitting = 0;
    for (const ConfigCandidate& c : out.candidates) fitting += c.result.fits ? 1 : 0;
    out.why += "; " + std::to_string(fitting) + " of " + std::to_string(out.candidates.size()) +
               " configurations fit" + (chosen->pareto ? ", and it is on the Pareto front" : "");
  }
  return out;
}

}  // namespace memsim
