// torchao float8 training's linear with the rowwise recipes (precision.float8: rowwise,
// rowwise_with_gw_hp), as one op (OpKind::float8_linear, Node::size[3] = the recipe).
//
// Modelled from pytorch/ao @36027d8 (2026-08-21; the same Float8Linear since c6de9b4,
// "simplify Float8Linear", 2025-07-24): config.py Float8LinearConfig.from_recipe_name,
// float8_linear.py (Float8Linear.forward, matmul_with_hp_or_float8_args),
// float8_scaling_utils.py (hp_tensor_to_float8_dynamic, get_maybe_axiswise_dim),
// float8_utils.py and float8_training_tensor.py (the casts: graph/ops/float8_cast.h),
// float8_ops.py (float8_transpose, float8_view, float8_mm, preprocess_addmm,
// addmm_float8_unwrapped); torch._scaled_mm's rowwise path from pytorch's ScaledBlas.cpp
// (cuBLASLt on sm90 with cuBLAS >= 12.9, as torch 2.11+cu130 has).
//
// Recipes (bf16 x (rows, in), bf16 W (out, in); every cast e4m3, scales rounded down to
// powers of 2):
//   rowwise: all six casts axiswise.
//   rowwise_with_gw_hp: input, weight and grad_output axiswise for output / grad_input,
//     the weight tensorwise for grad_input, grad_weight in bf16 (casts DISABLED).
// Contract:
//   forward (Float8Linear.forward -> matmul_with_hp_or_float8_args.forward): saves
//     (input_hp, weight_hp_t): the bf16 x and W.t(), a view of the parameter: nothing more
//     is kept than by nn.Linear. x cast along dim -1 (scale (rows, 1): rows fp32), W.t()
//     along dim 0 (scale (1, out)); W.t()'s fp8 copy keeps the transposed strides, so
//     preprocess_addmm copies nothing; addmm_float8_unwrapped: the scales' reciprocals
//     (rows, out fp32), use_fast_accum (the output gemm's) skips the post scale;
//     _scaled_mm writes the bf16 (rows, out) output; the reciprocals die; the Function's
//     locals die: W's fp8 data and scale, then x's.
//   backward, incoming bf16 g (rows, out):
//     grad_input = mm(g8 [g along dim -1, scale rows], W8.t()): rowwise casts W.t() along
//       dim -1 (scale (in, 1)); gw_hp casts it tensorwise (0-d scale, repeated to (1, in)
//       by preprocess_addmm: in fp32). W8.t() is row-major: copied column-major (out*in).
//       No fast accum: a_inv (rows), b_inv (in), post_inverse_scale = a_inv * b_inv
//       [rows*in fp32], two 0-d new_ones replace them (each old one dying after), the
//       tensorwise-kernel output [2*rows*in], `output *= post` in place; then the 0-d
//       ones and post die, then the column-major copy (and gw_hp's repeated scale).
//     grad_weight (rowwise) = mm(g8b.t(), x8b): g along dim 0 (scale out), x along dim 0
//       (scale in); g8b.t() is column-major: made contiguous (rows*out); x8b row-major:
//       copied column-major (rows*in); a_inv (out), b_inv (in), post [out*in fp32], the
//       0-d ones, the bf16 (out, in) result; the 0-d ones and post die, then the copies.
//     grad_weight (gw_hp) = torch.mm(g.t(), x) in bf16: its (out, in) result only.
//     On return the locals die in definition order: g8 (data, scale), W8, g8b, x8b.
//     grad_input goes on as a view of the mm result (reshape), grad_weight.t() through
//     W.t()'s TBackward reaches AccumulateGrad in W's layout (stolen).
// 0-d tensors are 4-byte fp32s (one 512-byte block each).
#pragma once

#include <cstdint>

#include "graph/ops/ops_float8.h"
#include "graph/runtime.h"

namespace memsim::graph {

// x (rows, in) bf16, W (out, in) bf16; kind rowwise or rowwise_with_gw_hp.
Tensor float8_linear_rowwise(Runtime& rt, const Tensor& x, const Tensor& w, uint64_t rows,
                             uint64_t in, uint64_t out, double flops, Float8Kind kind);

// Backward of a rowwise float8_linear node (called by run_float8_backward).
bool run_float8_rowwise_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

}  // namespace memsim::graph
