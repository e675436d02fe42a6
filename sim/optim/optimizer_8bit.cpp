#include "sim/optim/optimizer_8bit.h"

#include <string>
#include <vector>

#include "graph/numeric/numeric.h"

namespace memsim {
namespace {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

// State `name` of parameter `param` ("state1 of P"; once per parameter, at its first
// step), or a name of its own for param -1 (the shared quantization maps).
Tensor state(Runtime& rt, uint64_t bytes, const char* name, int32_t param) {
  Tensor t = rt.alloc(bytes, TensorKind::optimizer_state, OpKind::optimizer_math);
  rt.name(t.storage, rt.program().intern(param < 0 ? std::string(name)
                                                   : std::string(name) + " of " + rt.param_name(param)));
  return t;
}

class BnbAdam8bit final : public OptimizerSim {
 public:
  explicit BnbAdam8bit(uint64_t param_elem) : param_elem_(param_elem) {}

  void step(Runtime& rt) override {
    const auto& params = rt.parameters();
    if (st_.size() < params.size()) st_.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad == graph::kNoStorage || st_[i].state1.defined()) continue;
      const uint64_t n = numel_of(params[i], param_elem_);
      State& s = st_[i];
      const auto idx = static_cast<int32_t>(i);  // numeric mode keeps its state here
      if (n < kBnbMin8bitSize) {
        s.state1 = state(rt, n * 4, "state1", idx);
        graph::numeric_optimizer_state(rt, idx, "state1", s.state1);
        s.state2 = state(rt, n * 4, "state2", idx);
        graph::numeric_optimizer_state(rt, idx, "state2", s.state2);
        continue;
      }
      if (!qmap_dynamic_.defined() && !qmaps_made_) {
        qmaps_made_ = true;
        qmap_dynamic_ = state(rt, 256 * 4, "bitsandbytes qmap1 (signed dynamic quantization map)", -1);
        graph::numeric_optimizer_state(rt, -1, "qmap1", qmap_dynamic_);
        qmap_udynamic_ = state(rt, 256 * 4, "bitsandbytes qmap2 (unsigned dynamic quantization map)", -1);
        graph::numeric_optimizer_state(rt, -1, "qmap2", qmap_udynamic_);
      }
      const uint64_t blocks = (n + kBnbBlockSize - 1) / kBnbBlockSize;
      s.state1 = state(rt, n, "state1", idx);
      graph::numeric_optimizer_state(rt, idx, "state1", s.state1);
      s.state2 = state(rt, n, "state2", idx);
      graph::numeric_optimizer_state(rt, idx, "state2", s.state2);
      s.absmax1 = state(rt, blocks * 4, "absmax1", idx);
      graph::numeric_optimizer_state(rt, idx, "absmax1", s.absmax1);
      s.absmax2 = state(rt, blocks * 4, "absmax2", idx);
      graph::numeric_optimizer_state(rt, idx, "absmax2", s.absmax2);
      // The update (optimizer_update_8bit_blockwise) is one in-place kernel.
    }
  }

 private:
  struct State {
    Tensor state1, state2, absmax1, absmax2;
  };
  uint64_t param_elem_;
  std::vector<State> st_;
  Tensor qmap_dynamic_, qmap_udynamic_;
  bool qmaps_made_ = false;  // the maps move to the GPU once (the first 8-bit parameter)
};

}  // namespace

std::unique_ptr<OptimizerSim> make_bnb_adam8bit(uint64_t param_elem) {
  return std::make_unique<BnbAdam8bit>(param_elem);
}

}  // namespace memsim
