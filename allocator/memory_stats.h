// torch.cuda.memory_stats() (§8): the same statistics with the same keys.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace memsim {

// One c10 Stat: current value, its peak, and the sums of increases / decreases.
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;

  void increase(int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void reset_peak() { peak = current; }
};

// A statistic kept for all pools together and for each pool kind.
struct StatArray {
  Stat all, small_pool, large_pool;
  void increase(bool small, int64_t amount) {
    all.increase(amount);
    (small ? small_pool : large_pool).increase(amount);
  }
  void decrease(bool small, int64_t amount) {
    all.decrease(amount);
    (small ? small_pool : large_pool).decrease(amount);
  }
};

struct MemoryStats {
  StatArray allocation, segment, active, inactive_split;
  StatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes,
      requested_bytes;
  Stat oversize_allocations, oversize_segments;
  int64_t max_split_size = -1;  // -1 = unlimited
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;

  // Flattened with PyTorch's dotted keys ("allocated_bytes.all.peak"), sorted by key.
  std::map<std::string, int64_t> to_flat_map() const;
};

}  // namespace memsim
