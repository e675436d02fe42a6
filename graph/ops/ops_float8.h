// torchao float8 training's linear (Float8Linear, tensorwise dynamic scaling) as one op.
//
// Modelled from pytorch/ao's source (docs/float8.md has the citations and limits):
// torchao/float8/float8_linear.py @7ca1bfb (Float8Linear.forward, _get_weight_scale,
// _cast_weight_to_float8_t, matmul_with_hp_or_float8_args), float8_utils.py @024fe94
// (tensor_to_amax, amax_to_scale, to_fp8_saturated), float8_tensor.py
// (_ToFloat8ConstrFunc.forward) and float8_ops.py @067a632 (float8_mm, preprocess_addmm,
// addmm_float8_unwrapped). Default Float8LinearConfig (torchtitan's "tensorwise" recipe):
// dynamic scaling, e4m3 input and weight, e5m2 grad_output, pad_inner_dim off,
// force_recompute_fp8_weight_in_bwd off, no bias (Llama's linears), bf16 x and W.
//
// Contract: float8_linear(x, w) of a bf16 x (rows, in) and a bf16 W (out, in):
//   forward (Float8Linear.forward):
//     weight scale: abs(W) [bf16 out*in], max -> 0-d bf16 amax, abs dies; amax.to(f64),
//       clamp, reciprocal, * max_fp8 (the python scalar's __rtruediv__), reciprocal and
//       clamp die, .to(f32) = scale (0-d fp32), the f64 product dies, the f64 amax dies,
//       then the bf16 amax.
//     weight cast: W.to(f32) [4*out*in], / scale [4*out*in], the first dies, clamp
//       [4*out*in], .to(e4m3) [out*in bytes], the clamp dies, the quotient dies.
//     matmul_with_hp_or_float8_args.forward: saves (x, weight_fp8_t) first (before any
//       of its own allocations, as ctx.save_for_backward is its first line): x itself and
//       the fp8 weight's data + scale; the input is cast the same way (scale, then fp32
//       temporaries and the e4m3 copy, rows*in bytes); _scaled_mm takes the two scales'
//       reciprocals (0-d fp32 each), the W operand is W_fp8.t() (already column-major: no
//       copy) and writes the bf16 output (rows*out*2); the reciprocals die, then the e4m3
//       input and its scale.
//   backward (matmul_with_hp_or_float8_args.backward), incoming bf16 grad g (rows, out):
//     g cast to e5m2 (scale, fp32 temporaries, rows*out bytes) -> g8a;
//     grad_input = mm(g8a, W_fp8_t.t()): W_fp8_t.t() is row-major, so preprocess_addmm
//       copies it (t().contiguous().t(), out*in bytes); reciprocals; bf16 (rows, in)
//       output; copy and reciprocals die;
//     g cast to e5m2 again (its own amax, scale and copy) -> g8b; x cast to e4m3 again ->
//       x8b;
//     grad_weight = mm(g8b.t(), x8b): g8b.t() is column-major, copied contiguous
//       (rows*out bytes); x8b is row-major, copied to column-major (rows*in bytes);
//       reciprocals; bf16 (out, in) output; copies and reciprocals die;
//     the locals die on return (g8a + scale, g8b + scale, x8b + scale); then the engine
//     frees g and the saved x, W_fp8, scale. grad_input is a view of the mm result
//     (reshape back to 3-D); grad_weight.t().t() reaches AccumulateGrad in W's layout.
// 0-d tensors are one 512-byte block each, as every small tensor.
// Newer torchao (c6de9b4, 2025-07-24, "simplify Float8Linear", through @36027d8) casts the
// weight inside the Function for tensorwise too and saves the bf16 W.t(): the path
// graph/ops/ops_float8_rowwise.h models for the rowwise recipes. This op keeps @7ca1bfb's.
#pragma once

#include <cstdint>

#include "graph/models/float8_spec.h"
#include "graph/runtime.h"

namespace memsim::graph {

// rows, in, out: the linear's dimensions (x is rows x in, W is out x in), bf16.
Tensor float8_linear(Runtime& rt, const Tensor& x, const Tensor& w, uint64_t rows, uint64_t in,
                     uint64_t out, double flops);

// FSDP2's float8 all-gather (precision.float8_all_gather, sim/parallel/fsdp2.h): W arrives
// as FSDP2's gathered e4m3 tensor (the unsharded parameter is a Float8TrainingTensor made by
// WeightWithDynamicFloat8CastTensor.fsdp_post_all_gather, torchao/float8/fsdp_utils.py
// @36027d8), and w_scale is its scale's storage (Parameter::float8_scale). torchao
// @36027d8's matmul_with_hp_or_float8_args sees tensor_already_casted_to_fp8(weight_hp_t)
// and casts nothing for the weight, in forward or backward: forward = save (x, W.t()), then
// the input's cast and _scaled_mm as above (the e4m3 W.t() is column-major: no copy);
// saved: x, W (no memory of its own: FSDP2 frees the gathered storage by resize_(0) under
// the saved reference, as it does for bf16 weights) and the scale, which the saved
// Float8TrainingTensor keeps alive after FSDP2 moves on to the next all-gather's scale.
// Backward: exactly float8_linear's (grad cast twice, W.t().t() copied column-major, x cast
// again): the recipe's casts of grad_output and input are the same tensorwise casts.
Tensor float8_linear_gathered(Runtime& rt, const Tensor& x, const Tensor& w, uint32_t w_scale,
                              uint64_t rows, uint64_t in, uint64_t out, double flops);

// Backward of OpKind::float8_linear; false for any other kind.
bool run_float8_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

}  // namespace memsim::graph
