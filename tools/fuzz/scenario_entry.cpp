// See tools/fuzz/entries.h.
#include <string>
#include <utility>
#include <vector>

#include "allocator/allocator_config.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/step/event_budget.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "tools/cli/device.h"
#include "tools/fuzz/entries.h"

namespace memsim::fuzz {

void scenario_entry(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string yaml = input;
  std::vector<std::pair<std::string, std::string>> sets;
  const std::string marker = "#--set\n";
  size_t at = input.rfind(marker, 0) == 0 ? 0 : input.find("\n" + marker);
  if (at != std::string::npos) {
    if (at != 0) ++at;  // keep the newline that ends the YAML
    yaml = input.substr(0, at);
    size_t line = at + marker.size();
    while (line < input.size()) {
      size_t end = input.find('\n', line);
      if (end == std::string::npos) end = input.size();
      const std::string arg = input.substr(line, end - line);
      const size_t eq = arg.find('=');
      // memsim's --set refuses these before the loader (tools/cli/overrides.cpp).
      if (eq != std::string::npos && eq != 0) sets.emplace_back(arg.substr(0, eq), arg.substr(eq + 1));
      line = end + 1;
    }
  }
  Scenario scenario;
  try {
    scenario = load_scenario_text(yaml, "<fuzz>", sets);
  } catch (const ScenarioError&) {
    return;
  } catch (const ConfigError&) {
    return;
  }
  if (estimated_events(scenario) > kFuzzEvents) return;  // too slow per input, not a bug
  Program program;
  try {
    program = build_program(scenario);
  } catch (const ScenarioError&) {
    return;  // refused by a family's or a stack's own checks
  }
  auto device = cli::make_device(scenario.device);
  const Timeline timeline = execute(program, scenario.allocator, *device);
  analyze(program, timeline);
}

}  // namespace memsim::fuzz
