#include "sim/step/optimizer_in_backward.h"

#include "sim/step/time_model_setup.h"

namespace memsim {

OptimizerInBackward::OptimizerInBackward(graph::Runtime& rt, const Scenario& s,
                                         std::unique_ptr<OptimizerSim> optimizer)
    : rt_(&rt), s_(s), optimizer_(std::move(optimizer)) {
  rt.hooks = this;
}

OptimizerInBackward::~OptimizerInBackward() {
  if (rt_->hooks == this) rt_->hooks = nullptr;
}

void OptimizerInBackward::grad_ready(graph::Runtime& rt, int32_t param) {
  const graph::Module module = rt.ctx.module;
  rt.ctx.module = graph::Module::optimizer;
  add_optimizer_cost(rt, s_);  // this parameter's kernels (the only .grad alive)
  optimizer_->step(rt);        // optim_dict[param].step()
  // optim_dict[param].zero_grad(): .grad = None, freed inside AccumulateGrad's hook.
  graph::Parameter& p = rt.parameters()[static_cast<size_t>(param)];
  if (p.grad != graph::kNoStorage) {
    rt.release(p.grad);
    p.grad = graph::kNoStorage;
  }
  rt.ctx.module = module;
}

}  // namespace memsim
