// Prints the accuracy table of memsim against the real CS336 fp32 snapshots (the same
// comparison tests/test_cs336_accuracy.cpp asserts), in Markdown, plus the time each
// prediction took. Usage: cs336_accuracy [path/to/tests/data/cs336_measured.json]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sim/real_runs.h"

using namespace memsim;

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "tests/data/cs336_measured.json";
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return 1;
  }
  nlohmann::json fixture;
  in >> fixture;
  std::printf("| case | predicted max allocated | real | error | predicted max reserved | real | error | peak op | same op as trace | ms |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---|---|---:|\n");
  for (const RealRun& run : cs336_real_runs()) {
    const auto& real = fixture["runs"][run.snapshot];
    const auto t0 = std::chrono::steady_clock::now();
    const MeasuredStep p = predict_measured_step(run.scenario, run.script);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double ra = real["peak_allocated_in_trace"].get<double>();
    const double rr = real["peak_reserved_in_trace"].get<double>();
    const bool same = p.peak_alloc_ordinal == real["peak_alloc_ordinal"].get<uint32_t>();
    std::printf("| %s | %.1f MiB | %.1f MiB | %+.3f%% | %.1f MiB | %.1f MiB | %+.3f%% | %s (%s, layer %d) | %s | %.1f |\n",
                run.id.c_str(), p.peak_allocated / 1048576.0, ra / 1048576.0,
                100.0 * (p.peak_allocated - ra) / ra, p.peak_reserved / 1048576.0, rr / 1048576.0,
                100.0 * (p.peak_reserved - rr) / rr, p.peak_op.c_str(), to_string(p.peak_phase),
                p.peak_layer, same ? "yes" : "no", ms);
  }
  return 0;
}
