// Device-memory models under the allocator (§12): the DeviceMemory defaults and
// SimulatedDevice, a GPU of fixed capacity handing out 2 MiB-aligned addresses.
#include "allocator/caching_allocator.h"

namespace memsim {

namespace {
constexpr uint64_t kPage = 2ull << 20;  // driver granularity (§12)
uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }
}  // namespace

uint64_t DeviceMemory::reserve_address_space(uint64_t bytes) {
  const uint64_t base = next_reservation_;
  next_reservation_ += round_up(bytes, kPage) + kPage;  // a guard page between reservations
  return base;
}
bool DeviceMemory::map_pages(uint64_t, uint64_t bytes) { return bytes <= free_bytes(); }
void DeviceMemory::unmap_pages(uint64_t, uint64_t) {}
void DeviceMemory::adopt(uint64_t, uint64_t) {}

SimulatedDevice::SimulatedDevice(uint64_t total, uint64_t reserved_outside)
    : total_(total), used_(reserved_outside > total ? total : reserved_outside),
      next_address_(0x7f0000000000ull / 2) {}

std::optional<uint64_t> SimulatedDevice::cuda_malloc(uint64_t bytes) {
  if (bytes > free_bytes()) return std::nullopt;
  used_ += bytes;
  const uint64_t address = next_address_;
  // Never reuse addresses: distinct segments stay distinguishable in traces.
  next_address_ += round_up(bytes, kPage);
  return address;
}

void SimulatedDevice::cuda_free(uint64_t, uint64_t bytes) { used_ -= bytes > used_ ? used_ : bytes; }

uint64_t SimulatedDevice::free_bytes() const { return total_ - used_; }

uint64_t SimulatedDevice::reserve_address_space(uint64_t bytes) {
  const uint64_t base = next_reservation_;
  next_reservation_ += round_up(bytes, kPage) + kPage;
  return base;
}

bool SimulatedDevice::map_pages(uint64_t, uint64_t bytes) {
  if (bytes > free_bytes()) return false;
  used_ += bytes;
  return true;
}

void SimulatedDevice::unmap_pages(uint64_t, uint64_t bytes) {
  used_ -= bytes > used_ ? used_ : bytes;
}

void SimulatedDevice::adopt(uint64_t, uint64_t bytes) {
  used_ += bytes;
  if (used_ > total_) used_ = total_;
}

}  // namespace memsim
