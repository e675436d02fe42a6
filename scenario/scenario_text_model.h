// load_scenario_with_model with the scenario's text given (scenario/scenario.cpp): `memsim
// run - --model CONFIG` reads the scenario from standard input (tools/cli/scenario_input.h),
// and the Python module passes a dict as text. `source` names the text in errors; "" means
// no scenario (every other section at its default), as load_scenario_with_model's "" path.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario.h"

namespace memsim {

Scenario load_scenario_text_with_model(const std::string& text, const std::string& source,
                                       const std::string& model_path,
                                       const std::vector<std::pair<std::string, std::string>>& overrides = {});

}  // namespace memsim
