// The simulated GPU a scenario runs on.
//
// Capacity semantics (design.md says "capacity: usable by the allocator"; scenario/scenario.h
// and the device presets define it as cudaMemGetInfo's total, which is what PyTorch's OOM
// message calls "total capacity"): memsim follows the presets. `device.capacity` is the
// device total *including* the CUDA context, and the allocator can use
// capacity - cuda_context. A capacity of 0 (unset, no preset) means unlimited: nothing
// runs out of memory. A context larger than the capacity leaves the allocator nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "allocator/caching_allocator.h"
#include "scenario/scenario.h"

namespace memsim::cli {

// What the device stands in for "unlimited": far beyond any real GPU, far below
// overflow of address arithmetic (2^60 bytes = 1 EiB).
inline constexpr uint64_t kUnlimitedCapacity = 1ull << 60;

std::unique_ptr<SimulatedDevice> make_device(const DeviceConfig& device);

// Bytes the allocator may reserve; nullopt when unlimited.
std::optional<uint64_t> usable_capacity(const DeviceConfig& device);

}  // namespace memsim::cli
