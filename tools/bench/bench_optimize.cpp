// Prints the cost of `memsim optimize` on a 96-layer model (cs336 family, d_model 2048,
// seq 2048, batch 1, forward + backward without an optimizer, measured step only): calibration (one Program per choice), the
// dynamic-programming search alone (repeated, minimum), and the whole optimisation with
// its allocator verifications, for a budget halfway between the all-checkpointed and the
// no-checkpointing peaks.
// Usage: bench_optimize [repetitions]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "allocator/units.h"
#include "sim/optimize.h"
#include "sim/schedule.h"

using namespace memsim;

namespace {

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  Scenario s;
  s.name = "cs336 96 layers";
  s.model.family = ModelFamily::cs336;
  s.model.layers = 96;
  s.model.d_model = 2048;
  s.model.heads = 16;
  s.model.kv_heads = 16;
  s.model.d_ff = 8192;
  s.model.vocab = 32000;
  s.model.context_length = 2048;
  s.batch.micro_batch = 1;
  s.batch.seq_len = 2048;
  s.optimizer.type = OptimizerType::none;  // forward + backward: activations decide the peak
  s.step.warmup_steps = 0;
  const TrainingScript script = default_script(s);
  const OptimizeOptions options;

  double t0 = now_ms();
  const LayerCosts costs = calibrate(s, script, options.choices);
  const double calibrate_ms = now_ms() - t0;

  graph::CheckpointPlan keep, all;
  keep.layers.assign(96, graph::LayerCheckpoint::keep);
  all.layers.assign(96, graph::LayerCheckpoint::layer);
  const int64_t hi = model_peak(costs, keep), lo = model_peak(costs, all);
  const int64_t bound = lo + (hi - lo) / 2;

  double search = 1e30;
  SearchResult r;
  for (int i = 0; i < reps; ++i) {
    t0 = now_ms();
    r = search_plan(costs, bound);
    search = std::min(search, now_ms() - t0);
  }
  t0 = now_ms();
  const OptimizeResult full = optimize_checkpointing(s, script, static_cast<uint64_t>(bound), options);
  const double total_ms = now_ms() - t0;

  std::printf("96 layers, %zu choices per layer, modelled peaks %s (keep all) .. %s (checkpoint all)\n",
              options.choices.size(), human_bytes(static_cast<uint64_t>(hi)).c_str(),
              human_bytes(static_cast<uint64_t>(lo)).c_str());
  std::printf("| step | ms |\n|---|---:|\n");
  std::printf("| calibration (%zu Programs) | %.1f |\n", options.choices.size(), calibrate_ms);
  std::printf("| DP search, budget %s (min of %d) | %.2f |\n",
              human_bytes(static_cast<uint64_t>(bound)).c_str(), reps, search);
  std::printf("| optimize end to end (%d verification(s), %s) | %.1f |\n", full.verifications,
              full.fits ? "fits" : "nothing fits", total_ms);
  std::printf("(inside: calibrate %.1f ms, search %.1f ms, verify %.1f ms)\n", full.calibrate_ms,
              full.search_ms, full.verify_ms);
  std::printf("plan: %s\n", describe_plan(full.plan).c_str());
  return r.feasible ? 0 : 1;
}
