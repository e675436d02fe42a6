// optimizer.in_backward (torchtune's optimizer_in_bwd; issue #16 item 7;
// docs/implementations.md "Optimizer in backward"): one optimizer per parameter, stepped
// from the parameter's post-accumulate-grad hook, its .grad set to None right after.
//
// Modelled on pytorch/torchtune v0.6.1 (a6290a5b40758f13bca61c386bc8756a49ef417e):
// recipes/full_finetune_single_device.py _setup_optimizer (optim_dict = {p:
// config.instantiate(cfg_optimizer, [p]) for p in model.parameters()}; training.
// register_optim_in_bwd_hooks) and torchtune/training/memory.py register_optim_in_bwd_hooks
// (p.register_post_accumulate_grad_hook(optim_step) with optim_step = `optim_dict[param].
// step(); optim_dict[param].zero_grad()`); train(): no optimizer.step() or zero_grad() in
// the loop. torch (torch/csrc/autograd/functions/accumulate_grad.cpp, >= 2.1) calls the
// post-accumulate-grad hooks right after AccumulateGrad set or added to .grad, on the
// backward's thread and stream.
//
// Contract: installed as the Runtime's hooks (nothing else may be: single GPU, no DDP /
// FSDP / DeepSpeed, refused by scenario/torchtune_keys.cpp). grad_ready(p) runs the
// scenario's torch.optim implementation (sim/optim/optimizer_step.h) for p alone — every
// other parameter's .grad was already dropped by its own hook, and OptimizerSim::step
// visits only parameters holding one — so p's state is created lazily at its first hook
// (in the warm-up step's backward) and the step's temporaries are one parameter's; then
// p's .grad is freed (zero_grad(set_to_none=True)). Events stay in the backward phase
// (module optimizer). The time model gets each step's HBM bytes at the same point.
#pragma once

#include <memory>

#include "graph/runtime.h"
#include "scenario/scenario.h"
#include "sim/optim/optimizer_step.h"

namespace memsim {

class OptimizerInBackward final : public graph::RuntimeHooks {
 public:
  // Installs itself as rt.hooks (the caller checked none is installed).
  OptimizerInBackward(graph::Runtime& rt, const Scenario& s, std::unique_ptr<OptimizerSim> optimizer);
  ~OptimizerInBackward() override;
  OptimizerInBackward(const OptimizerInBackward&) = delete;
  OptimizerInBackward& operator=(const OptimizerInBackward&) = delete;

  void grad_ready(graph::Runtime& rt, int32_t param) override;
  void layer_entered(graph::Runtime& rt, int32_t layer) override {
    (void)rt;
    (void)layer;
  }

 private:
  graph::Runtime* rt_;
  const Scenario& s_;
  std::unique_ptr<OptimizerSim> optimizer_;
};

}  // namespace memsim
