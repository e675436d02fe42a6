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
//
// in_elem (default 2, bf16) is the cast tensor's element size. FSDP2's float8 all-gather
// (torchao/float8/fsdp_utils.py @36027d8, WeightWithDynamicFloat8CastTensor.
// fsdp_pre_all_gather; sim/parallel/fsdp2.h) casts the fp32 shard (in_elem 4): abs and
// amax are fp32 (4n, 4s), and tensor.to(float32) returns the tensor itself (no copy).
// reduce_amax (hp_tensor_to_float8_dynamic(..., reduce_amax=True)): tensor_to_amax's
// functional all_reduce(amax, "MAX") returns a new tensor (the C++ _c10d_functional
// all_reduce clones its input, then reduces in place) [in_elem*s] and the local amax dies
// when `amax` is rebound, before amax_to_scale.
#pragma once

#include <cstdint>

#include "graph/runtime.h"

namespace memsim::graph {

uint32_t float8_scale(Runtime& rt, uint64_t n, uint64_t s, bool pow2, TensorKind scale_kind,
                      uint64_t in_elem = 2, bool reduce_amax = false);
uint32_t float8_data(Runtime& rt, uint64_t n, TensorKind data_kind, uint64_t in_elem = 2);

}  // namespace memsim::graph
