// HQQ's 8-bit quantization of one KV-cache tensor, as the device allocations, frees and
// torch.cuda.empty_cache() calls it makes (the HQQ backend of transformers' QuantizedCache,
// generate.cache quantized:int8: graph/models/kv_cache.h, docs/generate.md "HQQ").
//
// Modelled from transformers 5.17.0 cache_utils.py HQQQuantizedLayer._quantize / _dequantize
// (compute_dtype = self.keys.dtype, the states' dtype; device = the GPU; axis 0, the default)
// over mobiusml/hqq e0b1d00e095653359da9de1d7dbb35a994aa6b96:
//  - hqq/core/quantize.py Quantizer.quantize(tensor, nbits=8, group_size=g, axis=0) with its
//    defaults channel_wise, optimize, bitpack (n elements of e bytes, G = n / g groups):
//    W = tensor.float() (a 4n copy unless the states are fp32: then W is the tensor); the
//    (g, G) reshape is a view; W.min(axis 0)[0] and W.max: values 4G and int64 indices 8G each
//    (the indices die with the tuple); denom = max - min; scale = 255 / denom
//    (Tensor.__rtruediv__: reciprocal, then mul); torch.where(denom.abs() <= 1e-4,
//    full_like(scale, 1), scale); .clamp(max=2e4); zero = -min * scale (4G each; the
//    replaced ones die at each rebinding);
//  - optimize.py optimize_weights_proximal (= optimize_weights_proximal_legacy): on CUDA the
//    working dtype is float16 (2 bytes): W_f = W.to(fp16) 2n, scale and zero 2G copies,
//    best_error a 4-byte device tensor; per iteration _legacy_step (mul, add, round -> W_q;
//    sub, div -> W_r; shrink_lp_op(W_f - W_r): abs, pow and its scalar multiple (both alive at
//    once), sign; mean(W_q - (W_f - W_e) * scale) -> zero: every temporary 2n except the 2G
//    zero) and the error (sub, abs, mean 2 B, .float() 4 B, `<` 1 B); the previous W_r, W_q and
//    zero die when the step's results are bound, so every iteration after the first holds the
//    same bytes: the peak and what is alive after the loop are the same for any count of
//    iterations >= 2 that ends with the early stop (the loop's first error always beats
//    best_error = inf, so a finite run makes at least 2; the count itself depends on the data,
//    which memsim does not have: it emits kHqqIterations = 2). Then del W_f, W_q, W_r,
//    torch.cuda.empty_cache(), W_q = round(W * scale + zero) in fp32 (4n each step);
//  - back in quantize: the fp32 scale and zero die at the rebinding, del W, min, max,
//    torch.cuda.empty_cache(); scale = 1 / scale (reciprocal, mul: 2G); bitpack.py
//    pack_8bit_u8: W_q.to(uint8) (n bytes; no packing at 8 bits), the fp32 W_q dies;
//    torch.cuda.empty_cache() again; HQQQuantizedLayer then calls Quantizer.cuda = to_inplace,
//    whose meta[...].to(compute_dtype) copies the fp16 scale, then zero, unless the states are
//    fp16 (its moved W_q is dropped; meta's `.to(qtensor.device)` are no-ops).
//    Kept: W_q n bytes, scale and zero G x e each (the states' dtype).
//  - Quantizer.dequantize: unpack_8bit_u8 = W_q.to(compute_dtype) (n x e), (W_r - zero)
//    (n x e), * scale (n x e; the difference dies), reshape (a view); the unpacked dies.
// Three empty_cache events per quantize: the Program's empty_cache (the allocator releases
// its unused cached segments: reserved drops; allocated is unchanged).
// Not modelled: HQQ's other nbits (1, 2, 3, 4 pack differently), axis 1, a view_as_float or
// bitpack=False config (HQQQuantizedLayer passes neither), the hqq_aten extension (dequantize
// here is the Python path HQQQuantizedLayer calls).
//
// Contract: pure allocation bookkeeping on graph::Runtime; no tensor values. The returned
// storages (in the (W_q, meta{scale, zero}) tuple's order, the order they die) belong to the
// caller.
#pragma once

#include <cstdint>

#include "graph/models/quanto_kv.h"
#include "graph/runtime.h"

namespace memsim::graph {

// Iterations of optimize_weights_proximal memsim emits (see above: any count >= 2 that ends
// with the early stop has the same peak and leaves the same bytes).
inline constexpr int kHqqIterations = 2;

struct HqqSpec {
  int64_t group_size = 64;    // cache_config q_group_size
  bool states_fp16 = false;   // the states are float16: to_inplace's .to(compute_dtype) is a no-op
};

// Quantizer.quantize + to_inplace of a contiguous tensor of `numel` elements of `elem` bytes:
// data = W_q (uint8), scale, shift = meta's zero.
QuantoTensor hqq_quantize(Runtime& rt, uint64_t numel, uint64_t elem, const HqqSpec& q, int iterations = kHqqIterations);
// Quantizer.dequantize: the (numel x elem) result.
Tensor hqq_dequantize(Runtime& rt, const QuantoTensor& t, uint64_t elem);
// Bytes one quantized tensor keeps: n + 2 x G x elem.
uint64_t hqq_kept_bytes(uint64_t numel, uint64_t elem, const HqqSpec& q);

}  // namespace memsim::graph
