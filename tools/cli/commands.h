// The memsim subcommands. Each add_* registers its options on the CLI11 app (filling the
// args struct when parsed); each run_* does the work and returns the exit status
// (tools/cli/errors.h). run_* throw ScenarioError / SnapshotError / ConfigError /
// InputError / UsageError for bad input; tools/memsim.cpp maps them to exit statuses.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace memsim::cli {

// memsim run SCENARIO [--set KEY=VALUE]... [--json FILE|-] [--timeline FILE.csv]
struct RunArgs {
  std::string scenario;
  std::vector<std::string> sets;
  std::string json;      // "" = none, "-" = stdout (the terminal summary is then skipped)
  std::string timeline;  // "" = none
};
CLI::App* add_run_command(CLI::App& app, RunArgs& args);
int run_run(const RunArgs& args);

// memsim replay SNAPSHOT.pickle [--set allocator.KEY=VALUE]... [--json FILE|-]
//                               [--timeline FILE.csv]
struct ReplayArgs {
  std::string snapshot;
  std::vector<std::string> sets;
  std::string json;
  std::string timeline;
};
CLI::App* add_replay_command(CLI::App& app, ReplayArgs& args);
int run_replay(const ReplayArgs& args);

// memsim compare SCENARIO --policies none,full,uniform:2,... [--set K=V]... [--json FILE|-]
// (tools/cli/compare_command.cpp). Exit 0 when at least one policy fits, 3 when none does.
struct CompareArgs {
  std::string scenario;
  std::string policies;
  std::vector<std::string> sets;
  std::string json;
};
CLI::App* add_compare_command(CLI::App& app, CompareArgs& args);
int run_compare(const CompareArgs& args);

// memsim optimize SCENARIO --budget 40GiB [--set K=V]... [--json FILE|-]
// (tools/cli/optimize_command.cpp). Exit 0 with a plan that fits, 3 when nothing fits.
struct OptimizeArgs {
  std::string scenario;
  std::string budget;
  std::vector<std::string> sets;
  std::string json;
};
CLI::App* add_optimize_command(CLI::App& app, OptimizeArgs& args);
int run_optimize(const OptimizeArgs& args);

// memsim presets
CLI::App* add_presets_command(CLI::App& app);
int run_presets();

}  // namespace memsim::cli
