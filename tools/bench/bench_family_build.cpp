// Prints milliseconds to build the Program (graph layer only: builders, ops, autograd
// emulation) of shipped hf-gpt2, hf-llama and megatron scenarios, minimum over
// repetitions. Written to show that numeric mode's hooks in those builders and in
// graph/ops/ops_nn.cpp / ops_fused.cpp (a null test of rt.numeric each) leave the normal
// path's speed unchanged.
// Usage: bench_family_build [repetitions] (run from the repository root)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "sim/step/schedule.h"

using namespace memsim;

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  std::printf("| scenario | events | build ms (min of %d) |\n|---|---:|---:|\n", reps);
  for (const char* name : {"gpt2-large-mi300x", "llama2-13b-seq4096-mi300x",
                           "llama2-7b-full-finetune-a100-ckpt", "llama2-7b-lora-a100",
                           "gpt3-175b", "gpt3-175b-tp8-8xh100"}) {
    const Scenario s = load_scenario(std::string("scenarios/") + name + ".yaml", {});
    double best = 1e30;
    size_t events = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const Program p = build_program(s);
      const auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
      events = p.events.size();
    }
    std::printf("| %s | %zu | %.3f |\n", name, events, best);
  }
  return 0;
}
