#include "allocator/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

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

std::optional<uint64_t> parse_size(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t start = i;
  bool seen_digit = false, seen_dot = false;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) ||
                             (text[i] == '.' && !seen_dot))) {
    if (text[i] == '.') seen_dot = true; else seen_digit = true;
    ++i;
  }
  if (!seen_digit) return std::nullopt;
  std::string number(text.substr(start, i - start));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) unit += text[i++];
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) return std::nullopt;

  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KiB") scale = double(KiB);
  else if (unit == "MiB") scale = double(MiB);
  else if (unit == "GiB") scale = double(GiB);
  else if (unit == "TiB") scale = 1024.0 * double(GiB);
  else if (unit == "KB" || unit == "kB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "TB") scale = 1e12;
  else return std::nullopt;

  if (!seen_dot) {
    // Exact integer path: plain byte counts must not pass through a double.
    uint64_t value = 0;
    for (char c : number) {
      uint64_t digit = static_cast<uint64_t>(c - '0');
      if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) return std::nullopt;
      value = value * 10 + digit;
    }
    uint64_t s = static_cast<uint64_t>(scale);
    if (s != 0 && value > std::numeric_limits<uint64_t>::max() / s) return std::nullopt;
    return value * s;
  }
  double value = std::strtod(number.c_str(), nullptr) * scale;
  if (!(value >= 0) || value >= 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(std::llround(value));
}

}  // namespace memsim
