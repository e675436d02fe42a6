// torchao float8 training's dynamic cast of one bf16 tensor, as eager PyTorch allocates it:
// the scale (tensor_to_scale) and the float8 data (_ToFloat8ConstrFunc.forward). Shared by
// the tensorwise op (graph/ops/ops_float8.h) and the rowwise recipes
// (graph/ops/ops_float8_rowwise.h). Modelled from pytorch/ao @36027d8 (2026-08-21):
// torchao/float8/float8_utils.py (tensor_to_amax, amax_to_scale, to_fp8_saturated,
// _round_scale_down_to_power_of_2) and float8_training_tensor.py (_ToFloat8ConstrFunc).
//
// Contract, for a bf16 tensor of n elements whose scale has s elements (1: tensorwise,
// a 0-d scale; rows or cols: axiswise, amax over the other dim with keepdim):
//   float8_scale: abs [2n], amax [2s bf16], abs dies; amax.to(f64) [8s], clamp [8s],
//     reciprocal [8s] (max_fp8 / t is Tensor.__rdiv__: reciprocal() * scalar), product [8s],
//     the reciprocal dies, the clamp dies; .to(f32) [4s], the f64 product dies; with
//     round_scales_to_power_of_2 (the rowwise recipes): log2 [4s], floor [4s], log2 dies,
//     exp2 [4s] (the scale), floor dies, the unrounded fp32 dies; then the f64 amax dies
//     (amax_to_scale returns), then the bf16 amax (tensor_to_scale returns).
//   float8_data: to(f32) [4n], * scale [4n], the copy dies, clamp [4n], .to(fp8) [n], the
//     clamp dies, the product dies. (The clamp is there through torch 2.11; torchao's note
//     says eager casts saturate from 2.12 on.)
// The returned storages are made with the caller's kind; everything else is a temporary.
#pragma once

#include <cstdint>

#include "graph/runtime.h"

namespace memsim::graph {

uint32_t float8_scale(Runtime& rt, uint64_t n, uint64_t s, bool pow2, TensorKind scale_kind);
uint32_t float8_data(Runtime& rt, uint64_t n, TensorKind data_kind);

}  // namespace memsim::graph
