// Numeric Adafactor (transformers.optimization.Adafactor with its defaults) for numeric
// mode (sim/check/numeric_check.h).
//
// Contract:
//  - NumericAdafactor is the modelled kernel: transformers' step() line by line (lr=None,
//    eps (1e-30, 1e-3), clip_threshold 1.0, decay_rate -0.8, beta1 None, weight_decay 0,
//    scale_parameter, relative_step, warmup_init False), on fp32 parameters (no upcast).
//    Its state lives ONLY in the buffers the schedule's optimizer allocated and registered
//    (sim/optim/optimizer_adafactor.cpp -> NumericContext::optimizer_state): exp_avg_sq_row /
//    exp_avg_sq_col for a parameter of 2 dims (factored), exp_avg_sq for 1 dim, and the
//    0-d "RMS" of each step; zero-filled on the parameter's first step (torch.zeros), read
//    through NumericContext::read after, so a freed, missing or re-created state buffer
//    is a violation or a NumericError. state["step"] is a Python int (no buffer).
//  - AdafactorReference is Shazeer & Stern (2018) Algorithm 4/5 written independently:
//    row and column SUMS R, C (not means), V = R C / (1^T R) per element, explicit loops,
//    its own state arrays.
//  - test_step_offset (test-only sabotage): the modelled kernel uses step + offset.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <vector>

#include "graph/numeric/numeric.h"

namespace memsim {

struct AdafactorHyper {  // transformers' defaults
  double eps1 = 1e-30, eps2 = 1e-3, clip_threshold = 1.0, decay_rate = -0.8;
};

class NumericAdafactor {
 public:
  // params[i] updated in place with grads[i] (null: skipped, as torch does).
  void step(graph::Runtime& rt, graph::NumericContext& c, const std::vector<Eigen::ArrayXd*>& params,
            const std::vector<const Eigen::ArrayXd*>& grads);
  int64_t test_step_offset = 0;

 private:
  std::vector<int64_t> step_;
  AdafactorHyper h_;
};

class AdafactorReference {
 public:
  void step(const std::vector<std::vector<int64_t>>& shapes, const std::vector<Eigen::ArrayXd*>& params,
            const std::vector<const Eigen::ArrayXd*>& grads);

 private:
  std::vector<int64_t> t_;
  std::vector<Eigen::ArrayXd> R_, C_, V_;  // row sums, column sums (2-D); V (1-D)
  AdafactorHyper h_;
};

}  // namespace memsim
