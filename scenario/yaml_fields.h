// Typed, located reading of scenario values (internal to the scenario loader).
//
// Every value the loader reads is a Field: a YAML node plus where it came from
// ("FILE:LINE" for a file, "--set" for a command-line override). Each reader either
// returns a checked value or throws ScenarioError "WHERE: KEY: message"; none of them
// lets a yaml-cpp exception or a silent default through.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace memsim::scenario_detail {

struct Field {
  YAML::Node node;
  std::string where;  // "FILE:LINE" or "--set"
};

// Throws ScenarioError "WHERE: KEY: message" ("--set KEY: message" for an override).
[[noreturn]] void fail(std::string_view where, std::string_view key, std::string_view message);

// Optimal-string-alignment distance (an adjacent swap counts 1), case-insensitive.
size_t edit_distance(std::string_view a, std::string_view b);
// "; did you mean 'x'?" for the closest candidate when it is close enough, else "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// How a value reads in a message: 'text' for a scalar, "a list", "a mapping", "nothing".
std::string describe(const YAML::Node& node);
// Null node, or a scalar spelled null / Null / NULL / ~ / empty.
bool is_null(const YAML::Node& node);

std::string read_string(const Field& f, std::string_view key);
// Integer >= min_value (1: "a positive integer", 0: "a non-negative integer").
int64_t read_int(const Field& f, std::string_view key, int64_t min_value);
double read_number(const Field& f, std::string_view key);
bool read_bool(const Field& f, std::string_view key);
// "80GiB", "500MiB", "80GB", or a plain byte count (allocator/units.h parse_size).
uint64_t read_size(const Field& f, std::string_view key);
// A list of scalars (or one scalar, read as a list of one).
std::vector<std::string> read_string_list(const Field& f, std::string_view key);
// read_string_list with each item split at commas ("q_proj,v_proj", as --set spells a
// list), every piece trimmed of spaces and tabs, empty pieces dropped.
std::vector<std::string> read_name_list(const Field& f, std::string_view key);

// One of `choices` (the scenario-file spellings); the error lists them.
template <typename E>
E read_enum(const Field& f, std::string_view key,
            const std::vector<std::pair<std::string, E>>& choices) {
  const std::string text = read_string(f, key);
  std::vector<std::string> names;
  for (const auto& [name, value] : choices) {
    if (name == text) return value;
    names.push_back(name);
  }
  std::string list;
  for (const auto& name : names) list += (list.empty() ? "" : ", ") + name;
  fail(f.where, key, "expected one of " + list + ", got '" + text + "'" + did_you_mean(text, names));
}

}  // namespace memsim::scenario_detail
