#include "sim/optim/optimizer_adafactor.h"

#include <string>
#include <vector>

#include "graph/numeric/numeric.h"

namespace memsim {
namespace {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

Tensor temp(Runtime& rt, uint64_t bytes) {
  return rt.alloc(bytes, TensorKind::temporary, OpKind::optimizer_math);
}
// State `name` of parameter `param`: "exp_avg_sq_row of P" (the id is interned once per
// parameter and name: RMS is made every step).
uint32_t state_name(Runtime& rt, const char* name, int32_t param) {
  return rt.program().intern(std::string(name) + " of " + rt.param_name(param));
}
Tensor state(Runtime& rt, uint64_t bytes, uint32_t name) {
  Tensor t = rt.alloc(bytes, TensorKind::optimizer_state, OpKind::optimizer_math);
  rt.name(t.storage, name);
  return t;
}

class HfAdafactor final : public OptimizerSim {
 public:
  HfAdafactor(uint64_t param_elem, bool on_fp32_masters)
      : param_elem_(param_elem), on_masters_(on_fp32_masters) {}

  void step(Runtime& rt) override {
    const auto& params = rt.parameters();
    if (st_.size() < params.size()) st_.resize(params.size());
    // The step's Python locals, alive across iterations until rebound.
    Tensor grad, p_data_fp32, lr, update;
    for (size_t i = 0; i < params.size(); ++i) {
      const graph::Parameter& p = params[i];
      if (p.grad == graph::kNoStorage) continue;
      const uint64_t n = numel_of(p, param_elem_);
      // grad.float() / p.float() copy 16-bit tensors only.
      const bool upcast = !on_masters_ && elem_of(p, param_elem_) != 4;
      const uint64_t rows = p.rows, cols = rows > 0 ? n / rows : 0;
      grad.reset();                            // grad = p.grad
      if (upcast) grad = temp(rt, n * 4);     // grad = grad.float()
      State& s = st_[i];
      if (!s.initialised) {
        s.initialised = true;
        const auto idx = static_cast<int32_t>(i);  // numeric mode keeps its state here
        if (rows > 0) {
          s.row = state(rt, rows * 4, state_name(rt, "exp_avg_sq_row", idx));  // torch.zeros(...).to(grad)
          graph::numeric_optimizer_state(rt, idx, "exp_avg_sq_row", s.row);
          s.col = state(rt, cols * 4, state_name(rt, "exp_avg_sq_col", idx));
          graph::numeric_optimizer_state(rt, idx, "exp_avg_sq_col", s.col);
        } else {
          s.sq = state(rt, n * 4, state_name(rt, "exp_avg_sq", idx));
          graph::numeric_optimizer_state(rt, idx, "exp_avg_sq", s.sq);
        }
      }
      p_data_fp32.reset();                     // p_data_fp32 = p
      if (upcast) p_data_fp32 = temp(rt, n * 4);
      {
        // state["RMS"] = self._rms(p_data_fp32): norm(2) / sqrt(numel).
        Tensor norm = temp(rt, 4);
        if (s.rms_name == 0) s.rms_name = state_name(rt, "RMS", static_cast<int32_t>(i));
        Tensor rms = state(rt, 4, s.rms_name);
        norm.reset();
        s.rms = std::move(rms);
        graph::numeric_optimizer_state(rt, static_cast<int32_t>(i), "RMS", s.rms);
      }
      lr = temp(rt, 4);  // rel_step_sz * max(eps2, RMS): a 0-d tensor (old lr freed)
      {
        Tensor sq = temp(rt, n * 4);           // grad**2
        Tensor u = temp(rt, n * 4);            // + eps
        sq.reset();
        update = std::move(u);
      }
      if (rows > 0) {
        { Tensor m = temp(rt, rows * 4); }     // update.mean(dim=-1)
        { Tensor m = temp(rt, cols * 4); }     // update.mean(dim=-2)
        Tensor approx;
        {  // _approx_sq_grad
          Tensor mean = temp(rt, 4);           // row.mean(dim=-1, keepdim=True)
          Tensor r_factor = temp(rt, rows * 4);
          mean.reset();                        // (.rsqrt_() in place)
          Tensor c_factor = temp(rt, cols * 4);
          approx = temp(rt, n * 4);            // torch.mul(r_factor, c_factor)
        }
        update = std::move(approx);            // .mul_(grad) in place
      } else {
        update = temp(rt, n * 4);              // exp_avg_sq.rsqrt().mul_(grad)
      }
      {
        // update.div_((self._rms(update) / clip_threshold).clamp_(min=1.0))
        Tensor norm = temp(rt, 4);
        Tensor rms = temp(rt, 4);
        norm.reset();
        Tensor q = temp(rt, 4);
        rms.reset();
      }
      { Tensor neg = temp(rt, n * 4); }        // p_data_fp32.add_(-update)
    }
    // step() returns: its frame's locals go in declaration order.
    grad.reset();
    p_data_fp32.reset();
    lr.reset();
    update.reset();
  }

 private:
  struct State {
    bool initialised = false;
    Tensor row, col, sq, rms;
    uint32_t rms_name = 0;  // "RMS of P", interned at the first step
  };
  uint64_t param_elem_;
  bool on_masters_;
  std::vector<State> st_;
};

}  // namespace

std::unique_ptr<OptimizerSim> make_hf_adafactor(uint64_t param_elem, bool on_fp32_masters) {
  return std::make_unique<HfAdafactor>(param_elem, on_fp32_masters);
}

}  // namespace memsim
