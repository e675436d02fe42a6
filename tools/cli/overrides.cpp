#include "tools/cli/overrides.h"

#include "tools/cli/errors.h"

namespace memsim::cli {

Overrides parse_overrides(const std::vector<std::string>& args) {
  Overrides out;
  for (const std::string& arg : args) {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw UsageError("--set expects KEY=VALUE, got '" + arg + "'");
    }
    out.emplace_back(arg.substr(0, eq), arg.substr(eq + 1));
  }
  return out;
}

}  // namespace memsim::cli
