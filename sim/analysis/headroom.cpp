#include "sim/analysis/headroom.h"

#include <algorithm>
#include <cstdio>

#include "allocator/caching_allocator.h"
#include "allocator/units.h"
#include "sim/step/execute.h"

namespace memsim {

uint64_t unlimited_device_bytes(const AllocatorConfig& allocator) {
  // tools/cli/device.h's kUnlimitedCapacity (the sim library cannot include tools/). With
  // expandable segments each segment reserves 1.125 x the device total of address space
  // (allocator/expandable_segments.cpp): 64 TiB is beyond any GPU and keeps the address
  // arithmetic far from overflow.
  return allocator.expandable_segments ? uint64_t{1} << 46 : uint64_t{1} << 60;
}

std::optional<uint64_t> allocator_limit(const DeviceConfig& device, const AllocatorConfig& allocator) {
  if (device.capacity == 0) return std::nullopt;
  uint64_t limit = device.capacity - std::min(device.cuda_context, device.capacity);
  if (allocator.memory_fraction) {
    // PyTorch: static_cast<size_t>(fraction * device_total), as allowed_memory_maximum.
    const auto allowed = static_cast<uint64_t>(*allocator.memory_fraction *
                                               static_cast<double>(device.capacity));
    limit = std::min(limit, allowed);
  }
  return limit;
}

std::optional<uint64_t> unlimited_peak_reserved(const Program& program,
                                                const AllocatorConfig& allocator,
                                                uint64_t cuda_context) {
  SimulatedDevice device(unlimited_device_bytes(allocator), cuda_context);
  ExecuteOptions options;
  options.record_by_kind = false;  // only the reserved curve is read
  const Timeline timeline = execute(program, allocator, device, options);
  if (timeline.oom) return std::nullopt;
  uint64_t most = static_cast<uint64_t>(std::max<int64_t>(0, timeline.final_stats.reserved_bytes.all.peak));
  for (uint64_t r : timeline.reserved) most = std::max(most, r);
  return most;
}

std::vector<FitsWarning> fits_warnings(const Analysis& analysis, const MemoryStats& stats,
                                       std::optional<uint64_t> limit) {
  std::vector<FitsWarning> warnings;
  if (!analysis.fits()) return warnings;
  if (stats.num_alloc_retries > 0) {
    warnings.push_back({"cache_flush", "fits only after cache flushes",
        "fits only after the allocator flushed its cache " + std::to_string(stats.num_alloc_retries) +
        " time" + (stats.num_alloc_retries > 1 ? "s" : "") + " (num_alloc_retries " +
        std::to_string(stats.num_alloc_retries) + ", " + std::to_string(stats.num_device_free) +
        " cudaFree calls): every cached segment freed and the request retried, a device-wide "
        "synchronisation that slows the step on a real GPU"});
  }
  if (limit && *limit > 0) {
    const double used = static_cast<double>(analysis.peak_reserved) / static_cast<double>(*limit);
    if (used >= 1.0 - kNearCapacityShare) {
      char share[32];
      std::snprintf(share, sizeof share, "%.1f%%", 100.0 * used);
      warnings.push_back({"near_capacity", "within 3% of capacity", "peak reserved " + human_bytes(analysis.peak_reserved) + " is " + share +
                         " of the " + human_bytes(*limit) +
                         " usable, within 3%: a longer sequence, another library version or more "
                         "fragmentation can run out of memory"});
    }
  }
  return warnings;
}

}  // namespace memsim
