#include "graph/ops/ops_lora.h"

#include "graph/ops/op_helpers.h"

namespace memsim::graph {

// Node sizes: [0] x (grad_A), [1] dequantised weight, [2] fp32 absmax temporary, [3] the
// weight's compute-dtype copy (0: none).
Tensor matmul_4bit(Runtime& rt, const Tensor& x, const Tensor& w_packed, const Nf4Sizes& deq,
                   uint64_t out_bytes, double flops) {
  (void)w_packed;  // kept alive by the module; saved by reference only
  const uint64_t w_bytes = deq.weight_cast > 0 ? deq.weight_cast : deq.weight;
  Tensor out;
  {
    Tensor absmax = rt.alloc(deq.absmax_fp32, TensorKind::temporary, OpKind::matmul_4bit);
    Tensor w = rt.alloc(deq.weight, TensorKind::temporary, OpKind::matmul_4bit);
    absmax.reset();
    if (deq.weight_cast > 0)  // .to(A.dtype): the load-dtype weight dies as it returns
      w = rt.alloc(deq.weight_cast, TensorKind::temporary, OpKind::matmul_4bit);
    out = detail::out_tensor(rt, out_bytes, OpKind::matmul_4bit);
    rt.note_gemm();
    rt.add_flops_forward(flops, static_cast<double>(x.bytes + w_bytes + out_bytes));
  }  // the dequantised weight dies with the expression
  if (detail::wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::matmul_4bit, {&x});
    Node& node = rt.node(n);
    node.size[0] = x.bytes;
    node.size[1] = deq.weight;
    node.size[2] = deq.absmax_fp32;
    node.size[3] = deq.weight_cast;
    node.flops = flops;  // grad_A only
    node.gemm_bytes = static_cast<float>(x.bytes + w_bytes + out_bytes);
    out.grad_fn = n;
  }
  return out;
}

bool run_lora_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (n.kind != OpKind::matmul_4bit) return false;
  if (in[0].storage == kNoStorage || n.next[0].node < 0) return true;
  const uint32_t absmax = rt.alloc_raw(n.size[2], TensorKind::temporary, n.kind);
  uint32_t w = rt.alloc_raw(n.size[1], TensorKind::temporary, n.kind);
  rt.release(absmax);
  if (n.size[3] > 0) {  // .to(grad_output.dtype)
    const uint32_t cast = rt.alloc_raw(n.size[3], TensorKind::temporary, n.kind);
    rt.release(w);
    w = cast;
  }
  rt.note_gemm();
  const uint32_t grad_a = rt.alloc_raw(n.size[0], TensorKind::temporary, n.kind);
  rt.release(w);
  out[0] = Grad{grad_a, false, false};
  return true;
}

}  // namespace memsim::graph
