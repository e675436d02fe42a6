#include "tools/cli/device.h"

#include <algorithm>

namespace memsim::cli {

std::unique_ptr<SimulatedDevice> make_device(const DeviceConfig& device) {
  if (device.capacity == 0) {
    return std::make_unique<SimulatedDevice>(kUnlimitedCapacity, device.cuda_context);
  }
  return std::make_unique<SimulatedDevice>(device.capacity,
                                           std::min(device.cuda_context, device.capacity));
}

std::optional<uint64_t> usable_capacity(const DeviceConfig& device) {
  if (device.capacity == 0) return std::nullopt;
  return device.capacity - std::min(device.cuda_context, device.capacity);
}

}  // namespace memsim::cli
