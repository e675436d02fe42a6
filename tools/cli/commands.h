// The memsim subcommands. Each add_* registers its options on the CLI11 app (filling the
// args struct when parsed); each run_* does the work and returns the exit status
// (tools/cli/errors.h). run_* throw ScenarioError / SnapshotError / ConfigError /
// InputError / UsageError for bad input; tools/memsim.cpp maps them to exit statuses.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace memsim::cli {

// A positive integer option (--max-seqs, --global-batch, --micro-batches): CLI11's
// PositiveNumber answered "Value 0 not in range 0.000000 to 1.797...e+308" (and the same
// for "abc"), naming neither the rule nor the value's problem.
inline const CLI::Validator kPositiveInteger(
    [](std::string& v) -> std::string {
      try {
        size_t used = 0;
        const long long n = std::stoll(v, &used);
        if (used == v.size() && n > 0) return "";
      } catch (const std::exception&) {
      }
      return "expected a positive integer, got '" + v + "'";
    },
    "POSITIVE");

// memsim run [SCENARIO] [--model CONFIG.json] [--set KEY=VALUE]... [--json FILE|-]
//            [--timeline FILE.csv] [--trace FILE.json] [--snapshot FILE.pickle]
//            [--html FILE.html] [--advise]   (SCENARIO, --model or both)
struct RunArgs {
  std::string scenario;  // "" with --model alone
  std::string model;     // a Hugging Face config.json (or its folder) replacing the model

  std::vector<std::string> sets;
  std::string json;      // "" = none, "-" = stdout (the terminal summary is then skipped)
  std::string timeline;  // "" = none
  std::string trace;     // Chrome/Perfetto trace JSON (tools/cli/trace_report.h)
  std::string snapshot;  // PyTorch memory snapshot pickle (tools/cli/snapshot_report.h)
  std::string html;      // self-contained HTML page (tools/cli/html_report.h)
  // issue #19 item 2: every change memsim can simulate, simulated (tools/cli/advice_report.h);
  // an OOM run prints a short list without it.
  bool advise = false;
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
  std::string html;
};
CLI::App* add_replay_command(CLI::App& app, ReplayArgs& args);
int run_replay(const ReplayArgs& args);

// memsim check SCENARIO [--set K=V]... [--policies LIST] [--fd-samples N]
// (tools/cli/check_command.cpp). Exit 0 all checks pass, 4 a check failed, 1 refused.
struct CheckArgs {
  std::string scenario;
  std::vector<std::string> sets;
  std::string policies;
  int fd_samples = 3;
  int64_t test_drop_save = -1;  // hidden: fault injection for the test suite
  int64_t test_drop_optimizer_state = -1;  // hidden: sim/check/numeric_check.h
};
CLI::App* add_check_command(CLI::App& app, CheckArgs& args);
int run_check(const CheckArgs& args);

// memsim compare SCENARIO --policies none,full,uniform:2,... [--set K=V]... [--json FILE|-]
//                         [--html FILE.html]
// (tools/cli/compare_command.cpp). Exit 0 when at least one policy fits, 3 when none does.
struct CompareArgs {
  std::string scenario;
  std::string policies;
  std::vector<std::string> sets;
  std::string json;
  std::string html;  // one curve per policy (tools/cli/html_report.h)
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
  // issue #18 item 2 (sim/search/config_search.h): set, the search covers micro-batch x
  // gradient accumulation at a fixed global batch and the optimizer implementation.
  std::string objective;               // "" (the checkpoint plan only), time, memory
  int64_t global_batch = 0;            // 0: batch.micro_batch x batch.grad_accum
  std::vector<int64_t> micro_batches;  // empty: every divisor of the global batch
};
CLI::App* add_optimize_command(CLI::App& app, OptimizeArgs& args);
int run_optimize(const OptimizeArgs& args);

// memsim sweep SCENARIO --vary KEY=V1,V2,... [--vary ...] [--max KEY] [--set K=V]...
//              [--json FILE|-] [--csv FILE|-] [-j N] (tools/cli/sweep_command.cpp).
// Exit 0 when at least one point fits (grid) or has a largest fit (--max), 3 when none
// does; points that do not fit or are impossible are rows of the result, not failures.
struct SweepArgs {
  std::string scenario;
  std::vector<std::string> vary;
  std::string max;  // "" = grid mode
  std::vector<std::string> sets;
  std::string json;
  std::string csv;
  int threads = 0;  // 0 = all cores
};
CLI::App* add_sweep_command(CLI::App& app, SweepArgs& args);
int run_sweep(const SweepArgs& args);

// memsim serve [SCENARIO] [--model CONFIG.json] [--set K=V]... [--json FILE|-]
//              [--html FILE.html] [--max-model-len-that-fits] [--max-seqs LEN]
//              [--min-tp [MAX]] [--vary KEY=V1,V2,...]... (tools/cli/serve_command.cpp,
//              docs/serve.md; issue #17).
// Exit 0 when the engine starts, 3 when no KV cache fits, 1 on bad input.
struct ServeArgs {
  std::string scenario;
  std::string model;
  std::vector<std::string> sets;
  std::string json;
  std::string html;
  bool len_that_fits = false;
  int64_t max_seqs_len = 0;            // 0 = not asked
  std::optional<int64_t> min_tp;       // set (0 = default max 8) when --min-tp is given
  std::vector<std::string> vary;       // --vary KEY=V1,V2,...: one plan per point (a table)
};
CLI::App* add_serve_command(CLI::App& app, ServeArgs& args);
int run_serve(const ServeArgs& args);

// memsim presets
CLI::App* add_presets_command(CLI::App& app);
int run_presets();

// memsim completion bash: the bash completion script of `app` (tools/cli/completion_command.cpp).
struct CompletionArgs {
  std::string shell;
};
CLI::App* add_completion_command(CLI::App& app, CompletionArgs& args);
int run_completion(CLI::App& app, const CompletionArgs& args);

}  // namespace memsim::cli
