// Prints the accuracy table of memsim against the real CS336 fp32 snapshots (the same
// comparison tests/test_cs336_accuracy.cpp asserts), in Markdown, plus the time each
// prediction took, then the bf16 autocast runs (tests/test_autocast.cpp).
// Usage: cs336_accuracy [path/to/tests/data/cs336_measured.json [cs336_bf16_measured.json]]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/real_runs.h"

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
  const std::string bf16_path = argc > 2 ? argv[2] : "tests/data/cs336_bf16_measured.json";
  nlohmann::json bf16;
  if (std::ifstream in16(bf16_path); in16) in16 >> bf16;
  std::printf("| case | predicted max allocated | real | error | predicted max reserved | real | error | peak op | same op as trace | ms |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---|---|---:|\n");
  std::vector<RealRun> runs = cs336_real_runs();
  if (!bf16.is_null())
    for (RealRun& r : cs336_bf16_real_runs()) runs.push_back(std::move(r));
  for (const RealRun& run : runs) {
    const bool is_bf16 = run.scenario.precision.autocast.has_value();
    const auto& real = (is_bf16 ? bf16 : fixture)["runs"][run.snapshot];
    const auto t0 = std::chrono::steady_clock::now();
    const MeasuredStep p = predict_measured_step(run.scenario, run.script);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double ra = real["peak_allocated_in_trace"].get<double>();
    const double rr = real["peak_reserved_in_trace"].get<double>();
    // The bf16 fixture holds no peak ordinal: "same op" is not checked for those.
    const bool same = !is_bf16 && p.peak_alloc_ordinal == real["peak_alloc_ordinal"].get<uint32_t>();
    std::printf("| %s | %.1f MiB | %.1f MiB | %+.3f%% | %.1f MiB | %.1f MiB | %+.3f%% | %s (%s, layer %d) | %s | %.1f |\n",
                run.id.c_str(), p.peak_allocated / 1048576.0, ra / 1048576.0,
                100.0 * (p.peak_allocated - ra) / ra, p.peak_reserved / 1048576.0, rr / 1048576.0,
                100.0 * (p.peak_reserved - rr) / rr, p.peak_op.c_str(), to_string(p.peak_phase),
                p.peak_layer, is_bf16 ? "n/a" : same ? "yes" : "no", ms);
  }
  return 0;
}
