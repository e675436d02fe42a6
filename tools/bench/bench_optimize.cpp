// Prints the cost of `memsim optimize` on a 96-layer model (cs336 family, d_model 2048,
// seq 2048, batch 1, forward + backward without an optimizer, measured step only): calibration (one Program per choice), the
// dynamic-programming search alone (repeated, minimum), and the whole optimisation with
// its allocator verifications, for a budget halfway between the all-checkpointed and the
// no-checkpointing peaks. Figures are minima over the repetitions, in CPU time of the
// thread (the machine is shared) with wall time in brackets.
// Usage: bench_optimize [repetitions]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "allocator/units.h"
#include "sim/search/optimize.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

double wall_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// CPU time of this thread: the machine is shared, so wall time measures the neighbours.
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = std::max(1, argc > 1 ? std::atoi(argv[1]) : 10);
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

  // Each figure: the minimum over the repetitions, CPU time (wall time in brackets).
  double calibrate_ms = 1e30, calibrate_wall = 1e30;
  LayerCosts costs;
  for (int i = 0; i < reps; ++i) {
    const double c0 = cpu_ms(), w0 = wall_ms();
    costs = calibrate(s, script, options.choices);
    calibrate_ms = std::min(calibrate_ms, cpu_ms() - c0);
    calibrate_wall = std::min(calibrate_wall, wall_ms() - w0);
  }

  graph::CheckpointPlan keep, all;
  keep.layers.assign(96, graph::LayerCheckpoint::keep);
  all.layers.assign(96, graph::LayerCheckpoint::layer);
  const int64_t hi = model_peak(costs, keep), lo = model_peak(costs, all);
  const int64_t bound = lo + (hi - lo) / 2;

  double search = 1e30;
  SearchResult r;
  for (int i = 0; i < reps; ++i) {
    const double c0 = cpu_ms();
    r = search_plan(costs, bound);
    search = std::min(search, cpu_ms() - c0);
  }
  double total_ms = 1e30, total_wall = 1e30;
  OptimizeResult full;
  for (int i = 0; i < reps; ++i) {
    const double c0 = cpu_ms(), w0 = wall_ms();
    full = optimize_checkpointing(s, script, static_cast<uint64_t>(bound), options);
    total_ms = std::min(total_ms, cpu_ms() - c0);
    total_wall = std::min(total_wall, wall_ms() - w0);
  }

  std::printf("96 layers, %zu choices per layer, modelled peaks %s (keep all) .. %s (checkpoint all)\n",
              options.choices.size(), human_bytes(static_cast<uint64_t>(hi)).c_str(),
              human_bytes(static_cast<uint64_t>(lo)).c_str());
  std::printf("| step (min of %d) | ms CPU (wall) |\n|---|---:|\n", reps);
  std::printf("| calibration (%zu Programs) | %.1f (%.1f) |\n", options.choices.size(), calibrate_ms,
              calibrate_wall);
  std::printf("| DP search, budget %s | %.2f |\n",
              human_bytes(static_cast<uint64_t>(bound)).c_str(), search);
  std::printf("| optimize end to end (%d verification(s), %s) | %.1f (%.1f) |\n", full.verifications,
              full.fits ? "fits" : "nothing fits", total_ms, total_wall);
  std::printf("last run's own split (wall): calibrate %.1f ms, search %.1f ms, verify %.1f ms\n",
              full.calibrate_ms, full.search_ms, full.verify_ms);
  std::printf("plan: %s\n", describe_plan(full.plan).c_str());
  return r.feasible ? 0 : 1;
}
