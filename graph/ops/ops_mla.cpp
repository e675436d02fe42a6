#include "graph/ops/ops_mla.h"

#include "graph/ops/op_helpers.h"

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

void copy_into_slice(Runtime& rt, Tensor& base, const Tensor& src, uint64_t slice_bytes) {
  if (!wants_grad(rt, {&base, &src})) return;
  int32_t n = rt.make_node(OpKind::copy_slices, {&base, &src});
  Node& node = rt.node(n);
  node.size[0] = base.bytes;
  node.size[1] = slice_bytes;
  base.grad_fn = n;
  base.out_slot = 0;
}

}  // namespace memsim::graph
