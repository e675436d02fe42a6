#include "graph/ops/megatron_global_buffer.h"

namespace memsim::graph {

Tensor global_buffer_get(Runtime& rt, Tensor& slot, uint64_t bytes) {
  if (!slot.defined() || slot.bytes < bytes) {
    // Not an activation of any layer: a new, larger buffer replaces the old one (which dies
    // when the dict entry is rebound and no view of it is left).
    const int32_t layer = rt.ctx.layer;
    const uint32_t region = rt.ctx.region;
    rt.ctx.layer = -1;
    rt.ctx.region = 0;
    Tensor buffer = rt.alloc(bytes, TensorKind::other, OpKind::baddbmm);
    rt.program().tensors[buffer.storage].name = rt.program().intern("mpu global memory buffer");
    slot = std::move(buffer);
    rt.ctx.layer = layer;
    rt.ctx.region = region;
  }
  return rt.view_of(slot, bytes);
}

}  // namespace memsim::graph
