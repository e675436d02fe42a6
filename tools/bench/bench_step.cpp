// Prints milliseconds per simulated training step (build_program + execute through the
// allocator emulator), single-threaded, for model presets of the implemented families.
// Usage: bench_step [repetitions]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sim/step/execute.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

Scenario cs336(const char* name, int64_t layers, int64_t d, int64_t heads, int64_t ff,
               int64_t seq, int64_t warmup) {
  Scenario s;
  s.name = name;
  s.model.family = ModelFamily::cs336;
  s.model.layers = layers;
  s.model.d_model = d;
  s.model.heads = heads;
  s.model.kv_heads = heads;
  s.model.d_ff = ff;
  s.model.vocab = 10000;
  s.batch.micro_batch = 4;
  s.batch.seq_len = seq;
  s.optimizer.impl = OptimizerImpl::foreach;
  s.step.warmup_steps = warmup;
  s.device.capacity = 1ull << 40;
  return s;
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const std::vector<Scenario> cases = {
      cs336("cs336-xl train S128, measured step only", 32, 2560, 32, 10240, 128, 0),
      cs336("cs336-xl train S128, 1 warm-up + measured", 32, 2560, 32, 10240, 128, 1),
      cs336("cs336-xl train S128, 5 warm-up + measured", 32, 2560, 32, 10240, 128, 5),
      cs336("cs336-medium train S512, measured step only", 24, 1024, 16, 4096, 512, 0),
  };
  std::printf("| case | events | build ms | execute ms | total ms | ms per step |\n|---|---:|---:|---:|---:|---:|\n");
  for (const Scenario& s : cases)
  for (bool by_kind : {true, false}) {
    // Minimum over repetitions: the machine is shared, the minimum is the cost.
    double build = 1e30, exec = 1e30;
    size_t events = 0;
    for (int r = 0; r < reps; ++r) {
      const double t0 = now_ms();
      Program p = build_program(s);
      const double t1 = now_ms();
      SimulatedDevice device(s.device.capacity, 0);
      ExecuteOptions opt;
      opt.record_by_kind = by_kind;
      Timeline t = execute(p, s.allocator, device, opt);
      const double t2 = now_ms();
      build = std::min(build, t1 - t0);
      exec = std::min(exec, t2 - t1);
      events = p.events.size();
      if (t.size() == 0) std::printf("empty timeline\n");
    }
    const double steps = static_cast<double>(s.step.warmup_steps + 1);
    std::printf("| %s%s | %zu | %.2f | %.2f | %.2f | %.2f |\n", s.name.c_str(), by_kind ? "" : " (timeline without per-kind arrays)", events, build, exec,
                build + exec, (build + exec) / steps);
  }
  return 0;
}
