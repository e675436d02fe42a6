#include "tools/cli/scenario_input.h"

#include <cstdio>
#include <iostream>
#include <iterator>

#include "tools/cli/errors.h"
#include "tools/cli/output.h"

namespace memsim::cli {

const std::string& stdin_scenario_text() {
  static const std::string text = [] {
    std::string t((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    if (std::cin.bad()) throw InputError(std::string(kStdinName) + ": cannot read standard input");
    return t;
  }();
  return text;
}

Scenario load_scenario_arg(const std::string& arg, const Overrides& overrides) {
  if (arg == "-") return load_scenario_text(stdin_scenario_text(), kStdinName, overrides);
  return load_scenario(arg, overrides);
}

Scenario load_scenario_arg_with_model(const std::string& arg, const std::string& model,
                                      const Overrides& overrides) {
  if (arg == "-") return load_scenario_text_with_model(stdin_scenario_text(), kStdinName, model, overrides);
  return load_scenario_with_model(arg, model, overrides);
}

SweepRunner sweep_runner_arg(const std::string& arg, const Overrides& overrides) {
  if (arg != "-") {
    check_input_file(arg);
    return SweepRunner::from_file(arg, overrides);
  }
  load_scenario_text(stdin_scenario_text(), kStdinName, overrides);  // its errors first
  return SweepRunner(stdin_scenario_text(), kStdinName, overrides);
}

}  // namespace memsim::cli
