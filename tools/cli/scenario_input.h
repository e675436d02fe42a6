// The SCENARIO argument of run, compare, sweep, optimize and check: a scenario file, or
// "-" for standard input. Standard input is read once, to its end, and named "<stdin>" in
// errors ("<stdin>:3: batch.seq_len: ..."); paths inside it (model.hf_config,
// deepspeed.config) are relative to the working directory.
#pragma once

#include <string>

#include "scenario/scenario.h"
#include "scenario/scenario_text_model.h"
#include "sim/search/sweep.h"
#include "tools/cli/overrides.h"

namespace memsim::cli {

inline constexpr const char* kStdinName = "<stdin>";

// The scenario's text from standard input (the first call reads it; later calls return
// the same text). Throws InputError when stdin cannot be read.
const std::string& stdin_scenario_text();

// load_scenario(arg, overrides), or the same from standard input for "-".
Scenario load_scenario_arg(const std::string& arg, const Overrides& overrides);
// load_scenario_with_model for `run --model`, SCENARIO "" (none), a file or "-".
Scenario load_scenario_arg_with_model(const std::string& arg, const std::string& model,
                                      const Overrides& overrides);
// SweepRunner::from_file, or from standard input for "-" (checked by loading it once).
SweepRunner sweep_runner_arg(const std::string& arg, const Overrides& overrides);

}  // namespace memsim::cli
