// spdlog setup for the command line: messages go to stderr (stdout carries reports and
// may be JSON), quiet by default.
#pragma once

namespace memsim::cli {

// 0: warnings and errors only; 1 (-v): info; 2+ (-vv): debug.
void setup_logging(int verbosity);

}  // namespace memsim::cli
