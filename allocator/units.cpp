#include "allocator/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

namespace memsim {

namespace {
std::string format_fixed(double value, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", value, unit);
  return buf;
}
}  // namespace

std::string torch_format_size(uint64_t bytes) {
  if (bytes <= 1024) return std::to_string(bytes) + " bytes";
  if (bytes <= MiB) return format_fixed(static_cast<double>(bytes) / KiB, "KiB");
  if (bytes <= GiB) return format_fixed(static_cast<double>(bytes) / MiB, "MiB");
  return format_fixed(static_cast<double>(bytes) / GiB, "GiB");
}

std::string human_bytes(uint64_t bytes) {
  if (bytes < KiB) return std::to_string(bytes) + " B";
  if (bytes < MiB) return format_fixed(static_cast<double>(bytes) / KiB, "KiB");
  if (bytes < GiB) return format_fixed(static_cast<double>(bytes) / MiB, "MiB");
  if (bytes < 1024 * GiB) return format_fixed(static_cast<double>(bytes) / GiB, "GiB");
  return format_fixed(static_cast<double>(bytes) / (1024.0 * GiB), "TiB");
}

namespace {

// The parts of a size: digits (with at most one '.'), then a unit, spaces around.
struct SizeText {
  enum class Problem { none, no_number, trailing, unit } problem = Problem::none;
  std::string number;
  std::string unit;
  bool fractional = false;
  double scale = 0;
  uint64_t int_scale = 0;  // scale as an integer (every unit is a whole number of bytes)
};

SizeText split_size(std::string_view text) {
  SizeText out;
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t start = i;
  bool seen_digit = false;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) ||
                             (text[i] == '.' && !out.fractional))) {
    if (text[i] == '.') out.fractional = true; else seen_digit = true;
    ++i;
  }
  if (!seen_digit) {
    out.problem = SizeText::Problem::no_number;
    return out;
  }
  out.number = std::string(text.substr(start, i - start));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) out.unit += text[i++];
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) {
    out.problem = SizeText::Problem::trailing;
    return out;
  }
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},           {"B", 1},
      {"KiB", KiB},      {"MiB", MiB},         {"GiB", GiB},
      {"TiB", 1024 * GiB}, {"PiB", 1024 * 1024 * GiB}, {"EiB", 1024 * 1024 * 1024 * GiB},
      {"KB", 1000},      {"kB", 1000},         {"MB", 1000'000},  {"GB", 1000'000'000},
      {"TB", 1000'000'000'000}, {"PB", 1000'000'000'000'000}, {"EB", 1000'000'000'000'000'000},
  };
  for (const auto& [name, scale] : kUnits) {
    if (out.unit == name) {
      out.int_scale = scale;
      out.scale = static_cast<double>(scale);
      return out;
    }
  }
  out.problem = SizeText::Problem::unit;
  return out;
}

// The value of a well-formed SizeText; nullopt when it exceeds 2^64 - 1.
std::optional<uint64_t> size_value(const SizeText& t) {
  if (!t.fractional) {
    // Exact integer path: plain byte counts must not pass through a double.
    uint64_t value = 0;
    for (char c : t.number) {
      const uint64_t digit = static_cast<uint64_t>(c - '0');
      if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) return std::nullopt;
      value = value * 10 + digit;
    }
    if (value > std::numeric_limits<uint64_t>::max() / t.int_scale) return std::nullopt;
    return value * t.int_scale;
  }
  const double value = std::strtod(t.number.c_str(), nullptr) * t.scale;
  // Half away from zero, as llround did; 2^64 is exact in a double and every double
  // below it converts to uint64_t without overflow.
  const double rounded = std::round(value);
  if (!(rounded >= 0) || rounded >= 18446744073709551616.0) return std::nullopt;
  return static_cast<uint64_t>(rounded);
}

}  // namespace

std::optional<uint64_t> parse_size(std::string_view text) {
  const SizeText t = split_size(text);
  if (t.problem != SizeText::Problem::none) return std::nullopt;
  return size_value(t);
}

std::string size_parse_problem(std::string_view text) {
  const SizeText t = split_size(text);
  switch (t.problem) {
    case SizeText::Problem::no_number: return "not a non-negative number";
    case SizeText::Problem::trailing: return "unexpected text after the unit";
    case SizeText::Problem::unit:
      return "unknown unit '" + t.unit + "' (B, KiB, MiB, GiB, TiB, PiB, EiB, KB, MB, GB, TB, PB, EB)";
    case SizeText::Problem::none: break;
  }
  if (!size_value(t)) return "more than 2^64 - 1 bytes (the limit, just under 16 EiB)";
  return "";
}

}  // namespace memsim
