// optimum-quanto's affine int2 / int4 quantization of one KV-cache tensor, as the device
// allocations and frees it makes (the quanto backend of transformers' QuantizedCache:
// graph/models/kv_cache.h, docs/generate.md "Quantized caches").
//
// Modelled from huggingface/optimum-quanto e33f8202e6c755256b7448789a5ed765c45d5105, with
// transformers' QuantoQuantizedCache._quantize / _dequantize (v4.45; 5.x's
// QuantoQuantizedLayer, read in transformers 5.17.0, calls the same functions) and their defaults
// axis_key = axis_value = 0 (the only axis modelled):
//  - quantize(x) of a contiguous (B, KV, T, hd) tensor of n elements, group size g, G = n / g
//    groups (e = the states' element size):
//    MaxOptimizer (tensor/optimizers/affine_optimizer.py, max_optimizer.py): group() is a
//    reshape to (G, g) (a view); rmin = amin(dim 1), rmax = amax: G x e each; (rmax - rmin)
//    then / (qmax - qmin) -> scale (the difference dies); shift = -rmin; rmin and rmax die
//    when optimize() returns. quantize_weight -> WeightsQBitsQuantizer.forward ->
//    quanto::quantize_affine (library/quantize.py, float shift): base + shift (n x e),
//    / scale (n x e; the sum dies), round (n x e; the quotient dies), clamp (n x e), .to(uint8)
//    (n bytes; the clamp dies), the rounded floats die on return. WeightQBitsTensor.create
//    keeps the plain class for a 4-D tensor (AWQ / TinyGemm need len(size) == 2), whose
//    __init__ packs (tensor/packed.py pack_weights): zeros((ceil(G / (8 / bits)), g)) uint8,
//    then per packed slot i one shifted temporary `unpacked[start:end] << bits * i` (OR-ed in
//    place, then freed); the unpacked uint8 dies when the Function returns.
//    Kept: packed data ceil(G / (8 / bits)) x g bytes, scale and shift G x e each.
//  - dequantize (tensor/qbits.py QBitsDequantizer): PackedTensor.unpack through quanto_cuda's
//    kernel (library/extensions/cuda/unpack.cu: one torch::empty of packed rows x 8 / bits,
//    sliced to G rows), scale * data (n x e), `-= shift` in place, ungroup (a reshape); the
//    unpacked bytes die on return. (quanto's Python fallback unpack, used without the CUDA
//    extension, makes other temporaries: not modelled.)
//
// Contract: pure allocation bookkeeping on graph::Runtime; no tensor values. Every tensor
// handed back is owned by the caller (reset() frees it).
#pragma once

#include <cstdint>

#include "graph/runtime.h"

namespace memsim::graph {

struct QuantoSpec {
  int bits = 4;              // 2 or 4 (qint2 / qint4)
  int64_t group_size = 64;   // cache_config q_group_size
};

// A WeightQBitsTensor's storages, in QTensor.__init__'s attribute order (data, scale, shift:
// the order they are freed when the tensor dies).
struct QuantoTensor {
  Tensor data, scale, shift;
  uint64_t numel = 0;
  void reset() {
    data.reset();
    scale.reset();
    shift.reset();
    numel = 0;
  }
  bool defined() const { return data.defined(); }
};

// quantize(x) for a contiguous tensor of `numel` elements of `elem` bytes.
QuantoTensor quanto_quantize(Runtime& rt, uint64_t numel, uint64_t elem, const QuantoSpec& q);
// qtensor.dequantize(): the (numel x elem) result.
Tensor quanto_dequantize(Runtime& rt, const QuantoTensor& t, uint64_t elem, const QuantoSpec& q);
// Bytes a quantized tensor of `numel` elements keeps (packed data, scale, shift).
uint64_t quanto_kept_bytes(uint64_t numel, uint64_t elem, const QuantoSpec& q);

}  // namespace memsim::graph
