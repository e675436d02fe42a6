// memsim presets: the names `model.preset` and `device.preset` accept.
#include <algorithm>
#include <cstdio>

#include "scenario/scenario.h"
#include "tools/cli/commands.h"
#include "tools/cli/errors.h"
#include "tools/cli/style.h"

namespace memsim::cli {

namespace {

void print_table(const char* title, const std::vector<PresetInfo>& presets, const Style& style) {
  std::printf("%s\n", style.bold(title).c_str());
  size_t width = 0;
  for (const PresetInfo& p : presets) width = std::max(width, p.name.size());
  for (const PresetInfo& p : presets) {
    const std::string pad(width - p.name.size(), ' ');
    std::printf("  %s%s  %s\n", p.name.c_str(), pad.c_str(), p.summary.c_str());
    if (!p.source.empty()) {
      std::printf("  %s  %s\n", std::string(width, ' ').c_str(), style.dim(p.source).c_str());
    }
  }
}

}  // namespace

CLI::App* add_presets_command(CLI::App& app) {
  return app.add_subcommand("presets", "List the model and device presets");
}

int run_presets() {
  const Style style = Style::for_stream(stdout);
  print_table("Model presets (model.preset)", model_presets(), style);
  std::printf("\n");
  print_table("Device presets (device.preset)", device_presets(), style);
  return kExitFits;
}

}  // namespace memsim::cli
