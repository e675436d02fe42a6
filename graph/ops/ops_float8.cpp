#include "graph/ops/ops_float8.h"

#include "graph/ops/op_helpers.h"

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

// tensor_to_scale(t) of a bf16 tensor of n elements (float8_utils.py tensor_to_amax +
// amax_to_scale): returns the 0-d fp32 scale's storage (made with kind `scale_kind`).
uint32_t scale_of(Runtime& rt, uint64_t n, TensorKind scale_kind) {
  Alloc A{rt, TensorKind::temporary};
  const uint32_t abs = A(n * kHp);        // torch.abs(x)
  const uint32_t amax = A(kHp);           // torch.max(...): 0-d bf16
  rt.release(abs);
  const uint32_t amax64 = A(8);           // amax.to(torch.float64)
  const uint32_t clamped = A(8);          // torch.clamp(amax, min=EPS)
  const uint32_t recip = A(8);            // max_fp8 / t -> t.reciprocal() * max_fp8
  const uint32_t res = A(8);
  rt.release(recip);
  rt.release(clamped);
  const uint32_t scale = rt.alloc_raw(kScalar, scale_kind, OpKind::float8_linear);  // .to(f32)
  rt.release(res);     // `res = res.to(torch.float32)` rebinds
  rt.release(amax64);  // amax_to_scale returns
  rt.release(amax);    // tensor_to_scale returns
  return scale;
}

// _ToFloat8ConstrFunc.forward of a bf16 tensor of n elements: returns the fp8 data's
// storage (n bytes, kind `data_kind`).
uint32_t to_fp8(Runtime& rt, uint64_t n, TensorKind data_kind) {
  Alloc A{rt, TensorKind::temporary};
  const uint32_t f32 = A(n * 4);   // tensor.to(torch.float32)
  const uint32_t scaled = A(n * 4);  // ... / scale
  rt.release(f32);
  const uint32_t clamped = A(n * 4);  // to_fp8_saturated: x.clamp(...)
  const uint32_t bits = rt.alloc_raw(n, data_kind, OpKind::float8_linear);  // x.to(fp8)
  rt.release(clamped);  // to_fp8_saturated returns
  rt.release(scaled);   // forward returns
  return bits;
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
  // matmul_with_hp_or_float8_args.forward: the input's cast is local to it.
  const uint32_t x_scale = scale_of(rt, nx, TensorKind::temporary);
  const uint32_t x_fp8 = to_fp8(rt, nx, TensorKind::temporary);
  Tensor result = rt.adopt(scaled_mm(rt, ng * kHp, TensorKind::activation), ng * kHp);
  // The _scaled_mm reads the fp8 operands and writes the high-precision result.
  const double io = static_cast<double>(nx + nw + ng * kHp);
  rt.add_flops_forward(flops, io, MathDtype::fp8);
  rt.release(x_fp8);  // the Float8Tensor dies: _data, then _scale
  rt.release(x_scale);
  if (grad) {
    const int32_t n = rt.make_node(OpKind::float8_linear, {&x, &w});
    Node& node = rt.node(n);
    node.size[0] = nx;
    node.size[1] = nw;
    node.size[2] = ng;
    node.flops = detail::matmul_backward_flops(x, w, flops);
    node.gemm_bytes = detail::matmul_backward_bytes(x, w, io);
    rt.save(n, x);      // input_hp
    rt.save(n, w_fp8);  // weight_fp8_t: its _data and _scale
    rt.save(n, w_scale);
    result.grad_fn = n;
  }
  return result;  // w_fp8, then w_scale, die here unless saved
}

bool run_float8_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (n.kind != OpKind::float8_linear) return false;
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
