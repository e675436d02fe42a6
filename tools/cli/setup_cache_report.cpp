#include "tools/cli/setup_cache_report.h"

#include <cstdio>
#include <string>

#include "allocator/units.h"
#include "sim/step/generate.h"
#include "tools/cli/plain_run.h"

namespace memsim::cli {

namespace {

// The peak reserved of `s` run as `memsim run` runs it; nullopt when it does not fit.
std::optional<uint64_t> fitting_peak_reserved(const Scenario& s) {
  GenerateFacts facts;
  const PlainRun r = run_plain(s, facts, /*live_set=*/false);
  if (!r.analysis.fits()) return std::nullopt;
  return r.analysis.peak_reserved;
}

}  // namespace

std::optional<FitsWarning> setup_cache_warning(const Scenario& scenario, const Analysis& analysis) {
  const Sharding sharding = scenario.parallel.sharding;
  if (!analysis.fits() || (sharding != Sharding::fsdp && sharding != Sharding::fsdp2) ||
      scenario.parallel.fsdp_init_on_cpu || analysis.peak_allocated == 0)
    return std::nullopt;
  const double ratio =
      static_cast<double>(analysis.peak_reserved) / static_cast<double>(analysis.peak_allocated);
  if (ratio < kSetupCacheRatio) return std::nullopt;

  Scenario on_cpu = scenario;
  on_cpu.parallel.fsdp_init_on_cpu = true;
  const std::optional<uint64_t> cpu = fitting_peak_reserved(on_cpu);
  if (!cpu || static_cast<double>(*cpu) >
                  (1.0 - kSetupCacheSaving) * static_cast<double>(analysis.peak_reserved))
    return std::nullopt;
  std::optional<uint64_t> cpu_expandable;
  if (!scenario.allocator.expandable_segments) {
    Scenario both = on_cpu;
    both.allocator.expandable_segments = true;
    cpu_expandable = fitting_peak_reserved(both);
  }

  char times[32];
  std::snprintf(times, sizeof times, "%.1fx", ratio);
  const std::string fsdp = sharding == Sharding::fsdp2 ? "FSDP2" : "FSDP";
  std::string message =
      "peak reserved " + human_bytes(analysis.peak_reserved) + " is " + times +
      " the peak allocated " + human_bytes(analysis.peak_allocated) +
      ": the model is built whole on the GPU before " + fsdp +
      " shards it (parallel.fsdp_init: gpu) and PyTorch's caching allocator keeps the freed "
      "segments reserved (until torch.cuda.empty_cache() or an out-of-memory retry), reusing "
      "a cached block only for a request that fits in it; built on the meta device or the "
      "CPU (parallel.fsdp_init: cpu) the run reserves " + human_bytes(*cpu);
  if (cpu_expandable)
    message += ", with allocator.expandable_segments: true as well " + human_bytes(*cpu_expandable);
  return FitsWarning{"setup_cache", "reserved held by the setup's cache", message};
}

}  // namespace memsim::cli
