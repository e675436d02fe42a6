#include "tools/cli/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace memsim::cli {

void setup_logging(int verbosity) {
  // spdlog's default logger writes to stdout; replace it so `--json -` stays clean JSON.
  auto logger = spdlog::get("memsim");
  if (!logger) logger = spdlog::stderr_color_mt("memsim");
  logger->set_pattern("memsim: %l: %v");
  spdlog::set_default_logger(logger);
  spdlog::level::level_enum level = spdlog::level::warn;
  if (verbosity == 1) level = spdlog::level::info;
  if (verbosity >= 2) level = spdlog::level::debug;
  spdlog::set_level(level);
}

}  // namespace memsim::cli
