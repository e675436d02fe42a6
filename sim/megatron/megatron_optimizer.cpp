#include "sim/megatron/megatron_optimizer.h"

namespace memsim {

MegatronOptimizerConfig megatron_optimizer_config(const Scenario& s, bool zero_paper_accounting) {
  const uint64_t elem = static_cast<uint64_t>(dtype_bytes(s.precision.params));
  MegatronOptimizerConfig c;
  c.grad_elem = s.precision.params == DType::bf16 && !zero_paper_accounting ? 4 : elem;
  c.master_weights = s.precision.master_weights && elem != 4;
  c.param_elem = elem;
  c.adam = s.optimizer.type == OptimizerType::adam || s.optimizer.type == OptimizerType::adamw;
  c.transient_master_grads = zero_paper_accounting;
  return c;
}

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

namespace {
// Names the tensor in reports (the op name is the default).
Tensor named(Runtime& rt, Tensor t, const char* name) {
  rt.program().tensors[t.storage].name = rt.program().intern(name);
  return t;
}
}  // namespace

// Names t as `role` of parameter `id` ("exp_avg of P"), or as its distributed-optimizer
// counterpart ("exp_avg of P (distributed-optimizer shard)") when this rank owns only part
// of P's elements.
Tensor MegatronOptimizer::of_param(Runtime& rt, Tensor t, int32_t id, NameRole whole, NameRole shard) const {
  const uint64_t all = rt.parameters()[static_cast<size_t>(id)].bytes / c_.param_elem;
  rt.name_as(t.storage, id, numel(rt, id) < all ? shard : whole);
  return t;
}

void MegatronOptimizer::construct(Runtime& rt) {
  // _dummy_overflow_buf = torch.tensor([0], dtype=torch.int, device='cuda')
  overflow_buf_ = named(rt, rt.alloc(4, TensorKind::other, OpKind::optimizer_math),
                        "_dummy_overflow_buf");
  if (!c_.master_weights) return;
  master_.reserve(order_.size());
  for (int32_t id : order_) {
    if (numel(rt, id) == 0) continue;  // another rank's shard
    Tensor clone16 = of_param(rt,
                              rt.alloc(numel(rt, id) * c_.param_elem, TensorKind::temporary,
                                       OpKind::optimizer_math),
                              id, NameRole::optimizer_temp, NameRole::optimizer_temp);
    master_.push_back(of_param(rt,
                               rt.alloc(numel(rt, id) * 4, TensorKind::optimizer_state,
                                        OpKind::optimizer_math),
                               id, NameRole::master, NameRole::shard_master));
  }
}

void MegatronOptimizer::zero_grad(Runtime& rt) {
  (void)rt;
  for (Tensor& g : master_grad_) g.reset();
  master_grad_.clear();
}

void MegatronOptimizer::step(Runtime& rt) {
  if (c_.master_weights && c_.grad_elem != 4) {
    // main_param.grad = model_param.main_grad.float(): a real copy of a 16-bit buffer.
    master_grad_.reserve(order_.size());
    for (int32_t id : order_)
      if (numel(rt, id) != 0)
        master_grad_.push_back(of_param(
            rt, rt.alloc(numel(rt, id) * 4, TensorKind::gradient, OpKind::optimizer_math), id,
            NameRole::master_grad, NameRole::shard_master_grad));
  }
  if (c_.adam && exp_avg_.empty()) {
    // FusedAdam: state initialised on the first step, parameter by parameter.
    exp_avg_.reserve(order_.size());
    exp_avg_sq_.reserve(order_.size());
    for (int32_t id : order_) {
      if (numel(rt, id) == 0) continue;
      exp_avg_.push_back(of_param(
          rt, rt.alloc(numel(rt, id) * 4, TensorKind::optimizer_state, OpKind::optimizer_math), id,
          NameRole::exp_avg, NameRole::shard_exp_avg));
      exp_avg_sq_.push_back(of_param(
          rt, rt.alloc(numel(rt, id) * 4, TensorKind::optimizer_state, OpKind::optimizer_math), id,
          NameRole::exp_avg_sq, NameRole::shard_exp_avg_sq));
    }
  }
  // The update and the master -> model copy are in place (multi-tensor kernels).
  if (c_.transient_master_grads) zero_grad(rt);
}

}  // namespace memsim
