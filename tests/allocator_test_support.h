// Test helpers for the allocator tests: a device that hands out scripted addresses and
// a trace recorder.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"

namespace memsim::testing {

// cudaMalloc returns the next scripted address (or fails when capacity is exceeded).
class ScriptedDevice final : public DeviceMemory {
 public:
  ScriptedDevice(std::vector<uint64_t> addresses, uint64_t total = 80ull << 30)
      : addresses_(addresses.begin(), addresses.end()), total_(total) {}
  std::optional<uint64_t> cuda_malloc(uint64_t bytes) override {
    ++malloc_calls;
    if (bytes > free_bytes() || addresses_.empty()) return std::nullopt;
    used_ += bytes;
    const uint64_t a = addresses_.front();
    addresses_.pop_front();
    return a;
  }
  void cuda_free(uint64_t, uint64_t bytes) override { used_ -= bytes; }
  uint64_t free_bytes() const override { return total_ - used_; }
  uint64_t total_bytes() const override { return total_; }
  bool map_pages(uint64_t, uint64_t bytes) override {
    if (bytes > free_bytes()) return false;
    used_ += bytes;
    return true;
  }
  void unmap_pages(uint64_t, uint64_t bytes) override { used_ -= bytes; }

  int malloc_calls = 0;

 private:
  std::deque<uint64_t> addresses_;
  uint64_t total_;
  uint64_t used_ = 0;
};

struct TraceRecorder final : TraceObserver {
  std::vector<TraceEntry> entries;
  void on_trace(const TraceEntry& e) override { entries.push_back(e); }
  // "action addr size" lines, for readable comparisons.
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    for (const auto& e : entries)
      out.push_back(std::string(to_string(e.action)) + " " + std::to_string(e.address) + " " +
                    std::to_string(e.size));
    return out;
  }
  void clear() { entries.clear(); }
};

inline std::string line(TraceAction a, uint64_t addr, uint64_t size) {
  return std::string(to_string(a)) + " " + std::to_string(addr) + " " + std::to_string(size);
}

}  // namespace memsim::testing
