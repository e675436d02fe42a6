// Numeric kernels of the Hugging Face families' ops (graph/ops/ops_nn.h): hf-llama and
// hf-gpt2, fp32 (dropout: NumericContext::dropout_mask). Forward kernels run on the outputs the op
// allocated; backward kernels read the incoming grads and the node's saved slots only
// (plus operand shapes), exactly like graph/numeric/numeric_ops.cpp.
//
// Layout conventions (values are row-major in each storage's logical shape):
//  - mm_linear: x (..., din) @ w^T, w (dout, din) (nn.Linear, lm_head);
//  - addmm (GPT-2 Conv1D): bias + x (..., din) @ w, w (din, dout);
//  - q/k/v after the head split are (B,H,S,hd); a key copy for q @ k^T stays (B,H,S,hd)
//    and the bmm reads it transposed (NumericHint::transpose_b);
//  - rope_hf: q*cos + rotate_half(q)*sin, rotate_half(x) = cat(-x2, x1), cos/sin (S,hd);
//  - repeat_kv (expand_clone): output head j reads kv head j / n_rep.
#include <cmath>
#include <limits>

#include "graph/numeric/numeric.h"
#include "graph/numeric/numeric_detail.h"

namespace memsim::graph {

using namespace numeric_detail;

namespace {

// RoPE: out = x*cos + rotate_half(x)*sin over (rows, hd), position = row % S.
Arr rope_apply(const Arr& x, const Arr& cos, const Arr& sin, int64_t S, int64_t hd, bool inverse) {
  const int64_t half = hd / 2, rows = x.size() / hd;
  Arr r(x.size());
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t s = i % S;
    const double* c = cos.data() + s * hd;
    const double* n = sin.data() + s * hd;
    const double* xi = x.data() + i * hd;
    double* o = r.data() + i * hd;
    if (!inverse) {  // x*cos + cat(-x2, x1)*sin
      for (int64_t j = 0; j < half; ++j) o[j] = xi[j] * c[j] - xi[j + half] * n[j];
      for (int64_t j = half; j < hd; ++j) o[j] = xi[j] * c[j] + xi[j - half] * n[j];
    } else {  // the adjoint: g*cos + rotate_half^T(g*sin), rotate_half^T(y) = cat(y2, -y1)
      for (int64_t j = 0; j < half; ++j) o[j] = xi[j] * c[j] + xi[j + half] * n[j + half];
      for (int64_t j = half; j < hd; ++j) o[j] = xi[j] * c[j] - xi[j - half] * n[j - half];
    }
  }
  return r;
}

// repeat_kv: (B,Hkv,S,hd) -> (B,Hkv*rep,S,hd), and its adjoint (sum over the copies).
Arr repeat_heads(const Arr& x, const Shape& xs, int64_t rep) {
  const int64_t B = xs[0], Hkv = xs[1], blk = xs[2] * xs[3];
  Arr r(x.size() * rep);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Hkv * rep; ++j)
      r.segment((b * Hkv * rep + j) * blk, blk) = x.segment((b * Hkv + j / rep) * blk, blk);
  return r;
}
Arr sum_heads(const Arr& g, const Shape& xs, int64_t rep) {
  const int64_t B = xs[0], Hkv = xs[1], blk = xs[2] * xs[3];
  Arr r = Arr::Zero(numel(xs));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Hkv * rep; ++j)
      r.segment((b * Hkv + j / rep) * blk, blk) += g.segment((b * Hkv * rep + j) * blk, blk);
  return r;
}

}  // namespace

bool NumericKernels::forward_nn(NumericContext& c, Runtime& rt, OpKind k,
                                const std::vector<const Tensor*>& in,
                                const std::vector<const Tensor*>& out) {
  const NumericModel& m = c.model();
  const uint64_t E = m.elem;
  const NumericHint hint = c.last_fwd_.hint;
  auto R = [&](size_t i, const char* what) -> const NumericBuffer& {
    return c.read(in[i]->storage, what);
  };
  auto W = [&](size_t i, Shape s, uint64_t esize = 0) -> Arr& {
    return c.write(out[i]->storage, std::move(s), esize ? esize : E).v;
  };
  switch (k) {
    case OpKind::mm_linear: {  // x @ w^T
      const auto& x = R(0, "self");
      const auto& w = R(1, "mat2");
      const int64_t dout = w.shape[0], din = w.shape[1], rows = numel(x.shape) / din;
      Mat C = MapM(x.v.data(), rows, din) * MapM(w.v.data(), dout, din).transpose();
      W(0, with_last(x.shape, dout)) = Eigen::Map<const Arr>(C.data(), rows * dout);
      return true;
    }
    case OpKind::addmm: {  // bias + x @ w (Conv1D)
      const auto& b = R(0, "bias");
      const auto& x = R(1, "mat1");
      const auto& w = R(2, "mat2");
      const int64_t din = w.shape[0], dout = w.shape[1], rows = numel(x.shape) / din;
      Mat C = MapM(x.v.data(), rows, din) * MapM(w.v.data(), din, dout);
      C.rowwise() += Eigen::Map<const Eigen::RowVectorXd>(b.v.data(), dout);
      W(0, with_last(x.shape, dout)) = Eigen::Map<const Arr>(C.data(), rows * dout);
      return true;
    }
    case OpKind::layer_norm: {  // (x - mean) * rstd * w + b over the last dim
      const auto& x = R(0, "input");
      const auto& w = R(1, "weight");
      const auto& b = R(2, "bias");
      const LayerNormForward f = layer_norm_forward(x.v, x.shape.back(), w.v, b.v, m.rms_eps);
      W(0, x.shape) = f.y;
      W(1, with_last(x.shape, 1), 4) = f.mean;
      W(2, with_last(x.shape, 1), 4) = f.rstd;
      return true;
    }
    case OpKind::softmax: {
      const auto& x = R(0, "self");
      const int64_t n = x.shape.back(), rows = numel(x.shape) / n;
      Arr r(x.v.size());
      for (int64_t i = 0; i < rows; ++i) {
        const Arr e = (x.v.segment(i * n, n) - x.v.segment(i * n, n).maxCoeff()).exp();
        r.segment(i * n, n) = e / e.sum();
      }
      W(0, x.shape) = r;
      return true;
    }
    case OpKind::tanh: { const auto& x = R(0, "self"); Arr r = x.v.tanh(); W(0, x.shape) = r; return true; }
    case OpKind::silu: {
      const auto& x = R(0, "self");
      Arr r = x.v / (1.0 + (-x.v).exp());
      W(0, x.shape) = r;
      return true;
    }
    case OpKind::mul_scalar: {
      if (hint != NumericHint::scalar)
        throw NumericError("numeric: mul.Scalar without its scalar (numeric_hint scalar)");
      const auto& x = R(0, "self");
      Arr r = x.v * c.last_fwd_.scalar;
      W(0, x.shape) = r;
      return true;
    }
    case OpKind::add_bcast: {  // inputs_embeds (B,S,D) + position_embeds (S,D)
      const auto& a = R(0, "self");
      const auto& b = R(1, "other");
      const Shape s = broadcast_shape(a.shape, b.shape);
      Arr r = expand(a.v, a.shape, s) + expand(b.v, b.shape, s);
      W(0, s) = r;
      return true;
    }
    case OpKind::slice_seq:  // a view of the logits: the shift_logits clone reads it
      R(0, "self");
      return true;
    case OpKind::split_qkv:  // views of the pieces follow (NumericHint::qkv_piece)
      R(0, "self");
      return true;
    case OpKind::expand_clone: {  // repeat_kv
      const auto& x = R(0, "self");
      const int64_t rep = static_cast<int64_t>(out[0]->bytes / in[0]->bytes);
      Shape s = x.shape;
      s[1] *= rep;
      Arr r = repeat_heads(x.v, x.shape, rep);
      if (out[0]->storage == in[0]->storage) {
        // expand (a single KV head): a view. Its base's other name is rebound at once,
        // so the storage is re-laid out in place (as the cs336 head split).
        if (rt.refs(in[0]->storage) - c.stashed(in[0]->storage) != 2)
          throw NumericError("numeric: repeat_kv view of a storage with other live names");
        NumericBuffer& b = c.buf(in[0]->storage);
        b.v = std::move(r);
        b.shape = std::move(s);
      } else {
        W(0, s) = r;
      }
      return true;
    }
    case OpKind::sdpa_flash:
    case OpKind::sdpa_efficient: {
      // F.scaled_dot_product_attention(q, k, v, is_causal=True), no dropout. The kernels
      // write the output (B,S,H,hd): it is the (B,S,D) input of o_proj as is. The
      // log-sum-exp (B,H,S) is padded to a multiple of 32 by the mem-efficient kernel.
      const auto& q = R(0, "query");
      const auto& kk = R(1, "key");
      const auto& v = R(2, "value");
      const int64_t B = q.shape[0], H = q.shape[1], Sq = q.shape[2], hd = q.shape[3];
      Arr o4, lse4;
      flash_forward(q.v, kk.v, v.v, B * H, Sq, hd, o4, lse4);
      const Arr o = merge_heads(o4, B, Sq, H, hd);
      const int64_t lse_len = out.size() > 1 ? static_cast<int64_t>(out[1]->bytes / 4) / (B * H) : Sq;
      Arr lse = Arr::Zero(B * H * lse_len);
      for (int64_t x = 0; x < B * H; ++x) lse.segment(x * lse_len, Sq) = lse4.segment(x * Sq, Sq);
      W(0, {B, Sq, H * hd}) = o;
      if (out.size() > 1) W(1, {B, H, lse_len}, 4) = lse;
      return true;
    }
    case OpKind::native_dropout: {  // x * mask / (1 - p), mask 1 byte per element
      const auto& x = R(0, "input");
      const Arr keep = c.dropout_mask(rt, x.v.size());
      W(0, x.shape) = x.v * keep / (1.0 - m.dropout);
      W(1, x.shape, 1) = keep;
      return true;
    }
    case OpKind::rope_hf: {
      const auto& x = R(0, "self");
      const auto& cs = R(1, "cos");
      const auto& sn = R(2, "sin");
      const int64_t hd = x.shape.back(), S = x.shape[x.shape.size() - 2];
      W(0, x.shape) = rope_apply(x.v, cs.v, sn.v, S, hd, false);
      return true;
    }
    default:
      return false;
  }
}

void NumericKernels::new_tensor_nn(NumericContext& c, const std::vector<const Tensor*>& out) {
  const NumericModel& m = c.model();
  const NumericHint hint = c.last_fwd_.hint;
  auto W = [&](Shape s, uint64_t esize) -> Arr& {
    return c.write(out[0]->storage, std::move(s), esize).v;
  };
  const int64_t S = m.seq, hd = m.head_dim();
  switch (hint) {
    case NumericHint::unread:
      return;
    case NumericHint::fill_scalar:
      W({}, m.elem) = Arr::Constant(1, c.last_fwd_.scalar);
      return;
    case NumericHint::causal_tril: {  // (P,P) bool
      const int64_t P = m.context;
      Arr r(P * P);
      for (int64_t i = 0; i < P; ++i)
        for (int64_t j = 0; j < P; ++j) r[i * P + j] = j <= i ? 1.0 : 0.0;
      W({P, P}, 1) = r;
      return;
    }
    case NumericHint::causal_mask: {  // (S, S+1): triu(full(min), 1) * (arange > position)
      const int64_t T = S + 1;
      const double lowest = static_cast<double>(std::numeric_limits<float>::lowest());
      Arr r(S * T);
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < T; ++j) r[i * T + j] = j > i ? lowest : 0.0;
      W({S, T}, m.elem) = r;
      return;
    }
    case NumericHint::rope_cos:
    case NumericHint::rope_sin: {  // (S, hd): emb = cat(freqs, freqs), freqs = pos * inv_freq
      Arr r(S * hd);
      for (int64_t p = 0; p < S; ++p)
        for (int64_t j = 0; j < hd; ++j) {
          const int64_t i = j % (hd / 2);
          const double inv = 1.0 / std::pow(m.rope_theta, static_cast<double>(2 * i) /
                                                              static_cast<double>(hd));
          const double a = static_cast<double>(p) * inv;
          r[p * hd + j] = hint == NumericHint::rope_cos ? std::cos(a) : std::sin(a);
        }
      W({S, hd}, 4) = r;
      return;
    }
    case NumericHint::shift_labels: {  // labels[:, 1:].contiguous()
      const NumericBuffer& l = c.read(c.last_aux_, "the labels");
      const int64_t B = l.shape[0], Sl = l.shape[1];
      Arr r(B * (Sl - 1));
      for (int64_t b = 0; b < B; ++b) r.segment(b * (Sl - 1), Sl - 1) = l.v.segment(b * Sl + 1, Sl - 1);
      W({B, Sl - 1}, 8) = r;
      return;
    }
    default:
      throw NumericError("numeric: a new tensor with a hint that does not make tensors");
  }
}

void NumericKernels::keep_split_part(NumericContext& c, const Node& n,
                                     const NumericContext::NodeInfo& info, const Arr& g) {
  stash_split_part(c, n.next[0].node, static_cast<int>(info.scalar), g);
}

void NumericKernels::stash_split_part(NumericContext& c, int32_t split, int which, const Arr& g) {
  if (split < 0) return;
  NumericContext::SplitParts* p = nullptr;
  for (auto& q : c.split_parts_)
    if (q.node == split) p = &q;
  if (p == nullptr) {
    c.split_parts_.emplace_back();
    p = &c.split_parts_.back();
    p->node = split;
  }
  p->part[which] = g;
  p->set[which] = true;
}

NumericContext::SplitParts NumericKernels::take_split_parts(NumericContext& c) {
  NumericContext::SplitParts parts;
  for (auto it = c.split_parts_.begin(); it != c.split_parts_.end(); ++it)
    if (it->node == c.cur_node_) {
      parts = std::move(*it);
      c.split_parts_.erase(it);
      break;
    }
  return parts;
}

bool NumericKernels::backward_nn(NumericContext& c, Runtime& rt, const Node& n,
                                 const uint32_t* saved, const NumericContext::NodeInfo& info) {
  (void)rt;
  auto needs = [&](int i) { return n.next[i].node >= 0; };
  auto S = [&](uint32_t k, const char* what) -> const NumericBuffer& {
    return saved_slot(c, n, saved, k, what);
  };
  auto set = [&](int i, Shape s, Arr v) { set_grad(c, i, std::move(s), std::move(v)); };
  auto in_shape = [&](size_t i) -> const Shape& { return operand_shape(n, info, i); };
  if (n.kind == OpKind::tied_sum) {  // the two uses' grads of one weight: their sum
    const bool a = n.grad[0] != kNoStorage, b = n.grad[1] != kNoStorage;
    if (!a && !b) return true;
    const NumericBuffer& x = c.read(n.grad[a ? 0 : 1], "a tied weight's grad");
    Arr sum = x.v;
    Shape s = x.shape;
    if (a && b) sum += c.read(n.grad[1], "a tied weight's grad").v;
    set(0, std::move(s), std::move(sum));
    return true;
  }
  if (n.kind == OpKind::split_qkv) {
    // cat(grad_q, grad_k, grad_v) along the last dim. memsim buffers k's and v's grads
    // summed in slot 1: the parts come from their ViewBackward kernels (SplitParts) and
    // the slots must hold exactly grad_q and grad_k + grad_v.
    if (n.grad[0] == kNoStorage && n.grad[1] == kNoStorage) return true;
    NumericContext::SplitParts parts = take_split_parts(c);
    const Shape& base = in_shape(0);  // (B,S,3D)
    const int64_t D = base.back() / 3, rows = numel(base) / base.back();
    for (int i = 0; i < 3; ++i)
      if (!parts.set[i]) parts.part[i] = Arr::Zero(rows * D);
    if (n.grad[0] != kNoStorage) {
      const NumericBuffer& q = c.read(n.grad[0], "grad of q");
      if (!(q.v.size() == parts.part[0].size() && (q.v == parts.part[0]).all()))
        c.violation("SplitBackward0: slot 0 does not hold q's grad");
    }
    if (n.grad[1] != kNoStorage) {
      const NumericBuffer& kv = c.read(n.grad[1], "grads of k and v");
      const Arr want = parts.part[1] + parts.part[2];
      if (!(kv.v.size() == want.size() && (kv.v == want).all()))
        c.violation("SplitBackward0: slot 1 does not hold k's grad + v's grad");
    }
    Arr r(rows * 3 * D);
    for (int64_t i = 0; i < rows; ++i)
      for (int p = 0; p < 3; ++p) r.segment(i * 3 * D + p * D, D) = parts.part[p].segment(i * D, D);
    set(0, base, std::move(r));
    return true;
  }
  if (n.grad[0] == kNoStorage) return true;
  const NumericBuffer& gb = c.read(n.grad[0], "grad_output");
  const Arr g = gb.v;
  const Shape gs = gb.shape;
  switch (n.kind) {
    case OpKind::mm_linear: {  // next = {x, w}; saved: x (if w needs grad), then w
      const Shape& xs = in_shape(0);
      const Shape& ws = in_shape(1);
      const int64_t dout = ws[0], din = ws[1], rows = numel(xs) / din;
      uint32_t k = 0;
      if (needs(1)) set(1, ws, linear_weight_grad(g, S(k++, "self").v, rows, din, dout));
      if (needs(0)) set(0, xs, linear_input_grad(g, S(k++, "mat2").v, rows, din, dout));
      return true;
    }
    case OpKind::addmm: {  // next = {bias, x, w}; saved: x (if w needs grad), then w
      const Shape& xs = in_shape(1);
      const Shape& ws = in_shape(2);
      const int64_t din = ws[0], dout = ws[1], rows = numel(xs) / din;
      MapM dY(g.data(), rows, dout);
      uint32_t k = 0;
      if (needs(2)) {
        const auto& x = S(k++, "mat1");
        Mat dW = MapM(x.v.data(), rows, din).transpose() * dY;
        set(2, ws, Eigen::Map<const Arr>(dW.data(), din * dout));
      }
      if (needs(1)) {
        const auto& w = S(k++, "mat2");
        Mat dX = dY * MapM(w.v.data(), din, dout).transpose();
        set(1, xs, Eigen::Map<const Arr>(dX.data(), rows * din));
      }
      if (needs(0)) {
        Eigen::RowVectorXd db = dY.colwise().sum();
        set(0, in_shape(0), Eigen::Map<const Arr>(db.data(), dout));
      }
      return true;
    }
    case OpKind::layer_norm: {  // saved: input, weight, bias, mean, rstd
      const auto& x = S(0, "input");
      const auto& w = S(1, "weight");
      S(2, "bias");
      const auto& mean = S(3, "mean");
      const auto& rstd = S(4, "rstd");
      const LayerNormBackward d = layer_norm_backward(x.v, x.shape.back(), w.v, mean.v, rstd.v, g);
      if (needs(0)) set(0, x.shape, d.dx);
      if (needs(1)) set(1, w.shape, d.dw);
      if (needs(2)) set(2, in_shape(2), d.db);
      return true;
    }
    case OpKind::softmax: {
      const auto& y = S(0, "result");
      const int64_t len = y.shape.back(), rows = numel(y.shape) / len;
      Arr r(y.v.size());
      for (int64_t i = 0; i < rows; ++i) {
        const Arr yi = y.v.segment(i * len, len), gi = g.segment(i * len, len);
        r.segment(i * len, len) = yi * (gi - (gi * yi).sum());
      }
      set(0, y.shape, r);
      return true;
    }
    case OpKind::tanh: {
      const auto& y = S(0, "result");
      set(0, y.shape, g * (1.0 - y.v.square()));
      return true;
    }
    case OpKind::silu: {
      const auto& x = S(0, "self");
      const Arr sg = 1.0 / (1.0 + (-x.v).exp());
      set(0, x.shape, g * sg * (1.0 + x.v * (1.0 - sg)));
      return true;
    }
    case OpKind::mul_scalar:
      set(0, gs, g * info.scalar);
      return true;
    case OpKind::add_bcast:
      if (needs(0)) set(0, in_shape(0), sum_to(g, gs, in_shape(0)));
      if (needs(1)) set(1, in_shape(1), sum_to(g, gs, in_shape(1)));
      return true;
    case OpKind::slice_seq: {  // zeros(input), grad copied into [:, :-1, :]
      const Shape& xs = in_shape(0);  // (B,S,V)
      const int64_t B = xs[0], Sx = xs[1], V = xs[2];
      Arr r = Arr::Zero(numel(xs));
      for (int64_t b = 0; b < B; ++b)
        r.segment(b * Sx * V, (Sx - 1) * V) = g.segment(b * (Sx - 1) * V, (Sx - 1) * V);
      set(0, xs, r);
      return true;
    }
    case OpKind::expand_clone: {
      const Shape& xs = in_shape(0);
      set(0, xs, sum_heads(g, xs, gs[1] / xs[1]));
      return true;
    }
    case OpKind::sdpa_flash:
    case OpKind::sdpa_efficient: {  // saved: q, k, v, out, lse; grad_out (B,S,H*hd)
      const auto& q = S(0, "query");
      const auto& kk = S(1, "key");
      const auto& v = S(2, "value");
      const auto& o = S(3, "out");
      const auto& lse = S(4, "logsumexp");
      const int64_t B = q.shape[0], H = q.shape[1], Sq = q.shape[2], hd = q.shape[3];
      const int64_t lse_len = lse.shape[2];
      Arr lse4(B * H * Sq), dq, dk, dv;
      for (int64_t x = 0; x < B * H; ++x) lse4.segment(x * Sq, Sq) = lse.v.segment(x * lse_len, Sq);
      flash_backward(q.v, kk.v, v.v, split_heads(o.v, B, Sq, H, hd), lse4,
                     split_heads(g, B, Sq, H, hd), B * H, Sq, hd, dq, dk, dv);
      if (needs(0)) set(0, q.shape, dq);
      if (needs(1)) set(1, kk.shape, dk);
      if (needs(2)) set(2, v.shape, dv);
      return true;
    }
    case OpKind::native_dropout: {  // saved: mask
      const auto& keep = S(0, "mask");
      set(0, gs, g * keep.v / (1.0 - c.model().dropout));
      return true;
    }
    case OpKind::rope_hf: {  // saved: cos, sin
      const auto& cs = S(0, "cos");
      const auto& sn = S(1, "sin");
      const int64_t hd = gs.back(), Sq = gs[gs.size() - 2];
      set(0, gs, rope_apply(g, cs.v, sn.v, Sq, hd, true));
      return true;
    }
    default:
      return false;
  }
}

}  // namespace memsim::graph
