// One-line descriptions of a Scenario for the terminal summary.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "sim/scenario.h"

namespace memsim::cli {

// ("model", "cs336-xl: cs336, 32 layers, d_model 2560, ..."), ("batch", ...),
// ("training", ...), ("device", ...): the facts that decide the memory.
std::vector<std::pair<std::string, std::string>> scenario_facts(const Scenario& scenario);

}  // namespace memsim::cli
