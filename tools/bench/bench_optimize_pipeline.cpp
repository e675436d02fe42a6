// Prints the cost of `memsim optimize` on a pipeline-parallel scenario (default: GPT-3 175B,
// tensor 8 x pipeline 8, 1F1B, 16 micro-batches; scenarios/gpt3-175b-tp8-pp8-64xh100.yaml)
// at a few budgets: the plan, recompute share, every stage's peak reserved, and the time of
// the whole optimisation (calibration: one Program per choice and stage; search; the
// verifying simulations of every stage). Times are minima over the repetitions, in CPU
// time of the thread (the machine is shared) with wall time in brackets.
// Usage: bench_optimize_pipeline [scenario.yaml [repetitions]]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "allocator/units.h"
#include "sim/search/optimize.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

double wall_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string file = argc > 1 ? argv[1] : "scenarios/gpt3-175b-tp8-pp8-64xh100.yaml";
  const int reps = std::max(1, argc > 2 ? std::atoi(argv[2]) : 5);
  const Scenario s = load_scenario(file);
  const TrainingScript script = default_script(s);
  std::printf("%s\n", s.name.c_str());
  for (double gib : {78.0, 60.0, 56.0, 52.0}) {
    const uint64_t budget = static_cast<uint64_t>(gib * 1024 * 1024 * 1024);
    double cpu = 1e30, wall = 1e30;
    OptimizeResult r;
    for (int i = 0; i < reps; ++i) {
      const double c0 = cpu_ms(), w0 = wall_ms();
      r = optimize_checkpointing(s, script, budget);
      cpu = std::min(cpu, cpu_ms() - c0);
      wall = std::min(wall, wall_ms() - w0);
    }
    const double total = r.flops.forward + r.flops.backward + r.flops.recompute;
    std::printf("\nbudget %s: %s  %s\n", human_bytes(budget).c_str(), r.fits ? "PLAN" : "NO PLAN",
                describe_plan(r.plan).c_str());
    std::printf("  recompute %.1f%% of the step's FLOPs (all stages); worst stage %lld\n",
                total > 0 ? 100.0 * r.flops.recompute / total : 0.0,
                static_cast<long long>(r.worst_stage));
    std::printf("  peak reserved by stage:");
    for (const StagePeak& st : r.stages) std::printf(" %.2f", st.peak_reserved / (1024.0 * 1024 * 1024));
    std::printf(" GiB\n  optimize %.1f ms CPU (%.1f wall): calibrate %.1f, search %.2f, verify %.1f ms "
                "(last run, wall), %d plan(s) verified on every stage\n",
                cpu, wall, r.calibrate_ms, r.search_ms, r.verify_ms, r.verifications);
  }
  return 0;
}
