#include "sim/optim/optimizer_step.h"

#include "sim/optim/master_weights.h"
#include "sim/optim/optimizer_adafactor.h"
#include "sim/optim/optimizer_8bit.h"
#include "sim/optim/optimizer_out_of_place.h"

namespace memsim {
namespace {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

Tensor temp(Runtime& rt, uint64_t bytes) {
  return rt.alloc(bytes, TensorKind::temporary, OpKind::optimizer_math);
}
Tensor state(Runtime& rt, uint64_t bytes) {
  return rt.alloc(bytes, TensorKind::optimizer_state, OpKind::optimizer_math);
}
// A tensor that is `label` of parameter i ("exp_avg of P"; program/tensor_names.h).
Tensor labelled(Runtime& rt, Tensor t, size_t i, graph::ParamLabel label) {
  rt.name_as(t.storage, static_cast<int32_t>(i), label);
  return t;
}

// cs336_basics.optimizer.AdamW (cs336-model.md §7): a per-parameter Python loop.
// Lines (staff source): p.data -= lr*wd*p.data; m = state.get("m", zeros_like(grad));
// v likewise; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g**2;
// p.data -= lr_t * m / (sqrt(v) + eps); state["m"], state["v"] = m, v.
class Cs336AdamW final : public OptimizerSim {
 public:
  explicit Cs336AdamW(bool decay_after) : decay_after_(decay_after) {}
  void step(Runtime& rt) override {
    auto& params = rt.parameters();
    if (m_.size() < params.size()) {
      m_.resize(params.size());
      v_.resize(params.size());
    }
    // The loop's locals: they keep the previous parameter's old m and v alive until
    // they are rebound at the next parameter's state.get() line.
    Tensor m_local, v_local;
    for (size_t i = 0; i < params.size(); ++i) {
      const graph::Parameter& p = params[i];
      if (p.grad == graph::kNoStorage) continue;
      const uint64_t P = p.bytes;
      // Every temporary of the loop is "optimizer temporary of P".
      auto temp = [i](Runtime& r, uint64_t bytes) {
        return labelled(r, memsim::temp(r, bytes), i, graph::ParamLabel::optimizer_temp);
      };
      if (!decay_after_) { Tensor decay = temp(rt, P); }  // p.data -= lr*wd*p.data
      for (int which = 0; which < 2; ++which) {
        Tensor& st = which == 0 ? m_[i] : v_[i];
        Tensor& local = which == 0 ? m_local : v_local;
        // The default argument zeros_like(grad) is evaluated on every call.
        Tensor zeros = temp(rt, P);
        Tensor got = st.defined() ? st : zeros;
        zeros.reset();
        local = std::move(got);
      }
      Tensor m_new, v_new;
      {
        Tensor a = temp(rt, P), b = temp(rt, P);
        m_new = labelled(rt, state(rt, P), i, graph::ParamLabel::exp_avg);  // cs336's "m" 
      }
      {
        Tensor a = temp(rt, P);
        Tensor sq = temp(rt, P);
        Tensor b = temp(rt, P);
        sq.reset();
        v_new = labelled(rt, state(rt, P), i, graph::ParamLabel::exp_avg_sq);  // cs336's "v" 
      }
      {
        Tensor num = temp(rt, P);
        Tensor root = temp(rt, P);
        Tensor denom = temp(rt, P);
        root.reset();
        Tensor upd = temp(rt, P);
        num.reset();
        denom.reset();
        upd.reset();
      }
      if (decay_after_) { Tensor decay = temp(rt, P); }
      m_[i] = std::move(m_new);
      v_[i] = std::move(v_new);
    }
  }

 private:
  bool decay_after_;
  std::vector<Tensor> m_, v_;
};

// Bytes of a tensor shaped like parameter `p` holding `state_elem`-byte elements.
// zeros_like(the tensor updated): the parameter itself, or its fp32 master.
struct Sizer {
  uint64_t model_elem = 4;
  bool fp32_masters = false;
  uint64_t operator()(const graph::Parameter& p) const {
    return fp32_masters ? numel_of(p, model_elem) * 4 : p.bytes;
  }
};

// torch.optim.Adam / AdamW. State per parameter: exp_avg, exp_avg_sq (zeros_like, in
// parameter order, on the first step); `step` is a CPU scalar, except with fused=True,
// where _init_group makes it a 0-d fp32 tensor on the device before the moments (512 B
// each after rounding; H100 trace, torch 2.11).
class TorchAdam final : public OptimizerSim {
 public:
  TorchAdam(OptimizerImpl impl, Sizer size) : impl_(impl), size_(size) {}
  void step(Runtime& rt) override {
    auto& params = rt.parameters();
    if (exp_avg_.size() < params.size()) {
      exp_avg_.resize(params.size());
      exp_avg_sq_.resize(params.size());
    }
    for (size_t i = 0; i < params.size(); ++i) {  // _init_group
      if (params[i].grad == graph::kNoStorage || exp_avg_[i].defined()) continue;
      if (impl_ == OptimizerImpl::fused)
        device_step_.push_back(labelled(rt, state(rt, 4), i, graph::ParamLabel::adam_step));
      exp_avg_[i] = labelled(rt, state(rt, size_(params[i])), i, graph::ParamLabel::exp_avg);
      exp_avg_sq_[i] = labelled(rt, state(rt, size_(params[i])), i, graph::ParamLabel::exp_avg_sq);
    }
    switch (impl_) {
      case OptimizerImpl::foreach: {
        // _multi_tensor_adam: every update is an in-place _foreach_ op except
        // exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs), one new tensor per parameter,
        // all alive until the addcdiv_ that consumes them.
        std::vector<Tensor> sqrt_list;
        sqrt_list.reserve(params.size());
        for (size_t i = 0; i < params.size(); ++i)
          if (params[i].grad != graph::kNoStorage)
            sqrt_list.push_back(labelled(rt, temp(rt, size_(params[i])), i, graph::ParamLabel::adam_sqrt));
        // The Python list dies at the end of the step: CPython drops its items last first.
        for (auto it = sqrt_list.rbegin(); it != sqrt_list.rend(); ++it) it->reset();
        break;
      }
      case OptimizerImpl::for_loop:
      case OptimizerImpl::cs336: {
        // _single_tensor_adam: denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps). `denom`
        // is a local of the loop: the previous parameter's lives until it is rebound,
        // after the new one is made, and the last one until the function returns.
        Tensor denom;
        for (size_t i = 0; i < params.size(); ++i) {
          if (params[i].grad == graph::kNoStorage) continue;
          Tensor root = labelled(rt, temp(rt, size_(params[i])), i, graph::ParamLabel::optimizer_temp);
          Tensor d = labelled(rt, temp(rt, size_(params[i])), i, graph::ParamLabel::adam_denom);
          root.reset();
          denom = std::move(d);
        }
        denom.reset();
        break;
      }
      case OptimizerImpl::fused:
        break;  // one kernel per group, no temporaries
      case OptimizerImpl::out_of_place:
        break;  // never a TorchAdam (sim/optim/optimizer_out_of_place.h)
    }
  }

 private:
  OptimizerImpl impl_;
  Sizer size_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  std::vector<Tensor> device_step_;  // fused only
};

// torch.optim.SGD: momentum_buffer = clone(grad) on the first step, then in place.
class TorchSgd final : public OptimizerSim {
 public:
  TorchSgd(double momentum, Sizer size) : momentum_(momentum), size_(size) {}
  void step(Runtime& rt) override {
    if (momentum_ == 0.0) return;
    auto& params = rt.parameters();
    if (buf_.size() < params.size()) buf_.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad == graph::kNoStorage || buf_[i].defined()) continue;
      buf_[i] = labelled(rt, state(rt, size_(params[i])), i, graph::ParamLabel::momentum);
    }
  }

 private:
  double momentum_;
  Sizer size_;
  std::vector<Tensor> buf_;
};

}  // namespace

std::unique_ptr<OptimizerSim> make_inner_optimizer(const OptimizerConfig& config,
                                                   const OptimizerSetup& setup,
                                                   bool on_fp32_masters) {
  const Sizer size{setup.param_elem, on_fp32_masters};
  switch (config.type) {
    case OptimizerType::none: return nullptr;
    case OptimizerType::sgd: return std::make_unique<TorchSgd>(config.momentum, size);
    case OptimizerType::adam:
    case OptimizerType::adamw:
      if (config.impl == OptimizerImpl::cs336)
        return std::make_unique<Cs336AdamW>(setup.cs336_decay_after_update);
      if (config.impl == OptimizerImpl::out_of_place)  // sim/optim/optimizer_out_of_place.h
        return make_out_of_place_adam(config.type == OptimizerType::adamw);
      return std::make_unique<TorchAdam>(config.impl, size);
    case OptimizerType::adam8bit:
    case OptimizerType::adamw8bit:
      return make_bnb_adam8bit(setup.param_elem);
    case OptimizerType::adafactor:
      return make_hf_adafactor(setup.param_elem, on_fp32_masters);
  }
  return nullptr;
}

std::unique_ptr<OptimizerSim> make_optimizer(const OptimizerConfig& config,
                                             const OptimizerSetup& setup) {
  if (config.type == OptimizerType::none) return nullptr;
  if (setup.master_weights) return make_master_weights(config, setup);
  return make_inner_optimizer(config, setup, false);
}

}  // namespace memsim
