// Sweep throughput: CS336-xl (cs336-xl preset, fp32, CS336 AdamW, H100 80GB) over
// micro_batch 1..B x seq_len in S values (16, 32, ..., 16*S), each point a full
// load_scenario + build_program + execute + analyze through SweepRunner, on T threads.
// Prints total seconds, milliseconds per configuration, and how many fit.
// Usage: bench_sweep [threads=2] [micro_batches=100] [seq_lens=100] [warmup_steps=1]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "sim/search/sweep.h"

using namespace memsim;

int main(int argc, char** argv) {
  const unsigned threads = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 2;
  const int batches = argc > 2 ? std::atoi(argv[2]) : 100;
  const int seqs = argc > 3 ? std::atoi(argv[3]) : 100;
  const int warmup = argc > 4 ? std::atoi(argv[4]) : 1;
  if (batches < 1 || seqs < 1 || warmup < 0) {
    std::fprintf(stderr, "usage: bench_sweep [threads] [micro_batches] [seq_lens] [warmup_steps]\n");
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
  for (int s = 1; s <= seqs; ++s) seq.values.push_back(std::to_string(16 * s));
  const auto points = sweep_points({mb, seq});

  std::vector<SweepResult> results(points.size());
  const auto t0 = std::chrono::steady_clock::now();
  run_parallel(
      points.size(), [&](size_t i) { results[i] = runner.evaluate(points[i]); }, threads);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t fits = 0, errors = 0;
  for (const SweepResult& r : results) {
    fits += r.fits();
    errors += !r.ok;
  }
  std::printf("bench_sweep: %zu CS336-xl configurations (micro_batch 1..%d x seq_len 16..%d, "
              "warmup_steps %d) on %u threads\n",
              points.size(), batches, 16 * seqs, warmup, threads);
  std::printf("  total %.2f s, %.3f ms per configuration (%.3f ms of thread time); "
              "%zu fit, %zu OOM, %zu errors\n",
              seconds, 1000.0 * seconds / static_cast<double>(points.size()),
              1000.0 * seconds * threads / static_cast<double>(points.size()), fits,
              points.size() - fits - errors, errors);
  return 0;
}
