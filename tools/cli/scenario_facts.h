// One-line descriptions of a Scenario for the terminal summary.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "program/rank_info.h"
#include "scenario/scenario.h"

namespace memsim::cli {

// ("model", "cs336-xl: cs336, 32 layers, d_model 2560, ..., 2.69B parameters"), ("batch",
// ...), ("training", ...), ("device", ...): the facts that decide the memory. With `rank`
// (the simulated one), the model line also gives the parameters that rank holds when the
// run shards them.
std::vector<std::pair<std::string, std::string>> scenario_facts(const Scenario& scenario,
                                                                const RankInfo* rank = nullptr);

}  // namespace memsim::cli
