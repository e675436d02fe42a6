// Optimizer steps as memory events: state (lazy, created on the first step) and the
// temporaries each implementation allocates, parameter by parameter or per group.
//
// Contract: step() reads the parameters' .grad from the Runtime (a parameter with no
// grad is skipped, as torch.optim does), emits every allocation and free of the real
// implementation in order, and leaves the state alive in the optimizer object.
#pragma once

#include <memory>
#include <vector>

#include "graph/runtime.h"
#include "sim/scenario.h"

namespace memsim {

class OptimizerSim {
 public:
  virtual ~OptimizerSim() = default;
  virtual void step(graph::Runtime& rt) = 0;
};

// nullptr for OptimizerType::none. cs336_decay_after_update: the staff AdamW of
// releases before v1.0.3 applied weight decay after the Adam update (cs336-model.md §0).
std::unique_ptr<OptimizerSim> make_optimizer(const OptimizerConfig& config,
                                             bool cs336_decay_after_update = false);

}  // namespace memsim
