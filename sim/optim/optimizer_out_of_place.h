// optimizer.impl: out-of-place — a hand-written Adam / AdamW subclass of
// torch.optim.Optimizer of the kind course code contains (NiuHuangxiaozi's NIUAdam,
// docs/niu-runs.md), as memory events:
//
//   __init__: for p in params: state[p] = {"m": zeros_like(p), "v": zeros_like(p)}
//             (eager: both moments exist before the first forward, m then v per param)
//   step:     for p with a grad:
//               m = state[p]["m"];  new_m = b1 * m + (1 - b1) * grad;  state[p]["m"] = new_m
//               v = state[p]["v"];  new_v = b2 * v + (1 - b2) * grad**2;  state[p]["v"] = new_v
//               p.data = p.data - lr_t * (new_m / (torch.sqrt(new_v) + eps))
//               p.data = p.data - lr * wd * p.data            (adamw only; run even if wd 0)
//
// Contract: every arithmetic result is a new tensor (no in-place op), so each step moves
// both moments and the parameter (twice with adamw) to new blocks. The loop-level locals
// m and v keep the previous parameter's old moments alive until they are rebound at the
// next parameter; the last ones die when step() returns (m first). The sequence is the
// one in the forward_and_backward snapshots (optimizer.py lines 50-64 of their frames).
// Parameter storages are rebound through graph::Parameter::storage (the Parameter object
// and so autocast's weight-cast cache key are kept, as `p.data = ...` keeps them).
#pragma once

#include <memory>

#include "sim/optim/optimizer_step.h"

namespace memsim {

// decoupled_decay: the `p.data = p.data - lr * wd * p.data` statement (optimizer.type
// adamw); adam has none.
std::unique_ptr<OptimizerSim> make_out_of_place_adam(bool decoupled_decay);

}  // namespace memsim
