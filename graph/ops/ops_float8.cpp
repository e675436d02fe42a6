#include "graph/ops/ops_float8.h"

#include "graph/ops/float8_cast.h"
#include "graph/ops/op_helpers.h"
#include "graph/ops/ops_float8_rowwise.h"

#include <stdexcept>

namespace memsim::graph {

namespace {

constexpr uint64_t kHp = 2;      // bf16 bytes per element (the scenario reader requires bf16)
constexpr uint64_t kScalar = 4;  // a 0-d fp32 (scale, reciprocal)

struct Alloc {
  Runtime& rt;
  TensorKind kind;
  uint32_t operator()(uint64_t bytes) const {
    return rt.alloc_raw(bytes, kind, OpKind::float8_linear);
  }
};

// tensor_to_scale / _ToFloat8ConstrFunc of a bf16 tensor of n elements, tensorwise: a 0-d
// scale, no power-of-2 rounding (graph/ops/float8_cast.h).
uint32_t scale_of(Runtime& rt, uint64_t n, TensorKind scale_kind) {
  return float8_scale(rt, n, 1, false, scale_kind);
}
uint32_t to_fp8(Runtime& rt, uint64_t n, TensorKind data_kind) {
  return float8_data(rt, n, data_kind);
}

// float8_mm -> addmm_float8_unwrapped: the scales' reciprocals, then _scaled_mm's bf16
// output (cuBLASLt); the reciprocals die when addmm_float8_unwrapped returns.
uint32_t scaled_mm(Runtime& rt, uint64_t out_bytes, TensorKind out_kind) {
  Alloc A{rt, TensorKind::temporary};
  const uint32_t a_inv = A(kScalar);
  const uint32_t b_inv = A(kScalar);
  const uint32_t out = rt.alloc_raw(out_bytes, out_kind, OpKind::float8_linear);
  rt.note_gemm_lt();
  rt.release(a_inv);
  rt.release(b_inv);
  return out;
}

// matmul_with_hp_or_float8_args' node: sizes [0] x elements (rows*in), [1] W elements
// (out*in), [2] grad elements (rows*out). The caller saves what its forward keeps.
int32_t float8_node(Runtime& rt, const Tensor& x, const Tensor& w, uint64_t nx, uint64_t nw,
                    uint64_t ng) {
  const int32_t n = rt.make_node(OpKind::float8_linear, {&x, &w});
  Node& node = rt.node(n);
  node.size[0] = nx;
  node.size[1] = nw;
  node.size[2] = ng;
  return n;
}

// The forward after the saves: the input's cast (a Float8Tensor local to it), _scaled_mm's
// high-precision result, the forward's FLOPs, and node n's backward costs (n < 0: no grad).
Tensor float8_forward_mm(Runtime& rt, const Tensor& x, const Tensor& w, int32_t n, uint64_t nx,
                         uint64_t nw, uint64_t ng, double flops) {
  const uint32_t x_scale = scale_of(rt, nx, TensorKind::temporary);
  const uint32_t x_fp8 = to_fp8(rt, nx, TensorKind::temporary);
  Tensor result = rt.adopt(scaled_mm(rt, ng * kHp, TensorKind::activation), ng * kHp);
  // The _scaled_mm reads the fp8 operands and writes the high-precision result.
  const double io = static_cast<double>(nx + nw + ng * kHp);
  rt.add_flops_forward(flops, io, MathDtype::fp8);
  rt.release(x_fp8);  // the Float8Tensor dies: _data, then _scale
  rt.release(x_scale);
  if (n >= 0) {
    Node& node = rt.node(n);
    node.flops = detail::matmul_backward_flops(x, w, flops);
    node.gemm_bytes = detail::matmul_backward_bytes(x, w, io);
    result.grad_fn = n;
  }
  return result;
}

}  // namespace

// Node sizes: [0] x elements (rows*in), [1] W elements (out*in), [2] grad elements (rows*out).
Tensor float8_linear(Runtime& rt, const Tensor& x, const Tensor& w, uint64_t rows, uint64_t in,
                     uint64_t out, double flops) {
  const uint64_t nx = rows * in, nw = out * in, ng = rows * out;
  const bool grad = detail::wants_grad(rt, {&x, &w});
  const TensorKind keep = grad ? TensorKind::activation : TensorKind::temporary;
  // Float8Linear.forward: _get_weight_scale, then _cast_weight_to_float8_t (kept: saved).
  Tensor w_scale = rt.adopt(scale_of(rt, nw, keep), kScalar);
  Tensor w_fp8 = rt.adopt(to_fp8(rt, nw, keep), nw);
  // matmul_with_hp_or_float8_args.forward: ctx.save_for_backward(input_hp, weight_hp_t)
  // first (a checkpoint's pack hooks run here, and its early stop unwinds from here),
  // then the input's cast, local to it.
  int32_t n = -1;
  if (grad) {
    n = float8_node(rt, x, w, nx, nw, ng);
    rt.save(n, x);      // input_hp
    rt.save(n, w_fp8);  // weight_fp8_t: its _data and _scale
    rt.save(n, w_scale);
  }
  return float8_forward_mm(rt, x, w, n, nx, nw, ng, flops);  // w_fp8, then w_scale, die here unless saved
}

Tensor float8_linear_gathered(Runtime& rt, const Tensor& x, const Tensor& w, uint32_t w_scale,
                              uint64_t rows, uint64_t in, uint64_t out, double flops) {
  if (w_scale == kNoStorage)
    throw std::logic_error("float8_linear_gathered: the weight has no FSDP2 float8 scale");
  const uint64_t nx = rows * in, nw = out * in, ng = rows * out;
  const bool grad = detail::wants_grad(rt, {&x, &w});
  // matmul_with_hp_or_float8_args.forward: ctx.save_for_backward(input_hp, weight_hp_t)
  // first; the weight is already float8 (tensor_already_casted_to_fp8): no cast.
  int32_t n = -1;
  if (grad) {
    n = float8_node(rt, x, w, nx, nw, ng);
    rt.save(n, x);                 // input_hp
    rt.save(n, w);                 // weight_hp_t's _data: FSDP2's gathered e4m3 storage
    rt.save_storage(n, w_scale);   // its _scale
  }
  return float8_forward_mm(rt, x, w, n, nx, nw, ng, flops);
}

bool run_float8_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (n.kind != OpKind::float8_linear) return false;
  if (n.size[3] != 0) return run_float8_rowwise_backward(rt, n, in, out);  // rowwise recipes
  if (in[0].storage == kNoStorage) return true;
  const uint64_t nx = n.size[0], nw = n.size[1], ng = n.size[2];
  const bool need_x = n.next[0].node >= 0, need_w = n.next[1].node >= 0;
  Alloc A{rt, TensorKind::temporary};
  const TensorKind w_kind =
      (need_w && rt.node(n.next[1].node).kind == OpKind::accumulate_grad) ? TensorKind::gradient
                                                                           : TensorKind::temporary;
  // grad_input: e5m2 grad (dim0), the saved fp8 weight copied column-major, the bf16 output.
  const uint32_t g_scale_a = scale_of(rt, ng, TensorKind::temporary);
  const uint32_t g_fp8_a = to_fp8(rt, ng, TensorKind::temporary);
  // torchao computes grad_input whether or not x needs it (it then dies on return).
  const uint32_t w_col = A(nw);  // b_data.t().contiguous().t()
  const uint32_t grad_input = scaled_mm(rt, nx * kHp, TensorKind::temporary);
  rt.release(w_col);
  // grad_weight: the grad cast again (dim1) and the saved bf16 input cast again.
  const uint32_t g_scale_b = scale_of(rt, ng, TensorKind::temporary);
  const uint32_t g_fp8_b = to_fp8(rt, ng, TensorKind::temporary);
  const uint32_t x_scale = scale_of(rt, nx, TensorKind::temporary);
  const uint32_t x_fp8 = to_fp8(rt, nx, TensorKind::temporary);
  const uint32_t g_row = A(ng);  // a_data.contiguous() of g8b.t()
  const uint32_t x_col = A(nx);  // b_data.t().contiguous().t()
  const uint32_t grad_weight = scaled_mm(rt, nw * kHp, w_kind);
  rt.release(g_row);
  rt.release(x_col);
  // The backward returns: its locals die in definition order.
  rt.release(g_fp8_a);
  rt.release(g_scale_a);
  rt.release(g_fp8_b);
  rt.release(g_scale_b);
  rt.release(x_fp8);
  rt.release(x_scale);
  if (need_x) {
    out[0] = Grad{grad_input, true, false};  // reshape of the mm result: a view
  } else {
    rt.release(grad_input);
  }
  if (need_w) {
    out[1] = Grad{grad_weight, false, false};  // grad_weight.t() back through W_fp8.t()
  } else {
    rt.release(grad_weight);
  }
  return true;
}

}  // namespace memsim::graph
