// The error a scenario text loads or builds with (tests that check refusals by key).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario.h"

namespace memsim_test {

// What load_scenario_text(yaml, file, sets) throws as a ScenarioError, empty when it loads.
inline std::string scenario_error(const std::string& yaml, const std::string& file,
                                  const std::vector<std::pair<std::string, std::string>>& sets = {}) {
  try {
    memsim::load_scenario_text(yaml, file, sets);
  } catch (const memsim::ScenarioError& e) {
    return e.what();
  }
  return "";
}

// What `build()` (loading and building a scenario, e.g. a lambda calling build_program)
// throws as a ScenarioError; empty when it builds.
template <typename Build>
std::string refusal_of(Build&& build) {
  try {
    build();
  } catch (const memsim::ScenarioError& e) {
    return e.what();
  }
  return "";
}

}  // namespace memsim_test
