#include "sim/search/offload_search.h"

#include <algorithm>

#include "allocator/caching_allocator.h"
#include "scenario/scenario_checkpoint.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"

namespace memsim {

namespace {

struct OffloadRun {
  bool fits = false;
  PlanRun run;
  Flops flops;
  StepTime time;
  uint64_t host = 0;
};

OffloadRun run_offload(const Scenario& base, const TrainingScript& script, int64_t layers,
                       uint64_t capacity) {
  Scenario s = base;
  s.checkpoint = parse_policy("offload:" + std::to_string(layers));
  const Program p = build_program(s, script);
  SimulatedDevice device(capacity == 0 ? unlimited_capacity(s.allocator) : capacity, 0);
  ExecuteOptions options;
  options.record_by_kind = false;
  const Timeline t = execute(p, s.allocator, device, options);
  OffloadRun r;
  r.fits = !t.oom.has_value();
  r.run = {analyze(p, t), t.final_stats};
  r.flops = p.flops;
  r.time = estimate_step_time(p.cost, s.device);
  r.host = p.host_offload_bytes;
  return r;
}

}  // namespace

OffloadFit least_offload(const Scenario& scenario, const TrainingScript& script, uint64_t budget) {
  OffloadFit out;
  const int64_t layers = std::max<int64_t>(1, scenario.model.layers);
  auto keep = [&](OffloadRun r, int64_t n) {
    out.result.fits = r.fits;
    out.result.checkpoint = parse_policy("offload:" + std::to_string(n));
    out.result.named_policy = policy_label(out.result.checkpoint);
    out.result.plan = make_plan(CheckpointConfig{}, layers);
    out.result.run = std::move(r.run);
    out.result.flops = r.flops;
    out.time = r.fits ? r.time : StepTime{};
    out.host_offload_bytes = r.host;
  };
  OffloadRun all = run_offload(scenario, script, layers, budget);
  ++out.simulations;
  if (!all.fits) {  // report what offloading everything would need
    OffloadRun need = run_offload(scenario, script, layers, 0);
    ++out.simulations;
    need.fits = false;
    keep(std::move(need), layers);
    return out;
  }
  int64_t lo = 1, hi = layers;  // fits(hi); the least fitting N is in [lo, hi]
  OffloadRun best = std::move(all);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    OffloadRun r = run_offload(scenario, script, mid, budget);
    ++out.simulations;
    if (r.fits) {
      hi = mid;
      best = std::move(r);
    } else {
      lo = mid + 1;
    }
  }
  keep(std::move(best), hi);
  out.result.verifications = out.simulations;
  return out;
}

}  // namespace memsim
