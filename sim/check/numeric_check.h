// `memsim check`: proves a scenario's schedule numerically (graph/numeric/numeric.h).
//
// Contract (run_numeric_check):
//  1. Runs the scenario's program (warm-up steps + measured step) with a NumericContext
//     attached: every op computed in double in the Program's event order, freed buffers
//     poisoned. The first backward's loss and .grad are kept.
//  2. Finite differences: for sampled entries of every parameter (the largest-|grad|
//     entry plus fd_samples others), fourth-order central differences of the first loss in double
//     (forward+backward runs with the parameter perturbed); max relative error.
//  3. Every checkpointing policy (policies; default: none, full, uniform:2, block:1,
//     modules, selective, sqrt, custom, and full reentrant / without early stop) gives a
//     loss, gradients and final parameters bit-identical to the policy-none run.
//  4. Every optimizer step: the update as memsim models the implementation equals the
//     textbook reference (sim/optim/numeric_optimizer.h; Adafactor sim/optim/numeric_adafactor.h,
//     bitsandbytes 8-bit Adam(W) sim/optim/numeric_adam8bit.h, whose state lives in the buffers
//     the schedule allocated) within optimizer_tolerance.
//  Any violation (a read of a freed buffer), NumericError, NaN or mismatch is a failure
//  listed in the report. validate_numeric_scenario throws ScenarioError for a scenario
//  numeric mode refuses (non-fp32, SDPA for hf-gpt2, megatron model parallelism,
//  dropout inside SDPA / fused attention, LoRA, Adafactor outside the hf families, 8-bit
//  optimizers for megatron, several processes, too large).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/numeric/numeric.h"
#include "scenario/scenario.h"

namespace memsim {

struct NumericCheckOptions {
  std::vector<std::string> policies;  // empty: the default list (see above)
  int fd_samples = 3;                 // sampled entries per parameter besides the largest
  double fd_step = 1e-3;              // of the fourth-order central difference
  double fd_tolerance = 1e-6;         // max relative FD error
  double optimizer_tolerance = 1e-10; // max normwise relative error of an update
  // Test-only fault injection (graph::Runtime::test_drop_save) in every run.
  int64_t test_drop_save = -1;
  // Test-only sabotage of the Adafactor / 8-bit kernels: the k-th optimizer state tensor
  // is freed as soon as the schedule creates it; the modelled kernel's step count is off.
  int64_t test_drop_optimizer_state = -1;
  int64_t test_optimizer_step_offset = 0;
};

struct PolicyCheck {
  std::string policy;
  bool identical = false;
  double max_abs_diff = 0;  // over loss, grads, final parameters
  std::string error;        // a violation or NumericError, "" if none
};

struct NumericCheckReport {
  double loss = 0;
  int64_t parameters = 0;
  double fd_max_rel_error = 0;
  int fd_points = 0;
  std::string fd_worst;  // "layers.0.ffn.w1.weight[12]: analytic ..., fd ..."
  std::vector<PolicyCheck> policies;
  std::string optimizer;
  int optimizer_steps = 0;
  double optimizer_max_rel_error = 0;
  int optimizer_8bit_params = 0;  // bitsandbytes 8-bit: parameters with quantised state
  int64_t quantisations = 0;       // 8-bit: values quantised strictly inside (-1, 1)
  double quantisation_margin = 0;  // their smallest relative distance to a code midpoint
  std::vector<std::string> failures;
  bool passed() const { return failures.empty(); }
};

void validate_numeric_scenario(const Scenario& scenario);
// The tiny model numeric mode builds for a scenario (family, shapes, seed).
graph::NumericModel numeric_model(const Scenario& scenario);
NumericCheckReport run_numeric_check(const Scenario& scenario, const NumericCheckOptions& options);

}  // namespace memsim
