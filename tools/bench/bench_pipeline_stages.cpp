// The 1T-parameter Megatron job of issue #20 (tensor 8 x pipeline 64 x data 16: GPT-3's
// layout scaled to Narayanan et al. 2021's 1T row, 128 layers, d_model 25600, 160 heads,
// d_ff 102400, 64 micro-batches of 1 x 2048, 1F1B, selective recompute), built as
// `memsim run` builds it: every one of the 64 stages built and run through the allocator to
// pick the worst (sim/megatron/megatron_pipeline.cpp), on 1 worker and on T workers
// (sim/search/workers.h). Prints wall and process CPU seconds (minimum over repetitions)
// and checks that both choose the same stage and Program.
// Usage: bench_pipeline_stages [threads=2] [repetitions=3] [scenario.yaml]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "scenario/scenario.h"
#include "sim/search/workers.h"
#include "sim/step/schedule.h"

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
  const int reps = std::max(1, argc > 2 ? std::atoi(argv[2]) : 3);
  const std::string file = argc > 3 ? argv[3] : "scenarios/gpt3-175b-tp8-pp8-64xh100.yaml";
  const Scenario s = load_scenario(file, {{"model.layers", "128"},
                                          {"model.d_model", "25600"},
                                          {"model.heads", "160"},
                                          {"model.d_ff", "102400"},
                                          {"parallel.pipeline", "64"},
                                          {"parallel.data", "16"},
                                          {"batch.grad_accum", "64"}});
  std::printf("bench_pipeline_stages: %s with 128 layers, d_model 25600, t%lld x p%lld x d%lld, "
              "%lld micro-batches\n",
              file.c_str(), static_cast<long long>(s.parallel.tensor),
              static_cast<long long>(s.parallel.pipeline), static_cast<long long>(s.parallel.data),
              static_cast<long long>(s.batch.grad_accum));
  std::vector<Program> programs;
  for (unsigned t : {1u, threads}) {
    set_default_threads(t);
    double wall = 1e30, cpu = 1e30;
    Program p;
    for (int i = 0; i < reps; ++i) {
      const auto w0 = std::chrono::steady_clock::now();
      const double c0 = cpu_seconds();
      p = build_program(s);
      wall = std::min(wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
      cpu = std::min(cpu, cpu_seconds() - c0);
    }
    std::printf("  %u worker(s): %.3f s wall, %.3f s CPU; %zu events, stage %d chosen\n", t, wall,
                cpu, p.events.size(), p.rank.pipeline_stage);
    programs.push_back(std::move(p));
  }
  const bool same = programs[0].events.size() == programs[1].events.size() &&
                    programs[0].rank.why == programs[1].rank.why;
  std::printf("  same stage and Program: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
}
