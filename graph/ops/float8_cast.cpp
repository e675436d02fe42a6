#include "graph/ops/float8_cast.h"

namespace memsim::graph {

namespace {
uint32_t temp(Runtime& rt, uint64_t bytes) {
  return rt.alloc_raw(bytes, TensorKind::temporary, OpKind::float8_linear);
}
}  // namespace

uint32_t float8_scale(Runtime& rt, uint64_t n, uint64_t s, bool pow2, TensorKind scale_kind,
                      uint64_t in_elem, bool reduce_amax) {
  const uint32_t abs = temp(rt, n * in_elem);   // torch.abs(x)
  uint32_t amax = temp(rt, s * in_elem);  // torch.max / torch.amax(..., keepdim=True): x's dtype
  rt.release(abs);
  if (reduce_amax) {  // amax = all_reduce(amax, "MAX", group): a clone, reduced in place
    const uint32_t reduced = temp(rt, s * in_elem);
    rt.release(amax);
    amax = reduced;
  }
  const uint32_t amax64 = temp(rt, s * 8);   // amax.to(torch.float64)
  const uint32_t clamped = temp(rt, s * 8);  // torch.clamp(amax, min=EPS)
  const uint32_t recip = temp(rt, s * 8);    // max_fp8 / t -> t.reciprocal() * max_fp8
  const uint32_t res = temp(rt, s * 8);
  rt.release(recip);
  rt.release(clamped);
  uint32_t scale;
  if (!pow2) {
    scale = rt.alloc_raw(s * 4, scale_kind, OpKind::float8_linear);  // res.to(torch.float32)
    rt.release(res);
  } else {
    const uint32_t res32 = temp(rt, s * 4);  // res.to(torch.float32)
    rt.release(res);
    // _round_scale_down_to_power_of_2: torch.exp2(torch.floor(torch.log2(scale)))
    const uint32_t lg = temp(rt, s * 4);
    const uint32_t fl = temp(rt, s * 4);
    rt.release(lg);
    scale = rt.alloc_raw(s * 4, scale_kind, OpKind::float8_linear);
    rt.release(fl);
    rt.release(res32);  // `res = _round_scale_down_to_power_of_2(res)` rebinds
  }
  rt.release(amax64);  // amax_to_scale returns
  rt.release(amax);    // tensor_to_scale returns
  return scale;
}

uint32_t float8_data(Runtime& rt, uint64_t n, TensorKind data_kind, uint64_t in_elem) {
  // tensor.to(torch.float32): a copy unless the tensor is fp32 already (then itself).
  const uint32_t f32 = in_elem == 4 ? kNoStorage : temp(rt, n * 4);
  const uint32_t scaled = temp(rt, n * 4);  // ... * scale
  if (f32 != kNoStorage) rt.release(f32);
  const uint32_t clamped = temp(rt, n * 4);  // to_fp8_saturated: x.clamp(...)
  const uint32_t bits = rt.alloc_raw(n, data_kind, OpKind::float8_linear);  // x.to(fp8)
  rt.release(clamped);  // to_fp8_saturated returns
  rt.release(scaled);   // _ToFloat8ConstrFunc.forward returns
  return bits;
}

}  // namespace memsim::graph
