// optimum-quanto quantize / dequantize of a KV-cache tensor (graph/models/quanto_kv.h).
#include "graph/models/quanto_kv.h"

#include <algorithm>

#include "graph/ops/ops.h"

namespace memsim::graph {
namespace {

uint64_t groups(uint64_t numel, const QuantoSpec& q) { return numel / static_cast<uint64_t>(q.group_size); }
uint64_t per_byte(const QuantoSpec& q) { return static_cast<uint64_t>(8 / q.bits); }
// pack_weights' row_dim: ceil(G / (8 / bits)) packed rows of group_size bytes.
uint64_t packed_rows(uint64_t numel, const QuantoSpec& q) {
  return (groups(numel, q) + per_byte(q) - 1) / per_byte(q);
}

}  // namespace

uint64_t quanto_kept_bytes(uint64_t numel, uint64_t elem, const QuantoSpec& q) {
  const uint64_t g = static_cast<uint64_t>(q.group_size);
  return packed_rows(numel, q) * g + 2 * groups(numel, q) * elem;
}

QuantoTensor quanto_quantize(Runtime& rt, uint64_t numel, uint64_t elem, const QuantoSpec& q) {
  const uint64_t G = groups(numel, q), g = static_cast<uint64_t>(q.group_size);
  QuantoTensor out;
  out.numel = numel;
  // MaxOptimizer.optimize over the (G, g) grouped view.
  {
    Tensor rmin = new_tensor(rt, G * elem, OpKind::reduce_max, TensorKind::temporary);  // amin
    Tensor rmax = new_tensor(rt, G * elem, OpKind::reduce_max, TensorKind::temporary);  // amax
    Tensor diff = new_tensor(rt, G * elem, OpKind::sub, TensorKind::temporary);
    out.scale = new_tensor(rt, G * elem, OpKind::div_scalar, TensorKind::other);
    diff.reset();
    out.shift = new_tensor(rt, G * elem, OpKind::neg, TensorKind::other);
  }  // optimize() returns: rmin, rmax die
  // quantize_affine: round((base + shift) / scale).clamp(0, 2^bits - 1).to(uint8)
  Tensor data;
  {
    Tensor sum = new_tensor(rt, numel * elem, OpKind::add, TensorKind::temporary);
    Tensor quot = new_tensor(rt, numel * elem, OpKind::div, TensorKind::temporary);
    sum.reset();
    Tensor rounded = new_tensor(rt, numel * elem, OpKind::other, TensorKind::temporary);  // round
    quot.reset();
    Tensor clamped = new_tensor(rt, numel * elem, OpKind::other, TensorKind::temporary);  // clamp
    data = new_tensor(rt, numel, OpKind::to_copy, TensorKind::temporary);                 // uint8
    clamped.reset();
  }  // the rounded floats die on return
  // WeightQBitsTensor.__init__ -> PackedTensor.pack -> pack_weights.
  const uint64_t rows = packed_rows(numel, q);
  out.data = new_tensor(rt, rows * g, OpKind::zeros, TensorKind::other);
  const uint64_t slots = std::min<uint64_t>(per_byte(q), G / rows + 1);
  for (uint64_t i = 0; i < slots; ++i) {
    const uint64_t start = i * rows, end = std::min(start + rows, G);
    if (end > start) new_tensor(rt, (end - start) * g, OpKind::bitwise, TensorKind::temporary).reset();
  }
  data.reset();  // WeightsQBitsQuantizer.forward returns: the unpacked uint8 dies
  return out;
}

Tensor quanto_dequantize(Runtime& rt, const QuantoTensor& t, uint64_t elem, const QuantoSpec& q) {
  const uint64_t g = static_cast<uint64_t>(q.group_size);
  // quanto_cuda unpack: torch::empty({rows * 8 / bits, g}) uint8, sliced to G rows.
  Tensor unpacked = new_tensor(rt, packed_rows(t.numel, q) * per_byte(q) * g, OpKind::other,
                               TensorKind::temporary);
  Tensor dqt = new_tensor(rt, t.numel * elem, OpKind::mul, TensorKind::activation);  // scale * data
  unpacked.reset();  // dqt -= shift is in place; the reshape is a view
  return dqt;
}

}  // namespace memsim::graph
