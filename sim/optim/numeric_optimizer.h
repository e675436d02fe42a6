// Numeric optimizer updates for numeric mode (sim/check/numeric_check.h).
//
// Contract:
//  - NumericOptimizer applies the update the way memsim models the implementation
//    (sim/optim/optimizer_step.cpp: OptimizerConfig type + impl): the cs336 staff AdamW
//    (per-parameter lines, lr_t bias correction, decay before or after the update),
//    torch.optim Adam/AdamW (_single_tensor_adam / _multi_tensor_adam / fused share the
//    math: lerp, denom = sqrt(v)/sqrt(bc2) + eps, addcdiv with lr/bc1), torch SGD
//    (momentum buffer = clone(grad) on the first step, then buf*momentum + grad).
//  - ReferenceOptimizer is the textbook formula of the same algorithm, written
//    independently (bias-corrected m-hat / v-hat; Algorithm 1 of the CS336 handout).
//  - Hyperparameters are fixed (numeric_hyper): memsim's scenarios carry none.
//  - State is per parameter index; parameters with no grad are skipped (torch.optim).
#pragma once

#include <Eigen/Core>
#include <string>
#include <vector>

#include "scenario/scenario.h"

namespace memsim {

struct NumericHyper {
  double lr = 1e-2, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double momentum = 0.0;
};
NumericHyper numeric_hyper(const OptimizerConfig& config);
// "cs336 AdamW (decay before update)", "torch AdamW (foreach)", ...
std::string numeric_optimizer_name(const OptimizerConfig& config, bool cs336_decay_after);

class NumericOptimizer {
 public:
  NumericOptimizer(const OptimizerConfig& config, bool cs336_decay_after, bool reference);
  // params[i] updated in place with grads[i]; a null grad skips parameter i.
  void step(const std::vector<Eigen::ArrayXd*>& params,
            const std::vector<const Eigen::ArrayXd*>& grads);
  // Parameters exempt from weight decay (Megatron's no_wd group: biases and norm
  // parameters); empty: every parameter decays.
  void set_no_decay(std::vector<bool> no_decay) { no_decay_ = std::move(no_decay); }

 private:
  void modelled(size_t i, Eigen::ArrayXd& p, const Eigen::ArrayXd& g);
  void textbook(size_t i, Eigen::ArrayXd& p, const Eigen::ArrayXd& g);
  OptimizerConfig config_;
  NumericHyper h_;
  bool decay_after_, reference_;
  std::vector<Eigen::ArrayXd> m_, v_;
  std::vector<int64_t> t_;
  std::vector<bool> no_decay_;
  double decay(size_t i) const {
    return i < no_decay_.size() && no_decay_[i] ? 0.0 : h_.weight_decay;
  }  // per-parameter step count (torch keeps `step` per param)
};

}  // namespace memsim
