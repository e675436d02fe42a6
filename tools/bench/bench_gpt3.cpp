// Speed of simulating GPT-3 175B training (scenarios/gpt3-175b.yaml: 96 layers, megatron
// family): build_program + execute through the allocator emulator, on a device large
// enough that nothing runs out of memory (so the whole step is simulated, not cut short
// at the OOM). Timed: one step alone, the scenario as shipped (one warm-up step + the
// measured step, what `memsim run` simulates), one step again; the first line also pays
// for the process's cold heap (page faults), as a single `memsim run` does. Then the
// formula-vs-memsim table of sim/megatron/megatron_checks.h (of sim/megatron/megatron_pipeline_checks.h for
// a pipeline scenario, whose build_program builds and runs every stage).
// Usage: bench_gpt3 [SCENARIO.yaml] (default scenarios/gpt3-175b.yaml, relative to the
// current directory). Prints figures only.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include <time.h>

#include "sim/megatron/megatron_checks.h"
#include "sim/megatron/megatron_pipeline_checks.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

// CPU time of this process: on a loaded machine wall time also counts the time other
// processes held the core.
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

void time_it(const Scenario& s) {
  using clock = std::chrono::steady_clock;
  double best = 1e30, best_build = 0, best_cpu = 1e30, total = 0;
  size_t runs = 0, events = 0;
  const auto start = clock::now();
  while (runs < 5 || std::chrono::duration<double>(clock::now() - start).count() < 1.0) {
    const double c0 = cpu_ms();
    const auto t0 = clock::now();
    const Program program = build_program(s);
    const auto t1 = clock::now();
    SimulatedDevice device(1ull << 50, 0);  // 1 PiB: the whole step runs
    const Timeline timeline = execute(program, s.allocator, device);
    const auto t2 = clock::now();
    best_cpu = std::min(best_cpu, cpu_ms() - c0);
    const double ms = std::chrono::duration<double, std::milli>(t2 - t0).count();
    total += ms;
    if (ms < best) {
      best = ms;
      best_build = std::chrono::duration<double, std::milli>(t1 - t0).count();
    }
    events = timeline.size();
    ++runs;
  }
  std::printf("  %lld step(s), %zu events: build_program + execute best %.2f ms wall (build "
              "%.2f ms), best %.2f ms CPU, mean %.2f ms wall over %zu runs\n",
              static_cast<long long>(s.step.warmup_steps + 1), events, best, best_build,
              best_cpu, total / static_cast<double>(runs), runs);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "scenarios/gpt3-175b.yaml";
  Scenario s;
  try {
    s = load_scenario(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpt3: %s\n", e.what());
    return 1;
  }
  std::printf("bench_gpt3: %s (%lld layers)\n", s.name.c_str(),
              static_cast<long long>(s.model.layers));
  Scenario one = s;
  one.step.warmup_steps = 0;
  time_it(one);
  time_it(s);
  time_it(one);

  std::printf("\n| check | formula | formula value | memsim | memsim - formula |\n"
              "| --- | --- | ---: | ---: | --- |\n");
  auto row = [](const FormulaCheck& c) {
    const double diff = c.simulated - c.expected;
    const std::string d = diff == 0 ? "0" : std::to_string(static_cast<long long>(diff)) + " B";
    std::printf("| %s | %s | %.0f %s | %.0f | %s%s%s |\n", c.name.c_str(), c.formula.c_str(),
                c.expected, c.unit.c_str(), c.simulated, d.c_str(), c.note.empty() ? "" : ": ",
                c.note.c_str());
  };
  if (s.parallel.pipeline > 1) {
    // A pipeline scenario (e.g. scenarios/gpt3-175b-tp8-pp8-64xh100.yaml): build_program
    // above built and ran every stage; the table is stage 0 against Megatron-LM's
    // theoretical memory (sim/megatron/megatron_pipeline_checks.h).
    if (s.parallel.sequence && s.checkpoint.policy == CheckpointPolicy::selective)
      for (const FormulaCheck& c : megatron_theoretical_first_stage_checks(s)) row(c);
    return 0;
  }
  for (const FormulaCheck& c : korthikanti_checks(s)) row(c);
  for (const FormulaCheck& c : model_state_checks()) row(c);
  return 0;
}
