#include "graph/ops/ops_mla.h"

#include "graph/autocast.h"
#include "graph/ops/op_helpers.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

using detail::out_tensor;
using detail::wants_grad;

namespace {

// One rotated tensor's MulBackward0 (OpKind::rope_complex; the recipe of ops_stack.h's
// rope_complex_pair): size[0] x's bytes, size[1] the table's, size[2] the fp32 size of a
// 16-bit input (0: fp32), size[3] the contiguous copy of a strided incoming grad (0: none).
void rope_node(Runtime& rt, const Tensor& x, const Tensor& table, uint64_t table_bytes,
               uint64_t f32_bytes, uint64_t contiguous_bytes, Tensor& out) {
  if (!wants_grad(rt, {&x})) return;
  int32_t n = rt.make_node(OpKind::rope_complex, {&x});
  Node& node = rt.node(n);
  node.size[0] = x.bytes;
  node.size[1] = table_bytes;
  node.size[2] = f32_bytes;
  node.size[3] = contiguous_bytes;
  rt.save(n, table);
  out.grad_fn = n;
}

}  // namespace

void rope_complex_pair_hf(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& table,
                          uint64_t table_bytes, uint64_t elem, bool q_grad_strided, Tensor& q_out,
                          Tensor& k_out) {
  if (elem == 4) {
    q_out = out_tensor(rt, q.bytes, OpKind::rope_complex);
    rope_node(rt, q, table, table_bytes, 0, q_grad_strided ? q.bytes : 0, q_out);
    k_out = out_tensor(rt, k.bytes, OpKind::rope_complex);
    rope_node(rt, k, table, table_bytes, 0, 0, k_out);
    return;
  }
  const uint64_t q32 = q.bytes / elem * 4, k32 = k.bytes / elem * 4;
  Tensor xq = rt.alloc(q32, TensorKind::temporary, OpKind::to_copy);  // xq.float()
  Tensor xk = rt.alloc(k32, TensorKind::temporary, OpKind::to_copy);  // xk.float()
  {
    Tensor pq = rt.alloc(q32, TensorKind::temporary, OpKind::rope_complex);  // xq_ * freqs_cis
    q_out = out_tensor(rt, q.bytes, OpKind::to_copy);                        // .type_as(xq)
    rope_node(rt, q, table, table_bytes, q32, 0, q_out);
  }
  {
    Tensor pk = rt.alloc(k32, TensorKind::temporary, OpKind::rope_complex);
    k_out = out_tensor(rt, k.bytes, OpKind::to_copy);
    rope_node(rt, k, table, table_bytes, k32, 0, k_out);
  }
  // The function returns: xq_ and xk_ (views of the fp32 copies) die in declaration order.
  xq.reset();
  xk.reset();
}

namespace {

// x1 * cos - x2 * sin, x2 * cos + x1 * sin, cat: CPython drops a binary op's left operand
// before its right one, and the cat's argument list its items last to first.
// A low slice times an fp32 table: the product is fp32 (widen x the slice's bytes) and its
// MulBackward0 casts the slice's fp32 grad back (Autocast::promoted).
Tensor mul_table(Runtime& rt, const Tensor& x, const Tensor& table, uint64_t widen) {
  if (widen == 1) return mul(rt, x, table);
  Tensor out = mul(rt, rt.view_of(x, x.bytes * widen), table);
  Autocast::promoted(rt, out, 0, x);
  return out;
}

Tensor rotate_even_odd(Runtime& rt, const Tensor& x1, const Tensor& x2, const Tensor& cos,
                       const Tensor& sin, uint64_t widen) {
  Tensor first, second;
  {
    Tensor a = mul_table(rt, x1, cos, widen);
    Tensor b = mul_table(rt, x2, sin, widen);
    first = sub(rt, a, b);
    a.reset();
    b.reset();
  }
  {
    Tensor a = mul_table(rt, x2, cos, widen);
    Tensor b = mul_table(rt, x1, sin, widen);
    second = add(rt, a, b);
    a.reset();
    b.reset();
  }
  Tensor out = cat2(rt, first, second);
  second.reset();
  first.reset();
  return out;
}

}  // namespace

void rope_interleave_pair_hf(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& cos,
                             const Tensor& sin, Tensor& q_out, Tensor& k_out, uint64_t widen) {
  // cos[..., : d // 2].unsqueeze(1): views of the no-grad tables.
  const Tensor cos_half = rt.view_of(cos, cos.bytes / 2), sin_half = rt.view_of(sin, sin.bytes / 2);
  // q[..., 0::2], q[..., 1::2] (SliceBackward0 each), then k's.
  const Tensor q1 = slice_seq(rt, q, q.bytes / 2), q2 = slice_seq(rt, q, q.bytes / 2);
  const Tensor k1 = slice_seq(rt, k, k.bytes / 2), k2 = slice_seq(rt, k, k.bytes / 2);
  q_out = rotate_even_odd(rt, q1, q2, cos_half, sin_half, widen);
  k_out = rotate_even_odd(rt, k1, k2, cos_half, sin_half, widen);
}

void copy_into_slice(Runtime& rt, Tensor& base, const Tensor& src, uint64_t slice_bytes) {
  if (!wants_grad(rt, {&base, &src})) return;
  int32_t n = rt.make_node(OpKind::copy_slices, {&base, &src});
  Node& node = rt.node(n);
  node.size[0] = base.bytes;
  node.size[1] = slice_bytes;
  node.size[2] = src.bytes != slice_bytes ? src.bytes : 0;  // CopyBackwards' grad.to(src dtype)
  base.grad_fn = n;
  base.out_slot = 0;
}

}  // namespace memsim::graph
