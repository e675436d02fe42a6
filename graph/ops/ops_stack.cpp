#include "graph/ops/ops_stack.h"

#include "graph/ops/op_helpers.h"

namespace memsim::graph {

using detail::out_tensor;
using detail::wants_grad;

Tensor fused_rms_norm(Runtime& rt, const Tensor& x, const Tensor& w, uint64_t rows) {
  Tensor out = out_tensor(rt, x.bytes, OpKind::fused_rms_norm);
  Tensor rstd = out_tensor(rt, rows * 4, OpKind::fused_rms_norm);
  if (wants_grad(rt, {&x, &w})) {
    int32_t n = rt.make_node(OpKind::fused_rms_norm, {&x, &w});
    Node& node = rt.node(n);
    node.size[0] = x.bytes;
    node.size[1] = w.bytes;
    rt.save(n, x);
    rt.save(n, rstd);
    rt.save(n, w);
    out.grad_fn = n;
  }
  return out;  // rstd: not a Python result; the node keeps it
}

namespace {

// One rotated tensor's autograd node: size[0] its bytes, size[1] the table's bytes,
// size[2] the fp32 size when the input was 16-bit (0: fp32 input).
void rope_node(Runtime& rt, const Tensor& x, const Tensor& table, uint64_t table_bytes,
               uint64_t f32_bytes, Tensor& out) {
  if (!wants_grad(rt, {&x})) return;
  int32_t n = rt.make_node(OpKind::rope_complex, {&x});
  Node& node = rt.node(n);
  node.size[0] = x.bytes;
  node.size[1] = table_bytes;
  node.size[2] = f32_bytes;
  rt.save(n, table);
  out.grad_fn = n;
}

}  // namespace

void rope_complex_pair(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& table,
                       uint64_t table_bytes, uint64_t elem, Tensor& q_out, Tensor& k_out) {
  if (elem == 4) {
    q_out = out_tensor(rt, q.bytes, OpKind::rope_complex);
    rope_node(rt, q, table, table_bytes, 0, q_out);
    k_out = out_tensor(rt, k.bytes, OpKind::rope_complex);
    rope_node(rt, k, table, table_bytes, 0, k_out);
    return;
  }
  const uint64_t q32 = q.bytes / elem * 4, k32 = k.bytes / elem * 4;
  Tensor xq = rt.alloc(q32, TensorKind::temporary, OpKind::to_copy);  // xq.float()
  Tensor xk = rt.alloc(k32, TensorKind::temporary, OpKind::to_copy);
  Tensor pq = rt.alloc(q32, TensorKind::temporary, OpKind::rope_complex);  // xq_ * freqs_cis
  Tensor pk = rt.alloc(k32, TensorKind::temporary, OpKind::rope_complex);
  q_out = out_tensor(rt, q.bytes, OpKind::to_copy);  // .type_as(xq)
  rope_node(rt, q, table, table_bytes, q32, q_out);
  k_out = out_tensor(rt, k.bytes, OpKind::to_copy);
  rope_node(rt, k, table, table_bytes, k32, k_out);
  // The function returns: its locals die in declaration order.
  xq.reset();
  xk.reset();
  pq.reset();
  pk.reset();
}

Tensor rope_pairs(Runtime& rt, const Tensor& x, const Tensor& cache, uint64_t elem) {
  const uint64_t x32 = x.bytes / elem * 4, half = x32 / 2;
  Tensor xs = elem == 4 ? Tensor() : rt.alloc(x32, TensorKind::temporary, OpKind::to_copy);
  Tensor first, second;
  {
    Tensor a = rt.alloc(half, TensorKind::temporary, OpKind::mul);  // x0 * cos
    Tensor b = rt.alloc(half, TensorKind::temporary, OpKind::mul);  // x1 * sin
    first = rt.alloc(half, TensorKind::temporary, OpKind::sub);
  }
  {
    Tensor c = rt.alloc(half, TensorKind::temporary, OpKind::mul);  // x1 * cos
    Tensor d = rt.alloc(half, TensorKind::temporary, OpKind::mul);  // x0 * sin
    second = rt.alloc(half, TensorKind::temporary, OpKind::add);
  }
  Tensor stacked = elem == 4 ? out_tensor(rt, x32, OpKind::rope_pairs)
                             : rt.alloc(x32, TensorKind::temporary, OpKind::rope_pairs);
  first.reset();  // the list passed to stack dies with the call
  second.reset();
  Tensor out = elem == 4 ? stacked : out_tensor(rt, x.bytes, OpKind::to_copy);  // .type_as(x)
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::rope_pairs, {&x});
    Node& node = rt.node(n);
    node.size[0] = x.bytes;
    node.size[2] = elem == 4 ? 0 : x32;
    rt.save(n, cache);
    out.grad_fn = n;
  }
  // The function returns: xshaped, then x_out (its fp32 stack for 16-bit x).
  xs.reset();
  stacked.reset();
  return out;
}

}  // namespace memsim::graph
