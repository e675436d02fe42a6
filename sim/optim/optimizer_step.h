// Optimizer steps as memory events: state (lazy, created on the first step) and the
// temporaries each implementation allocates, parameter by parameter or per group.
//
// Contract: step() reads the parameters' .grad from the Runtime (a parameter with no
// grad is skipped, as torch.optim does: frozen LoRA base weights are not parameters of
// the Runtime at all), emits every allocation and free of the real implementation in
// order, and leaves the state alive in the optimizer object. construct() runs once at
// setup, after the model is built (fp32 master copies, sim/optim/master_weights.h).
//
// State sizes follow the tensors the optimizer updates: zeros_like(param) for torch.optim
// (the parameter's dtype, or fp32 when it updates fp32 master copies); bitsandbytes 8-bit
// state (sim/optim/optimizer_8bit.h) has its own layout.
#pragma once

#include <memory>
#include <vector>

#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

class OptimizerSim {
 public:
  virtual ~OptimizerSim() = default;
  virtual void construct(graph::Runtime& rt) { (void)rt; }
  virtual void step(graph::Runtime& rt) = 0;
};

// How the optimizer is set up around the model.
struct OptimizerSetup {
  // cs336: the staff AdamW of releases before v1.0.3 applied weight decay after the
  // Adam update (cs336-model.md §0).
  bool cs336_decay_after_update = false;
  uint64_t param_elem = 4;      // bytes per element of the model's parameters
  bool master_weights = false;  // precision.master_weights (sim/optim/master_weights.h)
};

// Bytes per element of parameter p (its own dtype, else the model's).
inline uint64_t elem_of(const graph::Parameter& p, uint64_t model_elem) {
  return p.elem != 0 ? p.elem : model_elem;
}
inline uint64_t numel_of(const graph::Parameter& p, uint64_t model_elem) {
  return p.bytes / elem_of(p, model_elem);
}

// nullptr for OptimizerType::none.
std::unique_ptr<OptimizerSim> make_optimizer(const OptimizerConfig& config,
                                             const OptimizerSetup& setup);
// The optimizer alone (no master wrapper); `on_fp32_masters`: it updates fp32 copies of
// the parameters (sim/optim/master_weights.cpp), so its state and temporaries are fp32.
std::unique_ptr<OptimizerSim> make_inner_optimizer(const OptimizerConfig& config,
                                                   const OptimizerSetup& setup,
                                                   bool on_fp32_masters);

}  // namespace memsim
