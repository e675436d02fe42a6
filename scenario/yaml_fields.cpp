#include "scenario/yaml_fields.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "allocator/units.h"
#include "scenario/scenario.h"

namespace memsim::scenario_detail {
namespace {

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

// The scalar's text, or an error naming what was there instead.
std::string scalar_text(const Field& f, std::string_view key, std::string_view expected) {
  if (!f.node.IsScalar() || is_null(f.node)) {
    fail(f.where, key, "expected " + std::string(expected) + ", got " + describe(f.node));
  }
  return f.node.Scalar();
}

}  // namespace

void fail(std::string_view where, std::string_view key, std::string_view message) {
  // A command-line value reads "--set KEY: ..." (or "--model model.hf_config: ..."), the
  // way it was typed; a file value
  // reads "FILE:LINE: KEY: ...", the way compilers point at a line.
  const char* separator = where == "--set" || where == "--model" ? " " : ": ";
  throw ScenarioError(std::string(where) + separator + std::string(key) + ": " + std::string(message));
}

size_t edit_distance(std::string_view a, std::string_view b) {
  // Three rolling rows: the adjacent-swap rule looks two rows back.
  std::vector<size_t> two(b.size() + 1), one(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) one[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      cur[j] = std::min({one[j] + 1, cur[j - 1] + 1, one[j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
          lower(a[i - 2]) == lower(b[j - 1])) {
        cur[j] = std::min(cur[j], two[j - 2] + 1);
      }
    }
    std::swap(two, one);
    std::swap(one, cur);
  }
  return one[b.size()];
}

namespace {

bool starts_with_nocase(std::string_view text, std::string_view prefix) {
  if (prefix.size() > text.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(text[i])) != std::tolower(static_cast<unsigned char>(prefix[i])))
      return false;
  return true;
}

}  // namespace

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  // Names that start with the word come first: "h100" means the H100 presets
  // ("h100-80gb"), not the nearest spelling ("h200"). At most four are listed.
  if (word.size() >= 2) {
    std::vector<const std::string*> prefixed;
    for (const auto& candidate : candidates)
      if (candidate.size() > word.size() && starts_with_nocase(candidate, word)) prefixed.push_back(&candidate);
    if (!prefixed.empty()) {
      constexpr size_t kListed = 4;
      const size_t listed = std::min(prefixed.size(), kListed);
      std::string names;
      for (size_t i = 0; i < listed; ++i) {
        if (i > 0) names += i + 1 == listed && prefixed.size() <= kListed ? " or " : ", ";
        names += "'" + *prefixed[i] + "'";
      }
      if (prefixed.size() > kListed) names += " or one of " + std::to_string(prefixed.size() - kListed) + " more";
      return "; did you mean " + names + "?";
    }
  }
  // Close enough = at most a third of the word wrong, and never more than 3 edits, so a
  // typo gets a hint and an unrelated word gets none.
  const size_t limit = std::min<size_t>(3, std::max<size_t>(1, word.size() / 3));
  const std::string* best = nullptr;
  size_t best_distance = limit + 1;
  for (const auto& candidate : candidates) {
    const size_t d = edit_distance(word, candidate);
    if (d < best_distance) {
      best = &candidate;
      best_distance = d;
    }
  }
  return best ? "; did you mean '" + *best + "'?" : "";
}

bool is_null(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return true;
  if (!node.IsScalar()) return false;
  const std::string& s = node.Scalar();
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

std::string describe(const YAML::Node& node) {
  if (is_null(node)) return "nothing (null)";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "'" + node.Scalar() + "'";
}

std::string read_string(const Field& f, std::string_view key) {
  return scalar_text(f, key, "a string");
}

int64_t read_int(const Field& f, std::string_view key, int64_t min_value) {
  const std::string what = min_value == 1   ? "a positive integer"
                           : min_value == 0 ? "a non-negative integer"
                                            : "an integer >= " + std::to_string(min_value);
  const std::string text = scalar_text(f, key, what);
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range) {
    fail(f.where, key, "expected " + what + ", got '" + text + "' (does not fit in 64 bits)");
  }
  if (ec != std::errc() || ptr != end || value < min_value) {
    fail(f.where, key, "expected " + what + ", got '" + text + "'");
  }
  return value;
}

double read_number(const Field& f, std::string_view key) {
  const std::string text = scalar_text(f, key, "a number");
  // strtod is locale-dependent in theory; scenario numbers are plain "0.1", which every C
  // locale reads the same. It also takes "inf"/"nan", rejected below.
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value) ||
      std::isspace(static_cast<unsigned char>(text.front()))) {
    fail(f.where, key, "expected a number, got '" + text + "'");
  }
  return value;
}

bool read_bool(const Field& f, std::string_view key) {
  const std::string text = scalar_text(f, key, "true or false");
  std::string low;
  for (char c : text) low += lower(c);
  // YAML 1.1 spellings too, since yaml-cpp (and PyYAML users) write them.
  if (low == "true" || low == "yes" || low == "on") return true;
  if (low == "false" || low == "no" || low == "off") return false;
  fail(f.where, key, "expected true or false, got '" + text + "'");
}

uint64_t read_size(const Field& f, std::string_view key) {
  const std::string what = "a size such as 80GiB, 500MiB, 80GB or a byte count";
  const std::string text = scalar_text(f, key, what);
  if (auto bytes = parse_size(text)) return *bytes;
  fail(f.where, key, "expected " + what + ", got '" + text + "': " + size_parse_problem(text));
}

std::vector<std::string> read_string_list(const Field& f, std::string_view key) {
  std::vector<std::string> out;
  if (is_null(f.node)) return out;
  if (f.node.IsScalar()) return {f.node.Scalar()};
  if (!f.node.IsSequence()) fail(f.where, key, "expected a list, got " + describe(f.node));
  for (const auto& item : f.node) {
    if (!item.IsScalar() || is_null(item)) {
      fail(f.where, key, "expected a list of names or numbers, got " + describe(item) + " as an item");
    }
    out.push_back(item.Scalar());
  }
  return out;
}

std::vector<std::string> read_name_list(const Field& f, std::string_view key) {
  std::vector<std::string> names;
  for (const std::string& item : read_string_list(f, key)) {
    size_t start = 0;
    while (start <= item.size()) {
      const size_t comma = std::min(item.find(',', start), item.size());
      std::string name = item.substr(start, comma - start);
      name.erase(0, name.find_first_not_of(" \t"));
      name.erase(name.find_last_not_of(" \t") + 1);
      if (!name.empty()) names.push_back(name);
      start = comma + 1;
    }
  }
  return names;
}

}  // namespace memsim::scenario_detail
