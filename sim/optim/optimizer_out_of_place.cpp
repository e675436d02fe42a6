#include "sim/optim/optimizer_out_of_place.h"

#include <vector>

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
// Names t as `role` of parameter i ("exp_avg of P", "optimizer temporary of P"; with
// NameRole::none the parameter itself: the new p.data).
Tensor of(Runtime& rt, Tensor t, size_t i, NameRole role) {
  rt.name_as(t.storage, static_cast<int32_t>(i), role);
  return t;
}

// `p.data = fresh`: the Parameter takes the new storage (set_data), its old storage loses
// the module's reference (freed unless a saved tensor or a view still holds it), then
// the expression's temporary reference is dropped.
void rebind(Runtime& rt, graph::Parameter& p, Tensor& fresh) {
  rt.retain(fresh.storage);
  const uint32_t old = p.storage;
  p.storage = fresh.storage;
  rt.release(old);
  fresh.reset();
}

class OutOfPlaceAdam final : public OptimizerSim {
 public:
  explicit OutOfPlaceAdam(bool decay) : decay_(decay) {}

  void construct(Runtime& rt) override {
    auto& params = rt.parameters();
    m_.resize(params.size());
    v_.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].frozen) continue;  // not in model.parameters() with requires_grad
      m_[i] = of(rt, state(rt, params[i].bytes), i, NameRole::exp_avg);
      v_[i] = of(rt, state(rt, params[i].bytes), i, NameRole::exp_avg_sq);
    }
  }

  void step(Runtime& rt) override {
    auto& params = rt.parameters();
    Tensor m_local, v_local;  // step()'s locals `m` and `v`
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad == graph::kNoStorage || !m_[i].defined()) continue;
      const uint64_t P = params[i].bytes;
      auto temp = [i](Runtime& r, uint64_t bytes) {
        return of(r, memsim::temp(r, bytes), i, NameRole::optimizer_temp);
      };
      m_local = m_[i];  // rebinding drops the previous parameter's old m
      {
        Tensor a = temp(rt, P);  // b1 * m
        Tensor b = temp(rt, P);  // (1 - b1) * grad
        m_[i] = of(rt, state(rt, P), i, NameRole::exp_avg);  // a + b; the state dict holds new_m
        a.reset();
        b.reset();
      }
      v_local = v_[i];
      {
        Tensor a = temp(rt, P);   // b2 * v
        Tensor sq = temp(rt, P);  // grad ** 2
        Tensor b = temp(rt, P);   // (1 - b2) * grad**2
        sq.reset();
        v_[i] = of(rt, state(rt, P), i, NameRole::exp_avg_sq);
        a.reset();
        b.reset();
      }
      {
        Tensor root = temp(rt, P);  // torch.sqrt(new_v)
        Tensor den = temp(rt, P);   // + eps
        root.reset();
        Tensor q = temp(rt, P);     // new_m / den
        den.reset();
        Tensor u = temp(rt, P);     // lr_t * q
        q.reset();
        Tensor np = of(rt, rt.alloc(P, TensorKind::parameter, OpKind::optimizer_math), i, NameRole::none);  // p.data - u
        u.reset();
        rebind(rt, params[i], np);
      }
      if (decay_) {
        Tensor w = temp(rt, P);  // (lr * wd) * p.data
        Tensor np = of(rt, rt.alloc(P, TensorKind::parameter, OpKind::optimizer_math), i, NameRole::none);
        w.reset();
        rebind(rt, params[i], np);
      }
    }
    // step() returns: its frame's locals die in the order they were bound (m, then v).
    m_local.reset();
    v_local.reset();
  }

 private:
  bool decay_;
  std::vector<Tensor> m_, v_;
};

}  // namespace

std::unique_ptr<OptimizerSim> make_out_of_place_adam(bool decoupled_decay) {
  return std::make_unique<OutOfPlaceAdam>(decoupled_decay);
}

}  // namespace memsim
