// --set KEY=VALUE arguments.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace memsim::cli {

using Overrides = std::vector<std::pair<std::string, std::string>>;

// Splits each "KEY=VALUE" at its first '='. Throws UsageError for an argument with no
// '=' or an empty key. The value may be empty or contain more '='; checking the key and
// the value is the scenario loader's job (its errors name "--set KEY").
Overrides parse_overrides(const std::vector<std::string>& args);

}  // namespace memsim::cli
