// Loss code written in the training script itself, as op sequences (cs336 family;
// selected by the scenario's loss.impl / loss.positions, sim/step/script_loss.h).
//
// Contract: each function emits the allocations PyTorch eager makes for the Python
// statement named, in order, records the autograd nodes with their saves, and returns
// the result (the caller's Python name). Sizes in bytes; `elem` is the element size of
// the input's dtype. Checked against NiuHuangxiaozi's forward_and_backward snapshots
// (docs/niu-runs.md).
#pragma once

#include "graph/autocast.h"
#include "graph/ops/ops.h"

namespace memsim::graph {

// `logits[:, -1, :]` on (B, S, V) logits: Python indexing records slice(dim 0, full),
// select(dim 1, -1) and slice(dim 1, full) (three views, no memory). In backward each
// node materialises zeros of its input and copies the grad in: a (B, V) SliceBackward0
// tensor, then two (B, S, V) ones (SelectBackward0, SliceBackward0), each freeing the
// previous. last_bytes = B*V*elem.
Tensor last_position(Runtime& rt, const Tensor& logits, uint64_t last_bytes);

// A hand-written cross entropy over one-hot targets on (rows, V) scores x:
//   max_value, _ = torch.max(x, dim=-1, keepdim=True)
//   log_softmax_x = x - max_value - torch.log(torch.sum(torch.exp(x - max_value), dim=-1, keepdim=True))
//   target_one_hot = torch.zeros_like(log_softmax_x); target_one_hot.scatter_(-1, t, 1)
//   loss = -torch.sum(target_one_hot * log_softmax_x) / batch_size
// (x - max_value is evaluated twice; `_` keeps the max indices until the function
// returns). With `ac` active (autocast): max and the subtractions in x's low dtype, exp
// on an fp32 copy, the log-softmax promoted to fp32, the rest fp32.
Tensor one_hot_cross_entropy(Runtime& rt, Autocast* ac, const Tensor& x, uint64_t rows,
                             uint64_t elem);

}  // namespace memsim::graph
