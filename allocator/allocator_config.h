// The allocator's configuration: PYTORCH_CUDA_ALLOC_CONF (§2) plus the memory fraction.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

namespace memsim {

struct AllocatorConfig {
  static constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

  uint64_t max_split_size = kUnlimited;            // bytes; blocks >= this are oversize
  uint64_t max_non_split_rounding = 20ull << 20;   // bytes
  std::array<uint32_t, 16> roundup_power2_divisions{};  // index i covers [2^(20+i), 2^(21+i))
  double garbage_collection_threshold = 0.0;       // 0 = off
  bool expandable_segments = false;
  std::optional<double> memory_fraction;           // set_per_process_memory_fraction

  // Parses the PYTORCH_CUDA_ALLOC_CONF syntax ("expandable_segments:True,
  // max_split_size_mb:128, roundup_power2_divisions:[256:1,>:8]") starting from the
  // defaults. Throws ConfigError naming the offending option on bad input.
  static AllocatorConfig parse(const std::string& conf);
  // The settings string as PyTorch would echo it (empty for defaults).
  std::string to_string() const;
};

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace memsim
