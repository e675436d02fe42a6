#include "graph/ops/ops_float8_rowwise.h"

#include "graph/ops/float8_cast.h"
#include "graph/ops/op_helpers.h"

namespace memsim::graph {

namespace {

constexpr uint64_t kHp = 2;      // bf16 bytes per element (the scenario reader requires bf16)
constexpr uint64_t kScalar = 4;  // a 0-d fp32 (new_ones(()))

uint32_t temp(Runtime& rt, uint64_t bytes) {
  return rt.alloc_raw(bytes, TensorKind::temporary, OpKind::float8_linear);
}

// A Float8TrainingTensor made by hp_tensor_to_float8_dynamic: its data and scale storages.
struct Fp8 {
  uint32_t data = kNoStorage, scale = kNoStorage;
};

// hp_tensor_to_float8_dynamic of n bf16 elements with an s-element scale; both recipes
// set round_scales_to_power_of_2.
Fp8 cast(Runtime& rt, uint64_t n, uint64_t s) {
  Fp8 f;
  f.scale = float8_scale(rt, n, s, true, TensorKind::temporary);
  f.data = float8_data(rt, n, TensorKind::temporary);
  return f;
}

void drop(Runtime& rt, const Fp8& f) {  // the wrapper dies: _data, then _scale (__slots__)
  rt.release(f.data);
  rt.release(f.scale);
}

// addmm_float8_unwrapped with (rows_a, 1) and (1, cols_b) scales: a_inv, b_inv; without
// fast accum the post scale (rows_a x cols_b fp32) and two 0-d ones for the tensorwise
// kernel; _scaled_mm's bf16 output (cuBLASLt); the locals die on return.
uint32_t scaled_mm_rowwise(Runtime& rt, uint64_t rows_a, uint64_t cols_b, bool fast_accum,
                           TensorKind out_kind) {
  uint32_t a_inv = temp(rt, rows_a * 4);  // a_scale.reciprocal()
  uint32_t b_inv = temp(rt, cols_b * 4);  // b_scale.reciprocal()
  uint32_t post = kNoStorage;
  if (!fast_accum) {
    post = temp(rt, rows_a * cols_b * 4);  // a_inverse_scale * b_inverse_scale
    const uint32_t a1 = temp(rt, kScalar);  // a_inverse_scale.new_ones(())
    rt.release(a_inv);
    a_inv = a1;
    const uint32_t b1 = temp(rt, kScalar);  // a_inverse_scale.new_ones(())
    rt.release(b_inv);
    b_inv = b1;
  }
  const uint32_t out = rt.alloc_raw(rows_a * cols_b * kHp, out_kind, OpKind::float8_linear);
  rt.note_gemm_lt();
  // `output *= post_inverse_scale` is in place.
  rt.release(a_inv);
  rt.release(b_inv);
  if (post != kNoStorage) rt.release(post);
  return out;
}

}  // namespace

// Node sizes: [0] x elements (rows*in), [1] W elements (out*in), [2] grad elements
// (rows*out), [3] the Float8Kind in the low byte, `in` above it.
Tensor float8_linear_rowwise(Runtime& rt, const Tensor& x, const Tensor& w, uint64_t rows,
                             uint64_t in, uint64_t out, double flops, Float8Kind kind) {
  const uint64_t nx = rows * in, nw = out * in, ng = rows * out;
  const bool grad = detail::wants_grad(rt, {&x, &w});
  int32_t n = -1;
  if (grad) {  // ctx.save_for_backward(input_hp, weight_hp_t) comes first
    n = rt.make_node(OpKind::float8_linear, {&x, &w});
    Node& node = rt.node(n);
    node.size[0] = nx;
    node.size[1] = nw;
    node.size[2] = ng;
    node.size[3] = static_cast<uint64_t>(kind) | (in << 8);
    // ctx.save_for_backward(input_hp, weight_hp_t): x and W.t(), a view of the parameter.
    // memsim saves W first: a checkpoint's early stop after the last save then finds
    // the input's own alloc as the last event (graph/checkpoint.cpp's unborn output
    // rule); the order is memsim's own bookkeeping, both are packed before any cast.
    rt.save(n, w);
    rt.save(n, x);
  }
  const Fp8 x8 = cast(rt, nx, rows);  // axiswise_dim -1: scale (rows, 1)
  const Fp8 w8 = cast(rt, nw, out);   // W.t() along dim 0: scale (1, out)
  // float8_mm: x8 is row-major, W8.t() column-major (the cast kept W.t()'s strides).
  Tensor result =
      rt.adopt(scaled_mm_rowwise(rt, rows, out, true, TensorKind::activation), ng * kHp);
  const double io = static_cast<double>(nx + nw + ng * kHp);
  rt.add_flops_forward(flops, io, MathDtype::fp8);
  // The forward's locals die: weight_maybe_fp8_t, then input_maybe_fp8_reshaped (the
  // last reference to x8, as input_maybe_fp8 was cleared before).
  drop(rt, w8);
  drop(rt, x8);
  if (grad) {
    Node& node = rt.node(n);
    node.flops = detail::matmul_backward_flops(x, w, flops);
    node.gemm_bytes = detail::matmul_backward_bytes(x, w, io);
    result.grad_fn = n;
  }
  return result;
}

bool run_float8_rowwise_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (in[0].storage == kNoStorage) return true;
  const Float8Kind kind = static_cast<Float8Kind>(n.size[3] & 0xff);
  const bool gw_hp = kind == Float8Kind::rowwise_with_gw_hp;
  const uint64_t nx = n.size[0], nw = n.size[1], ng = n.size[2];
  const uint64_t d_in = n.size[3] >> 8, rows = nx / d_in, d_out = nw / d_in;
  const bool need_x = n.next[0].node >= 0, need_w = n.next[1].node >= 0;
  const TensorKind w_kind =
      (need_w && rt.node(n.next[1].node).kind == OpKind::accumulate_grad) ? TensorKind::gradient
                                                                           : TensorKind::temporary;
  // grad_input = mm(grad_output dim0, weight_t dim0 .t()).
  const Fp8 g8 = cast(rt, ng, rows);                // along dim -1: scale (rows, 1)
  const Fp8 w8 = cast(rt, nw, gw_hp ? 1 : d_in);    // rowwise: (in, 1); gw_hp: tensorwise
  const uint32_t w_col = temp(rt, nw);              // W8.t() row-major: t().contiguous().t()
  // gw_hp: a axiswise, b tensorwise: b_scale.repeat(in).reshape(1, -1).
  const uint32_t w_rep = gw_hp ? temp(rt, d_in * 4) : kNoStorage;
  const uint32_t grad_input = scaled_mm_rowwise(rt, rows, d_in, false, TensorKind::temporary);
  rt.release(w_col);  // float8_mm returns: b_data, then b_scale
  if (w_rep != kNoStorage) rt.release(w_rep);
  uint32_t grad_weight;
  Fp8 g8b, x8b;
  if (!gw_hp) {  // grad_weight = mm(grad_output dim1 .t(), input dim1)
    g8b = cast(rt, ng, d_out);  // along dim 0: scale (1, out)
    x8b = cast(rt, nx, d_in);   // along dim 0: scale (1, in)
    const uint32_t g_row = temp(rt, ng);  // g8b.t() is column-major: .contiguous()
    const uint32_t x_col = temp(rt, nx);  // x8b row-major: t().contiguous().t()
    grad_weight = scaled_mm_rowwise(rt, d_out, d_in, false, w_kind);
    rt.release(g_row);
    rt.release(x_col);
  } else {  // casts DISABLED: torch.mm(grad_output.t(), input) in bf16
    grad_weight = rt.alloc_raw(nw * kHp, w_kind, OpKind::float8_linear);
    rt.note_gemm();
  }
  // The backward returns: its locals die in definition order.
  drop(rt, g8);
  drop(rt, w8);
  if (!gw_hp) {
    drop(rt, g8b);
    drop(rt, x8b);
  }
  if (need_x) {
    out[0] = Grad{grad_input, true, false};  // reshape of the mm result: a view
  } else {
    rt.release(grad_input);
  }
  if (need_w) {
    out[1] = Grad{grad_weight, false, false};  // grad_weight.t() back through W.t()
  } else {
    rt.release(grad_weight);
  }
  return true;
}

}  // namespace memsim::graph
