// memsim check SCENARIO: numeric mode (sim/check/numeric_check.h). Runs the scenario's program
// with real numbers and prints the finite-difference error, the checkpointing-policy
// comparison and the optimizer check. Exit 0: every check passed; 4 (kExitCheckFailed):
// a check failed; 1: bad input or a scenario numeric mode refuses (family, size, ...).
#include <cstdio>
#include <string>
#include <vector>

#include "sim/check/numeric_check.h"
#include "sim/step/checkpoint_policy.h"
#include "tools/cli/commands.h"
#include "tools/cli/errors.h"
#include "tools/cli/overrides.h"
#include "tools/cli/terminal_text.h"
#include "tools/cli/scenario_input.h"

namespace memsim::cli {

CLI::App* add_check_command(CLI::App& app, CheckArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "check", "Prove a tiny scenario's schedule numerically (gradients vs finite "
               "differences, checkpointing policies bit-identical, optimizer step)");
  cmd->add_option("SCENARIO", args.scenario, "Scenario file (YAML; - for standard input), a tiny cs336, hf-llama or hf-gpt2 model")->required();
  cmd->add_option("--set", args.sets, "Override a scenario key, e.g. --set model.layers=3")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--policies", args.policies,
                  "Policies to compare with none (default: every kind; a policy may end in "
                  "+reentrant or +no-early-stop)");
  cmd->add_option("--fd-samples", args.fd_samples,
                  "Finite-difference entries per parameter besides the largest-gradient one")
      ->check(CLI::Range(0, 1000));
  // Hidden, for the test suite: the N-th save takes no reference (a schedule bug).
  cmd->add_option("--test-drop-save", args.test_drop_save)->group("");
  // Hidden: the N-th optimizer state tensor is freed as soon as it is created.
  cmd->add_option("--test-drop-optimizer-state", args.test_drop_optimizer_state)->group("");
  cmd->footer("Exit status: 0 every check passes, 4 a check failed, 1 bad input or a refused scenario, 2 bad usage.");
  return cmd;
}

int run_check(const CheckArgs& args) {
  const Overrides overrides = parse_overrides(args.sets);
  const Scenario scenario = load_scenario_arg(args.scenario, overrides);
  NumericCheckOptions o;
  o.fd_samples = args.fd_samples;
  o.test_drop_save = args.test_drop_save;
  o.test_drop_optimizer_state = args.test_drop_optimizer_state;
  if (!args.policies.empty()) o.policies = split_policies(args.policies);
  const NumericCheckReport r = run_numeric_check(scenario, o);

  std::printf("%s: numeric check (%s, %lld parameters, double precision)\n",
              printable(scenario.name.empty() ? scenario.source : scenario.name).c_str(),
              to_string(scenario.model.family), static_cast<long long>(r.parameters));
  std::printf("  loss (first step)       %.12g\n", r.loss);
  std::printf("  finite differences      max relative error %.3e over %d entries%s\n",
              r.fd_max_rel_error, r.fd_points, r.fd_max_rel_error <= o.fd_tolerance ? "" : "  FAIL");
  if (!r.fd_worst.empty()) std::printf("                          worst: %s\n", r.fd_worst.c_str());
  std::printf("  checkpointing policies  (loss, gradients, final parameters vs policy none)\n");
  for (const PolicyCheck& p : r.policies)
    std::printf("    %-22s %s\n", p.policy.c_str(),
                p.identical ? "bit-identical"
                            : (p.error.empty() ? "DIFFERS (max |diff| " + std::to_string(p.max_abs_diff) + ")"
                                               : "FAIL: " + p.error).c_str());
  std::printf("  optimizer               %s, %d steps, max relative difference from the "
              "reference %.3e%s\n",
              r.optimizer.c_str(), r.optimizer_steps, r.optimizer_max_rel_error,
              r.optimizer_max_rel_error <= o.optimizer_tolerance ? "" : "  FAIL");
  if (r.optimizer_8bit_params > 0)
    std::printf("                          %d parameters with 8-bit block-wise state; %lld "
                "quantisations, the closest %.2e (relative) from a code midpoint\n",
                r.optimizer_8bit_params, static_cast<long long>(r.quantisations),
                r.quantisation_margin);
  if (r.passed()) {
    std::printf("all numeric checks passed\n");
    return kExitFits;
  }
  std::fflush(stdout);
  for (const std::string& f : r.failures) std::fprintf(stderr, "memsim: check failed: %s\n", f.c_str());
  return kExitCheckFailed;
}

}  // namespace memsim::cli
