// HQQ 8-bit quantize / dequantize of a KV-cache tensor (graph/models/hqq_kv.h).
#include "graph/models/hqq_kv.h"

#include "graph/ops/ops.h"

namespace memsim::graph {
namespace {

Tensor tmp(Runtime& rt, uint64_t bytes, OpKind op) { return new_tensor(rt, bytes, op, TensorKind::temporary); }

void empty_cache(Runtime& rt) { rt.program().empty_cache(rt.ctx.phase); }

}  // namespace

uint64_t hqq_kept_bytes(uint64_t numel, uint64_t elem, const HqqSpec& q) {
  return numel + 2 * (numel / static_cast<uint64_t>(q.group_size)) * elem;
}

QuantoTensor hqq_quantize(Runtime& rt, uint64_t numel, uint64_t elem, const HqqSpec& q, int iterations) {
  const uint64_t n = numel, G = numel / static_cast<uint64_t>(q.group_size);
  constexpr uint64_t kHalf = 2;  // optimize_weights_proximal's float16 on CUDA
  QuantoTensor out;
  out.numel = numel;
  // W = tensor.float(): the tensor itself when it is fp32.
  Tensor W = elem == 4 ? Tensor{} : tmp(rt, 4 * n, OpKind::to_copy);
  Tensor mn = tmp(rt, 4 * G, OpKind::max_dim);  // W.min(axis=0, keepdim=True)[0]
  tmp(rt, 8 * G, OpKind::max_dim).reset();      // its indices die with the tuple
  Tensor mx = tmp(rt, 4 * G, OpKind::max_dim);
  tmp(rt, 8 * G, OpKind::max_dim).reset();
  Tensor denom = tmp(rt, 4 * G, OpKind::sub);
  Tensor scale32;
  {
    Tensor recip = tmp(rt, 4 * G, OpKind::other);  // 255 / denom: reciprocal, then mul
    Tensor s0 = tmp(rt, 4 * G, OpKind::mul_scalar);
    recip.reset();
    Tensor ab = tmp(rt, 4 * G, OpKind::other);  // denom.abs()
    Tensor le = tmp(rt, G, OpKind::compare);    // <= 1e-4
    ab.reset();
    Tensor ones = tmp(rt, 4 * G, OpKind::full);  // full_like(scale, 1.0)
    Tensor s1 = tmp(rt, 4 * G, OpKind::where_scalar);
    le.reset();
    ones.reset();
    s0.reset();
    scale32 = tmp(rt, 4 * G, OpKind::other);  // .clamp(max=2e4)
  }
  Tensor zero32;
  {
    Tensor neg = tmp(rt, 4 * G, OpKind::neg);
    zero32 = tmp(rt, 4 * G, OpKind::mul);
  }
  // optimize_weights_proximal_legacy (float16 on the GPU).
  Tensor W_q32, scale16, zero16;
  {
    Tensor W_f = tmp(rt, kHalf * n, OpKind::to_copy);
    scale16 = tmp(rt, kHalf * G, OpKind::to_copy);
    zero16 = tmp(rt, kHalf * G, OpKind::to_copy);
    Tensor best = tmp(rt, 4, OpKind::lift_fresh);  // torch.tensor(inf, device=cuda)
    Tensor W_q, W_r, current;
    for (int i = 0; i < iterations; ++i) {
      // _legacy_step
      Tensor q;
      {
        Tensor a = tmp(rt, kHalf * n, OpKind::mul);  // W_f * scale
        Tensor b = tmp(rt, kHalf * n, OpKind::add);  // + zero
        a.reset();
        q = tmp(rt, kHalf * n, OpKind::other);  // round (clamp_ in place)
      }
      Tensor r;
      {
        Tensor d = tmp(rt, kHalf * n, OpKind::sub);  // W_q - zero
        r = tmp(rt, kHalf * n, OpKind::div);         // / scale
      }
      Tensor e;
      {
        Tensor x = tmp(rt, kHalf * n, OpKind::sub);  // W_f - W_r
        e = tmp(rt, kHalf * n, OpKind::other);       // shrink_lp_op: out = abs(x)
        Tensor p = tmp(rt, kHalf * n, OpKind::other);        // out.pow(lp_norm - 1)
        Tensor pm = tmp(rt, kHalf * n, OpKind::mul_scalar);  // (1 / beta) * ...
        p.reset();
        pm.reset();  // out.sub_(...).clamp_min_(0)
        tmp(rt, kHalf * n, OpKind::other).reset();  // out.mul_(torch.sign(x))
      }  // x dies when shrink_lp_op returns
      Tensor z;
      {
        Tensor a = tmp(rt, kHalf * n, OpKind::sub);  // W_f - W_e
        Tensor b = tmp(rt, kHalf * n, OpKind::mul);  // * scale
        a.reset();
        Tensor c = tmp(rt, kHalf * n, OpKind::sub);  // W_q - ...
        b.reset();
        z = tmp(rt, kHalf * G, OpKind::mean_dim);
      }
      e.reset();  // the step returns: W_e dies; W_r, W_q, zero rebound
      W_r = r;
      W_q = q;
      zero16 = z;
      // current_error = torch.abs(W_f - W_r).mean().float()
      {
        Tensor d = tmp(rt, kHalf * n, OpKind::sub);
        Tensor ab = tmp(rt, kHalf * n, OpKind::other);
        d.reset();
        Tensor m = tmp(rt, kHalf, OpKind::mean_all);
        ab.reset();
        current = tmp(rt, 4, OpKind::to_copy);
      }
      tmp(rt, 1, OpKind::compare).reset();  // current_error < best_error
      if (i + 1 < iterations) best = current;  // improved: best_error = current_error
      // else: break (the early stop)
    }
    W_f.reset();  // del W_f, W_q, W_r
    W_q.reset();
    W_r.reset();
    empty_cache(rt);
    Tensor a = tmp(rt, 4 * n, OpKind::mul);  // tensor * scale (fp32)
    Tensor b = tmp(rt, 4 * n, OpKind::add);  // + zero
    a.reset();
    W_q32 = tmp(rt, 4 * n, OpKind::other);  // round (clamp_ in place)
  }  // return: best_error and current_error die
  scale32.reset();  // W_q, scale, zero = ...: the fp32 scale and zero die
  zero32.reset();
  W.reset();  // del W, _min, _max
  mn.reset();
  mx.reset();
  empty_cache(rt);
  {
    Tensor recip = tmp(rt, kHalf * G, OpKind::other);  // 1.0 / scale
    Tensor s = tmp(rt, kHalf * G, OpKind::mul_scalar);
    recip.reset();
    scale16 = s;
  }
  out.data = new_tensor(rt, n, OpKind::to_copy, TensorKind::other);  // pack_8bit_u8
  W_q32.reset();
  empty_cache(rt);
  // to_inplace: meta["scale"], then meta["zero"] .to(compute_dtype).
  if (q.states_fp16) {
    out.scale = scale16;
    out.shift = zero16;
  } else {
    out.scale = new_tensor(rt, G * elem, OpKind::to_copy, TensorKind::other);
    scale16.reset();
    out.shift = new_tensor(rt, G * elem, OpKind::to_copy, TensorKind::other);
    zero16.reset();
  }
  denom.reset();  // quantize returns: its local denom dies
  return out;
}

Tensor hqq_dequantize(Runtime& rt, const QuantoTensor& t, uint64_t elem) {
  const uint64_t n = t.numel;
  Tensor w = tmp(rt, n * elem, OpKind::to_copy);  // unpack_8bit_u8: W_q.to(compute_dtype)
  Tensor d = tmp(rt, n * elem, OpKind::sub);      // W_r - zero
  Tensor r = new_tensor(rt, n * elem, OpKind::mul, TensorKind::activation);  // * scale
  d.reset();
  w.reset();
  return r;
}

}  // namespace memsim::graph
