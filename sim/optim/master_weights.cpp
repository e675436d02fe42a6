#include "sim/optim/master_weights.h"

#include <stdexcept>
#include <vector>

namespace memsim {
namespace {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

// "master copy of P" / "fp32 grad of P" (program/tensor_names.h).
Tensor named(Runtime& rt, Tensor t, size_t param, graph::ParamLabel label) {
  rt.name_as(t.storage, static_cast<int32_t>(param), label);
  return t;
}

class MasterWeights final : public OptimizerSim {
 public:
  MasterWeights(std::unique_ptr<OptimizerSim> inner, uint64_t param_elem)
      : inner_(std::move(inner)), param_elem_(param_elem) {}

  void construct(Runtime& rt) override {
    // p.detach().float(): detach is a view, .float() the fp32 copy.
    const auto& params = rt.parameters();
    master_.reserve(params.size());
    // Only trainable parameters get a master (frozen LoRA base weights do not).
    for (size_t i = 0; i < params.size(); ++i) {
      const graph::Parameter& p = params[i];
      master_.push_back(p.frozen || !needs_copy(p) ? Tensor()
                                 : named(rt, rt.alloc(fp32(p), TensorKind::optimizer_state, OpKind::optimizer_math),
                                         i, graph::ParamLabel::master));
    }
  }

  void step(Runtime& rt) override {
    const auto& params = rt.parameters();
    if (master_.size() != params.size())
      throw std::logic_error("master weights: parameters were added after construct()");
    grads_.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {  // m.grad = p.grad.float()
      if (params[i].grad == graph::kNoStorage || !needs_copy(params[i])) continue;
      grads_[i] = named(rt, rt.alloc(fp32(params[i]), TensorKind::gradient, OpKind::optimizer_math),
                        i, graph::ParamLabel::master_grad);
    }
    if (inner_) inner_->step(rt);
    // p.data.copy_(m) is in place; m.grad = None frees the copy.
    for (Tensor& g : grads_) g.reset();
  }

 private:
  uint64_t fp32(const graph::Parameter& p) const { return numel_of(p, param_elem_) * 4; }
  // .float() of an fp32 tensor returns it: no master copy, no grad copy (fp32 adapters).
  bool needs_copy(const graph::Parameter& p) const { return elem_of(p, param_elem_) != 4; }

  std::unique_ptr<OptimizerSim> inner_;
  uint64_t param_elem_;
  std::vector<Tensor> master_, grads_;
};

}  // namespace

std::unique_ptr<OptimizerSim> make_master_weights(const OptimizerConfig& config,
                                                  const OptimizerSetup& setup) {
  return std::make_unique<MasterWeights>(make_inner_optimizer(config, setup, true), setup.param_elem);
}

}  // namespace memsim
