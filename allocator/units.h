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

// Parses "80GiB", "500MiB", "80GB", "1.5 TiB", "1PiB", "4096" (plain bytes). Decimal units
// (KB, MB, GB, TB, PB, EB) are powers of 1000, binary ones (KiB ... EiB) of 1024. Any size
// up to 2^64 - 1 bytes (just under 16 EiB) parses. Returns nullopt on anything else
// (negative, more than 2^64 - 1, unknown unit, trailing garbage); size_parse_problem says
// which.
std::optional<uint64_t> parse_size(std::string_view text);

// Why parse_size(text) failed, for an error message ("" when it parses): e.g. "unknown
// unit 'parsecs' (B, KiB, ... EiB, KB, ... EB)" or "more than 2^64 - 1 bytes (the
// limit, just under 16 EiB)".
std::string size_parse_problem(std::string_view text);

}  // namespace memsim
