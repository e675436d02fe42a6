// Sweep throughput: CS336-xl (cs336-xl preset, fp32, CS336 AdamW, H100 80GB) over
// micro_batch 1..B x seq_len in S values (STEP, 2*STEP, ..., S*STEP), on T threads, two
// ways: "fresh" evaluates every point on its own (SweepRunner::evaluate: the YAML parsed
// and every array allocated per point, as memsim sweep did before the workspaces), and
// "reused" as memsim sweep does now (sim/search/sweep_grid.h: the scenario parsed once
// per worker, the Program and allocator arrays reused). Prints total wall seconds, CPU
// seconds of the process (the machine is shared: wall time also measures neighbours),
// milliseconds per configuration, how many fit, and whether both ways agree.
// Usage: bench_sweep [threads=2] [micro_batches=100] [seq_lens=100] [warmup_steps=1]
//                    [seq_step=16] [which=both|fresh|reused]
// The grid (#20: seq_len 64..6400 step 64): bench_sweep 2 100 100 1 64
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <tuple>
#include <vector>
#include <string>

#include "sim/search/sweep.h"
#include "sim/search/sweep_grid.h"

using namespace memsim;

namespace {
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
}  // namespace

int main(int argc, char** argv) {
  const unsigned threads = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 2;
  const int batches = argc > 2 ? std::atoi(argv[2]) : 100;
  const int seqs = argc > 3 ? std::atoi(argv[3]) : 100;
  const int warmup = argc > 4 ? std::atoi(argv[4]) : 1;
  const int step = argc > 5 ? std::atoi(argv[5]) : 16;
  const std::string which = argc > 6 ? argv[6] : "both";
  if (batches < 1 || seqs < 1 || warmup < 0 || step < 1 ||
      (which != "both" && which != "fresh" && which != "reused")) {
    std::fprintf(stderr, "usage: bench_sweep [threads] [micro_batches] [seq_lens] [warmup_steps] "
                         "[seq_step] [both|fresh|reused]\n");
    return 2;
  }
  const std::string text =
      "name: cs336-xl sweep bench\n"
      "model:\n  preset: cs336-xl\n  attention: eager\n"
      "batch:\n  micro_batch: 4\n  seq_len: 128\n"
      "optimizer:\n  type: adamw\n  impl: cs336\n"
      "step:\n  kind: train\n  warmup_steps: " + std::to_string(warmup) + "\n"
      "device:\n  preset: h100-80gb\n";
  const SweepRunner runner(text, "bench_sweep");
  SweepAxis mb{"batch.micro_batch", {}}, seq{"batch.seq_len", {}};
  for (int b = 1; b <= batches; ++b) mb.values.push_back(std::to_string(b));
  for (int s = 1; s <= seqs; ++s) seq.values.push_back(std::to_string(step * s));
  const auto points = sweep_points({mb, seq});
  std::printf("bench_sweep: %zu CS336-xl configurations (micro_batch 1..%d x seq_len %d..%d step "
              "%d, warmup_steps %d) on %u threads\n",
              points.size(), batches, step, step * seqs, step, warmup, threads);

  auto report = [&](const char* name, const std::vector<SweepResult>& results, double wall,
                    double cpu) {
    size_t fits = 0, errors = 0;
    for (const SweepResult& r : results) {
      fits += r.fits();
      errors += !r.ok;
    }
    std::printf("  %-6s total %.2f s wall, %.2f s CPU: %.3f ms per configuration "
                "(%.3f ms of CPU); %zu fit, %zu OOM, %zu errors\n",
                name, wall, cpu, 1000.0 * wall / static_cast<double>(points.size()),
                1000.0 * cpu / static_cast<double>(points.size()), fits,
                points.size() - fits - errors, errors);
  };
  auto timed = [&](auto&& body) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    std::vector<SweepResult> results = body();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::make_tuple(std::move(results), wall, cpu_seconds() - c0);
  };
  std::vector<SweepResult> fresh, reused;
  if (which != "reused") {
    auto [r, wall, cpu] = timed([&] {
      std::vector<SweepResult> out(points.size());
      run_parallel(points.size(), [&](size_t i) { out[i] = runner.evaluate(points[i]); }, threads);
      return out;
    });
    report("fresh", r, wall, cpu);
    fresh = std::move(r);
  }
  if (which != "fresh") {
    auto [r, wall, cpu] = timed([&] { return evaluate_grid(runner, points, threads); });
    report("reused", r, wall, cpu);
    reused = std::move(r);
  }
  if (which == "both") {
    size_t differ = 0;
    for (size_t i = 0; i < points.size(); ++i)
      differ += fresh[i].ok != reused[i].ok || fresh[i].error != reused[i].error ||
                sweep_verdict(fresh[i]) != sweep_verdict(reused[i]) ||
                (fresh[i].ok && (fresh[i].analysis.peak_allocated != reused[i].analysis.peak_allocated ||
                                 fresh[i].analysis.peak_reserved != reused[i].analysis.peak_reserved));
    std::printf("  the two agree on %zu of %zu points\n", points.size() - differ, points.size());
    if (differ != 0) return 1;
  }
  return 0;
}
