// How far a run is from its memory limit (issue #19 item 2): the bytes an out-of-memory
// run would need, and the warnings a run that fits deserves.
//
// Why: an OOM verdict used to say only where the run failed; how much memory it needs was
// visible only by re-running with `--set device.capacity=1TiB`. A FITS verdict hid runs
// that fit only because the caching allocator flushed its cache (PyTorch's
// release_cached_blocks + retry: every cached segment cudaFree'd and the request retried,
// a device-wide synchronisation that is slow in real life) or that are within a few
// percent of the limit (a longer sequence, another library version, fragmentation).
//
// Contract:
//  - allocator_limit(device, allocator): the bytes the allocator may reserve. That is
//    capacity - cuda_context (tools/cli/device.h), or less with
//    allocator.memory_fraction: PyTorch refuses a cudaMalloc once reserved + size >
//    fraction x device total (CUDACachingAllocator.cpp, alloc_block's
//    allowed_memory_maximum; allocator/caching_allocator.cpp models it). nullopt when
//    the device is unlimited (capacity 0).
//  - unlimited_peak_reserved(program, allocator, cuda_context): executes the same
//    Program with the same allocator settings on a device of 2^60 bytes (what
//    tools/cli/device.h calls unlimited; 2^46 = 64 TiB with expandable segments, whose
//    per-page bookkeeping grows with the device total) and returns its largest reserved bytes over the
//    whole run (every event, and the allocator's own reserved peak of the measured part,
//    which also sees states inside one malloc). For a run whose measured step holds the
//    run's largest reservation (every shipped scenario), this equals the
//    peak_reserved_bytes of `run --set device.capacity=1TiB`. It is what the run needs:
//    with that many usable bytes no cudaMalloc of the unlimited run fails, so the limited
//    run makes the same calls. nullopt if even the unlimited run fails (more than 64 TiB
//    with expandable segments).
//  - fits_warnings(analysis, stats, limit): for a run that fits, one warning per problem:
//    kind "cache_flush" when the allocator flushed its cache (stats.num_alloc_retries > 0,
//    counted over the whole run; the message gives the count and the cudaFree calls,
//    stats.num_device_free), kind "near_capacity" when the peak reserved
//    (analysis.peak_reserved, the measured step's) is at least 97% (1 - kNearCapacityShare)
//    of the limit. Empty for a run that does not fit, or fits with room to spare.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "allocator/allocator_config.h"
#include "allocator/memory_stats.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"

namespace memsim {

// A peak reserved within this share of the limit warns (issue #19: "within 3% of capacity").
inline constexpr double kNearCapacityShare = 0.03;

// The device size of a run "without a limit" (oom.needed_bytes' run, optimize's
// unconstrained runs): 2^60 bytes, 64 TiB with expandable segments.
uint64_t unlimited_device_bytes(const AllocatorConfig& allocator);

std::optional<uint64_t> allocator_limit(const DeviceConfig& device, const AllocatorConfig& allocator);

std::optional<uint64_t> unlimited_peak_reserved(const Program& program,
                                                const AllocatorConfig& allocator,
                                                uint64_t cuda_context);

struct FitsWarning {
  std::string kind;     // "cache_flush", "near_capacity"
  std::string short_text;  // for the verdict line ("fits only after cache flushes")
  std::string message;  // the whole sentence, with the numbers
};

std::vector<FitsWarning> fits_warnings(const Analysis& analysis, const MemoryStats& stats,
                                       std::optional<uint64_t> limit);

}  // namespace memsim
