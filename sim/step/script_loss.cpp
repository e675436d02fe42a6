#include "sim/step/script_loss.h"

#include "graph/autocast.h"
#include "graph/models/losses.h"
#include "graph/models/script_losses.h"
#include "graph/ops/ops_nn.h"

namespace memsim {

graph::Tensor cs336_script_loss(graph::Runtime& rt, graph::Autocast* autocast,
                                const graph::Tensor& logits, const graph::Tensor& targets,
                                const graph::Cs336Shape& shape, uint64_t logits_elem,
                                LossImpl impl, LossPositions positions) {
  const bool last = positions == LossPositions::last;
  const uint64_t rows = last ? shape.batch : shape.batch * shape.seq;
  // `predict = logits[:, -1, :]` is a view of the logits' storage (no memory of its own).
  graph::Tensor x = last ? graph::last_position(rt, logits, rows * shape.vocab * logits_elem)
                         : logits;
  graph::Autocast* ac = autocast != nullptr && autocast->active() ? autocast : nullptr;
  switch (impl) {
    case LossImpl::one_hot:
      return graph::one_hot_cross_entropy(rt, ac, x, rows, logits_elem);
    case LossImpl::cs336:
      return ac != nullptr ? graph::cs336_cross_entropy_autocast(*ac, rt, x, targets, rows)
                           : graph::cs336_cross_entropy(rt, x, targets, rows, logits_elem);
    case LossImpl::torch:
      break;
    case LossImpl::torch_float: {
      // `logits.float()`: an fp32 copy (none when already fp32), then F.cross_entropy on
      // fp32, which autocast leaves alone.
      if (logits_elem == 4) return graph::torch_cross_entropy(rt, x, targets, 4);
      graph::Tensor xf = ac != nullptr ? ac->to_fp32(x, x.bytes / logits_elem * 4)
                                       : graph::to_copy(rt, x, x.bytes / logits_elem * 4);
      x.reset();
      return graph::torch_cross_entropy(rt, xf, targets, 4);
    }
  }
  // F.cross_entropy on the last position is refused when the scenario is checked
  // (scenario/script_keys.h): its CUDA kernel's handling of the strided view is not checked.
  return ac != nullptr ? graph::torch_cross_entropy_autocast(*ac, rt, x, targets)
                       : graph::torch_cross_entropy(rt, x, targets, logits_elem);
}

graph::Tensor logits_script_loss(graph::Runtime& rt, graph::Autocast* autocast,
                                 const graph::Tensor& logits, const graph::Tensor& targets,
                                 uint64_t rows, uint64_t vocab, bool float_first) {
  graph::Autocast* ac = autocast != nullptr && autocast->active() ? autocast : nullptr;
  const uint64_t elem = logits.bytes / (rows * vocab);
  if (elem == 4) return graph::torch_cross_entropy(rt, logits, targets, 4);
  if (float_first) {  // logits.float(), then F.cross_entropy on fp32 (autocast leaves it)
    graph::Tensor xf = ac != nullptr ? ac->to_fp32(logits, rows * vocab * 4)
                                     : graph::to_copy(rt, logits, rows * vocab * 4);
    return graph::torch_cross_entropy(rt, xf, targets, 4);
  }
  return ac != nullptr ? graph::torch_cross_entropy_autocast(*ac, rt, logits, targets)
                       : graph::torch_cross_entropy(rt, logits, targets, elem);
}

}  // namespace memsim
