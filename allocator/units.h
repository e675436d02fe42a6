// Byte sizes as people write them and as PyTorch prints them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace memsim {

inline constexpr uint64_t KiB = 1024ull;
inline constexpr uint64_t MiB = 1024ull * KiB;
inline constexpr uint64_t GiB = 1024ull * MiB;

// PyTorch's format_size (c10 CUDACachingAllocator): "N bytes", "x.xx KiB", "x.xx MiB",
// "x.xx GiB", with inclusive upper bounds (1048576 prints "1024.00 KiB").
std::string torch_format_size(uint64_t bytes);

// Human units for terminal output: "512 B", "1.50 KiB", "3.25 GiB" (binary units).
std::string human_bytes(uint64_t bytes);

// Parses "80GiB", "500MiB", "80GB", "1.5 TiB", "4096" (plain bytes). Decimal units
// (KB, MB, GB, TB) are powers of 1000, binary ones (KiB...) of 1024. Returns nullopt on
// anything else (negative, overflow, unknown unit, trailing garbage).
std::optional<uint64_t> parse_size(std::string_view text);

}  // namespace memsim
