// Numeric kernels of the cs336 family's ops: forward (graph/ops/ops.cpp's op functions) and
// backward (their autograd nodes), in double. Inputs are read only through the store
// (NumericContext::read), so a freed input shows as a violation plus NaN values; a
// backward reads only the node's incoming grads and its saved slots (plus shapes).
#include <cmath>
#include <limits>

#include "graph/numeric/numeric.h"
#include "graph/numeric/numeric_detail.h"

namespace memsim::graph {

using namespace numeric_detail;



void NumericKernels::forward(NumericContext& c, Runtime& rt, OpKind k,
                             std::initializer_list<const Tensor*> in_list,
                             std::initializer_list<const Tensor*> out_list) {
  const std::vector<const Tensor*> in(in_list), out(out_list);
  const NumericModel& m = c.model();
  const uint64_t E = m.elem;
  auto R = [&](size_t i, const char* what) -> const NumericBuffer& {
    return c.read(in[i]->storage, what);
  };
  auto W = [&](size_t i, Shape s, uint64_t esize = 0) -> Arr& {
    return c.write(out[i]->storage, std::move(s), esize ? esize : E).v;
  };
  const int64_t h = m.head_dim();
  const NumericHint hint = c.last_fwd_.hint;
  if (in.empty()) {  // a tensor made from no operands (arange, masks, cos/sin, ...)
    new_tensor(c, rt, k, out);
    return;
  }
  switch (k) {
    // --- elementwise unary -------------------------------------------------------
    case OpKind::pow2: {
      const auto& x = R(0, "self");
      Arr r = hint == NumericHint::cube ? Arr(x.v.cube()) : Arr(x.v.square());
      W(0, x.shape) = r;
      break;
    }
    case OpKind::rsqrt: { const auto& x = R(0, "self"); Arr r = x.v.rsqrt(); W(0, x.shape) = r; break; }
    case OpKind::sigmoid: {
      const auto& x = R(0, "self");
      Arr r = 1.0 / (1.0 + (-x.v).exp());
      W(0, x.shape) = r;
      break;
    }
    case OpKind::exp: { const auto& x = R(0, "self"); Arr r = x.v.exp(); W(0, x.shape) = r; break; }
    case OpKind::log: { const auto& x = R(0, "self"); Arr r = x.v.log(); W(0, x.shape) = r; break; }
    case OpKind::neg: { const auto& x = R(0, "self"); Arr r = -x.v; W(0, x.shape) = r; break; }
    case OpKind::add_scalar: {  // RMSNorm: mean(x^2) + eps; GPT-2's 1.0 + tanh (a hint)
      const auto& x = R(0, "self");
      Arr r = x.v + (hint == NumericHint::scalar ? c.last_fwd_.scalar : m.rms_eps);
      W(0, x.shape) = r;
      break;
    }
    case OpKind::div_scalar: {  // cs336 sdpa: scores / sqrt(h)
      const auto& x = R(0, "self");
      Arr r = x.v / std::sqrt(static_cast<double>(h));
      W(0, x.shape) = r;
      break;
    }
    case OpKind::clone: {
      const auto& x = R(0, "self");
      if (hint == NumericHint::shift_logits) {  // logits[:, :-1, :].contiguous()
        const Shape& xs = x.shape;
        const int64_t B = xs[0], S = xs[1], V = xs[2];
        Arr r(B * (S - 1) * V);
        for (int64_t b = 0; b < B; ++b)
          r.segment(b * (S - 1) * V, (S - 1) * V) = x.v.segment(b * S * V, (S - 1) * V);
        W(0, {B, S - 1, V}) = r;
      } else if (hint == NumericHint::qkv_piece) {  // GPT-2: one piece of (B,S,3D), heads split
        const int64_t B = x.shape[0], S = x.shape[1], D3 = x.shape[2], D = D3 / 3;
        const int64_t piece = static_cast<int64_t>(c.last_fwd_.scalar);
        Arr p(B * S * D);
        for (int64_t r = 0; r < B * S; ++r) p.segment(r * D, D) = x.v.segment(r * D3 + piece * D, D);
        W(0, {B, D / h, S, h}) = split_heads(p, B, S, D / h, h);
      } else if (hint == NumericHint::merge_heads) {
        const int64_t B = x.shape[0], S = x.shape[2];
        Arr r = merge_heads(x.v, B, S, x.shape[1], x.shape[3]);
        W(0, {B, S, x.shape[1] * x.shape[3]}) = r;
      } else {
        Arr r = x.v;
        W(0, x.shape) = r;
      }
      break;
    }
    // --- reductions over the last dim ---------------------------------------------
    case OpKind::mean_dim:
    case OpKind::sum_dim: {
      const auto& x = R(0, "self");
      const int64_t n = x.shape.back(), rows = numel(x.shape) / n;
      Arr r(rows);
      for (int64_t i = 0; i < rows; ++i) r[i] = x.v.segment(i * n, n).sum();
      if (k == OpKind::mean_dim) r /= static_cast<double>(n);
      W(0, with_last(x.shape, 1)) = r;
      break;
    }
    case OpKind::mean_all: {
      const auto& x = R(0, "self");
      Arr r(1);
      r[0] = x.v.sum() / static_cast<double>(x.v.size());
      W(0, {}) = r;
      break;
    }
    case OpKind::max_dim: {
      const auto& x = R(0, "self");
      const int64_t n = x.shape.back(), rows = numel(x.shape) / n;
      Arr val(rows), idx(rows);
      for (int64_t i = 0; i < rows; ++i) {
        Eigen::Index at = 0;
        val[i] = x.v.segment(i * n, n).maxCoeff(&at);
        idx[i] = static_cast<double>(at);
      }
      const Shape s = with_last(x.shape, 1);
      W(0, s) = val;
      W(1, s, 8) = idx;
      break;
    }
    case OpKind::log_softmax: {
      const auto& x = R(0, "self");
      const int64_t n = x.shape.back(), rows = numel(x.shape) / n;
      Arr r(x.v.size());
      for (int64_t i = 0; i < rows; ++i) {
        const Arr row = x.v.segment(i * n, n);
        const double mx = row.maxCoeff();
        r.segment(i * n, n) = row - mx - std::log((row - mx).exp().sum());
      }
      W(0, x.shape) = r;
      break;
    }
    // --- binary with broadcasting ---------------------------------------------------
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::div: {
      const auto& a = R(0, "self");
      const auto& b = R(1, "other");
      if (hint == NumericHint::mask_slice) {  // scores + mask[:, :S] (LLaMA eager)
        const Arr mv = mask_columns(b, a.shape.back());
        Arr r = a.v + expand(mv, {b.shape[0], a.shape.back()}, a.shape);
        W(0, a.shape) = r;
        break;
      }
      const Shape s = broadcast_shape(a.shape, b.shape);
      const Arr av = expand(a.v, a.shape, s), bv = expand(b.v, b.shape, s);
      Arr r = k == OpKind::add ? Arr(av + bv)
              : k == OpKind::sub ? Arr(av - bv)
              : k == OpKind::mul ? Arr(av * bv)
                                 : Arr(av / bv);
      W(0, s) = r;
      break;
    }
    case OpKind::where_scalar: {  // where(mask, x (...,S,S), -inf); mask (S,S) or GPT-2's (P,P)
      const auto& mask = R(0, "condition");
      const auto& x = R(1, "self");
      const Arr mv = expand_mask(mask, x.shape);
      Arr r = (mv != 0).select(x.v, -std::numeric_limits<double>::infinity());
      W(0, x.shape) = r;
      break;
    }
    case OpKind::gather: {  // gather(self (...,V), -1, index (...)) -> (...,1)
      const auto& x = R(0, "self");
      const auto& idx = R(1, "index");
      const int64_t n = x.shape.back();
      Arr r(idx.v.size());
      for (Eigen::Index i = 0; i < idx.v.size(); ++i) r[i] = x.v[i * n + static_cast<int64_t>(idx.v[i])];
      W(0, with_last(x.shape, 1)) = r;
      break;
    }
    case OpKind::nll_loss: {  // mean over rows of -logp[target]; total_weight = rows
      const auto& lp = R(0, "self");
      const auto& t = R(1, "target");
      const int64_t n = lp.shape.back();
      Arr r(1), tw(1);
      double s = 0;
      for (Eigen::Index i = 0; i < t.v.size(); ++i) s -= lp.v[i * n + static_cast<int64_t>(t.v[i])];
      tw[0] = static_cast<double>(t.v.size());
      r[0] = s / tw[0];
      W(0, {}) = r;
      W(1, {}) = tw;
      break;
    }
    // --- data movement -----------------------------------------------------------------
    case OpKind::view: {
      // A view shares its base's storage. cs336's head split is taken of a projection
      // output whose only other name dies at once: the storage is re-laid out in place.
      if (hint != NumericHint::split_heads) break;  // same layout (or a GPT-2 piece: see clone)
      if (rt.refs(in[0]->storage) - c.stashed(in[0]->storage) != 2)
        throw NumericError("numeric: split_heads view of a storage with other live names");
      NumericBuffer& x = c.buf(in[0]->storage);
      c.read(in[0]->storage, "self");
      const int64_t B = x.shape[0], S = x.shape[1];
      const int64_t Hx = x.shape[2] / h;  // q: heads; k/v: kv_heads (GQA)
      x.v = split_heads(x.v, B, S, Hx, h);
      x.shape = {B, Hx, S, h};
      break;
    }
    case OpKind::rope: {  // x (B,H,S,h): even lanes x1, odd lanes x2; out = cat(x1r, x2r)
      const auto& x = R(0, "self");
      const auto& f = R(1, "cos/sin");
      const int64_t S = x.shape[2], half = x.shape[3] / 2, rows = numel(x.shape) / x.shape[3];
      const int64_t fs = f.shape[1];  // rows of the cos/sin table (ctx or S)
      Arr r(x.v.size());
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t s = i % S;
        for (int64_t j = 0; j < half; ++j) {
          const double cs = f.v[s * half + j], sn = f.v[fs * half + s * half + j];
          const double x1 = x.v[i * 2 * half + 2 * j], x2 = x.v[i * 2 * half + 2 * j + 1];
          r[i * 2 * half + j] = cs * x1 - sn * x2;
          r[i * 2 * half + half + j] = sn * x1 + cs * x2;
        }
      }
      W(0, x.shape) = r;
      break;
    }
    // --- matmuls -------------------------------------------------------------------------
    case OpKind::bmm: {
      const auto& a = R(0, "self");
      const auto& braw = R(1, "mat2");
      // megatron: v is a piece of the fused QKV output (B,S,3h): (B,np,S,hn).
      const NumericBuffer* bp = &braw;
      NumericBuffer vpiece;
      if (hint == NumericHint::megatron_v) {
        vpiece.v = megatron_piece(braw, 2, c.model().head_dim(), &vpiece.shape);
        bp = &vpiece;
      }
      const NumericBuffer& b = *bp;
      const bool tb = hint == NumericHint::transpose_b;
      const size_t na = a.shape.size(), nb = b.shape.size();
      const int64_t M = a.shape[na - 2], K = a.shape[na - 1];
      const int64_t N = tb ? b.shape[nb - 2] : b.shape[nb - 1];
      const int64_t batch = numel(a.shape) / (M * K);
      Shape s = a.shape;
      s.back() = N;
      Arr r(batch * M * N);
      for (int64_t i = 0; i < batch; ++i) {
        MapM A(a.v.data() + i * M * K, M, K);
        Mat C = tb ? Mat(A * MapM(b.v.data() + i * N * K, N, K).transpose())
                   : Mat(A * MapM(b.v.data() + i * K * N, K, N));
        r.segment(i * M * N, M * N) = Eigen::Map<const Arr>(C.data(), M * N);
      }
      W(0, s) = r;
      break;
    }
    case OpKind::linear: {  // x (...,din) @ w (dout,din)^T
      const auto& x = R(0, "input");
      const auto& w = R(1, "weight");
      const int64_t din = w.shape[1], dout = w.shape[0], rows = numel(x.shape) / din;
      Mat C = MapM(x.v.data(), rows, din) * MapM(w.v.data(), dout, din).transpose();
      W(0, with_last(x.shape, dout)) = Eigen::Map<const Arr>(C.data(), rows * dout);
      break;
    }
    case OpKind::embedding:
    case OpKind::embedding_nn: {  // cs336 (index) and HF (embedding): weight[ids]
      const auto& w = R(0, "weight");
      const auto& ids = R(1, "indices");
      const int64_t D = w.shape[1];
      Arr r(ids.v.size() * D);
      for (Eigen::Index i = 0; i < ids.v.size(); ++i)
        r.segment(i * D, D) = w.v.segment(static_cast<int64_t>(ids.v[i]) * D, D);
      Shape s = ids.shape;
      s.push_back(D);
      W(0, s) = r;
      break;
    }
    default:
      if (forward_nn(c, rt, k, in, out)) break;     // graph/numeric/numeric_ops_nn.cpp
      if (forward_fused(c, rt, k, in, out)) break;  // graph/numeric/numeric_ops_fused.cpp
      throw NumericError(std::string("numeric: no forward kernel for ") + forward_name(k));
  }
}

void NumericKernels::new_tensor(NumericContext& c, Runtime& rt, OpKind k,
                                const std::vector<const Tensor*>& out) {
  (void)rt;
  const NumericModel& m = c.model();
  const NumericHint hint = c.last_fwd_.hint;
  auto W = [&](Shape s, uint64_t esize) -> Arr& {
    return c.write(out[0]->storage, std::move(s), esize).v;
  };
  if (hint != NumericHint::none) {
    new_tensor_nn(c, out);  // graph/numeric/numeric_ops_nn.cpp
    return;
  }
  switch (k) {
    case OpKind::arange: {
      const int64_t n = static_cast<int64_t>(out[0]->bytes / 8);
      W({n}, 8) = Arr::LinSpaced(n, 0, static_cast<double>(n - 1));
      break;
    }
    case OpKind::compare: {  // cs336 causal mask qi >= kj, (S,S) bool
      const int64_t S = m.seq;
      Arr r(S * S);
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) r[i * S + j] = i >= j ? 1.0 : 0.0;
      W({S, S}, 1) = r;
      break;
    }
    case OpKind::embedding: {
      // cs336 v2025: cos/sin gathered at positions arange(S) from the RoPE buffer.
      const auto& f = c.read(c.rope_buffer_, "the RoPE buffer");
      const int64_t ctx = f.shape[1], half = f.shape[2], Sq = m.seq;
      Arr r(2 * Sq * half);
      for (int64_t t = 0; t < 2; ++t)
        r.segment(t * Sq * half, Sq * half) = f.v.segment(t * ctx * half, Sq * half);
      W({2, Sq, half}, 4) = r;
      break;
    }
    default:
      // Scratch no kernel reads (ones_like, torch.full, no-grad temporaries): left
      // unwritten, so a read would be a NumericError ("never computed").
      break;
  }
}

void NumericKernels::set_grad(NumericContext& c, int i, std::vector<int64_t> shape,
                              Eigen::ArrayXd v) {
  c.pending_shape_[i] = std::move(shape);
  c.pending_[i] = std::move(v);
  c.pending_set_[i] = true;
}

void NumericKernels::backward(NumericContext& c, Runtime& rt, const Node& n,
                              const uint32_t* saved, const NumericContext::NodeInfo& info) {
  auto needs = [&](int i) { return n.next[i].node >= 0; };
  auto S = [&](uint32_t k, const char* what) -> const NumericBuffer& {
    return saved_slot(c, n, saved, k, what);
  };
  auto set = [&](int i, Shape s, Arr v) { set_grad(c, i, std::move(s), std::move(v)); };
  auto in_shape = [&](size_t i) -> const Shape& { return operand_shape(n, info, i); };
  // Nodes whose two input slots both carry grads (tied weights, GPT-2's QKV split).
  if (n.kind == OpKind::tied_sum || n.kind == OpKind::split_qkv) {
    backward_nn(c, rt, n, saved, info);
    return;
  }
  if (n.kind == OpKind::qkv_split) {  // megatron: q's grad in slot 0, v's in slot 1
    backward_fused(c, rt, n, saved, info);
    return;
  }
  if (n.grad[0] == kNoStorage && n.kind != OpKind::max_dim) return;
  const NumericBuffer& gb = c.read(n.grad[0], "grad_output");
  const Arr g = gb.v;
  const Shape gs = gb.shape;
  const int64_t h = c.model().head_dim();
  switch (n.kind) {
    case OpKind::pow2: {
      const auto& x = S(0, "self");
      if (info.hint == NumericHint::cube) set(0, x.shape, 3.0 * x.v.square() * g);
      else set(0, x.shape, 2.0 * x.v * g);
      break;
    }
    case OpKind::rsqrt: {
      const auto& r = S(0, "result");
      set(0, r.shape, -0.5 * g * r.v.cube());
      break;
    }
    case OpKind::sigmoid: { const auto& r = S(0, "result"); set(0, r.shape, g * r.v * (1.0 - r.v)); break; }
    case OpKind::exp: { const auto& r = S(0, "result"); set(0, r.shape, g * r.v); break; }
    case OpKind::log: { const auto& x = S(0, "self"); set(0, x.shape, g / x.v); break; }
    case OpKind::neg: set(0, gs, -g); break;
    case OpKind::add_scalar: set(0, gs, g); break;
    case OpKind::div_scalar: set(0, gs, g / std::sqrt(static_cast<double>(h))); break;
    case OpKind::clone:
      if (info.hint == NumericHint::merge_heads) {
        const Shape& x = in_shape(0);  // (B,H,S,h)
        set(0, x, split_heads(g, x[0], x[2], x[1], x[3]));
      } else {
        set(0, gs, g);
      }
      break;
    case OpKind::mean_dim:
    case OpKind::sum_dim: {
      const Shape& x = in_shape(0);
      Arr r = expand(g, gs, x);
      if (n.kind == OpKind::mean_dim) r /= static_cast<double>(x.back());
      set(0, x, r);
      break;
    }
    case OpKind::mean_all: {
      const Shape& x = in_shape(0);
      set(0, x, Arr::Constant(numel(x), g[0] / static_cast<double>(numel(x))));
      break;
    }
    case OpKind::max_dim: {
      if (n.grad[0] == kNoStorage) return;
      const auto& idx = S(0, "indices");
      const Shape& x = in_shape(0);
      const int64_t len = x.back();
      Arr r = Arr::Zero(numel(x));
      for (Eigen::Index i = 0; i < idx.v.size(); ++i) r[i * len + static_cast<int64_t>(idx.v[i])] = g[i];
      set(0, x, r);
      break;
    }
    case OpKind::log_softmax: {
      const auto& r = S(0, "result");
      const int64_t len = r.shape.back(), rows = numel(r.shape) / len;
      Arr out(r.v.size());
      for (int64_t i = 0; i < rows; ++i)
        out.segment(i * len, len) = g.segment(i * len, len) -
                                    r.v.segment(i * len, len).exp() * g.segment(i * len, len).sum();
      set(0, r.shape, out);
      break;
    }
    case OpKind::add: {
      if (needs(0)) set(0, in_shape(0), sum_to(g, gs, in_shape(0)));
      if (needs(1)) set(1, in_shape(1), sum_to(g, gs, in_shape(1)));
      break;
    }
    case OpKind::sub: {
      if (needs(0)) set(0, in_shape(0), sum_to(g, gs, in_shape(0)));
      if (needs(1)) set(1, in_shape(1), sum_to(Arr(-g), gs, in_shape(1)));
      break;
    }
    case OpKind::mul: {  // saved: other (if self needs grad), then self (if other does)
      uint32_t k = 0;
      if (needs(0)) {
        const auto& b = S(k++, "other");
        set(0, in_shape(0), sum_to(g * expand(b.v, b.shape, gs), gs, in_shape(0)));
      }
      if (needs(1)) {
        const auto& a = S(k++, "self");
        set(1, in_shape(1), sum_to(g * expand(a.v, a.shape, gs), gs, in_shape(1)));
      }
      break;
    }
    case OpKind::div: {  // saved: other, then self (if other needs grad)
      const auto& b = S(0, "other");
      const Arr bv = expand(b.v, b.shape, gs);
      if (needs(0)) set(0, in_shape(0), sum_to(g / bv, gs, in_shape(0)));
      if (needs(1)) {
        const auto& a = S(1, "self");
        const Arr av = expand(a.v, a.shape, gs);
        set(1, in_shape(1), sum_to(Arr(-g * av / (bv * bv)), gs, in_shape(1)));
      }
      break;
    }
    case OpKind::where_scalar: {
      const auto& mask = S(0, "condition");
      const Arr mv = expand_mask(mask, gs);
      set(0, gs, (mv != 0).select(g, 0.0));
      break;
    }
    case OpKind::gather: {
      const auto& x = S(0, "self");  // saved whole (GatherBackward0); only its shape is used
      const auto& idx = S(1, "index");
      const int64_t len = x.shape.back();
      Arr r = Arr::Zero(numel(x.shape));
      for (Eigen::Index i = 0; i < idx.v.size(); ++i) r[i * len + static_cast<int64_t>(idx.v[i])] += g[i];
      set(0, x.shape, r);
      break;
    }
    case OpKind::nll_loss: {
      const auto& lp = S(0, "self");
      const auto& t = S(1, "target");
      const auto& tw = S(2, "total_weight");
      const int64_t len = lp.shape.back();
      Arr r = Arr::Zero(numel(lp.shape));
      for (Eigen::Index i = 0; i < t.v.size(); ++i)
        r[i * len + static_cast<int64_t>(t.v[i])] = -g[0] / tw.v[0];
      set(0, lp.shape, r);
      break;
    }
    case OpKind::view: {
      if (info.hint == NumericHint::split_heads || info.hint == NumericHint::qkv_piece) {
        // grad (B,H,S,h) back to the projection's (B,S,D)
        Arr merged = merge_heads(g, gs[0], gs[2], gs[1], gs[3]);
        if (info.hint == NumericHint::qkv_piece) keep_split_part(c, n, info, merged);
        set(0, {gs[0], gs[2], gs[1] * gs[3]}, std::move(merged));
      } else {
        set(0, in_shape(0), g);
      }
      break;
    }
    case OpKind::rope: {
      // Read every saved cos/sin view (the schedule must keep them all).
      const auto& f = S(0, "cos");
      for (uint32_t k = 1; k < n.saved_count; ++k) S(k, "cos/sin");
      const int64_t Sq = gs[2], half = gs[3] / 2, rows = numel(gs) / gs[3], fs = f.shape[1];
      Arr r(g.size());
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t s = i % Sq;
        for (int64_t j = 0; j < half; ++j) {
          const double cs = f.v[s * half + j], sn = f.v[fs * half + s * half + j];
          const double g1 = g[i * 2 * half + j], g2 = g[i * 2 * half + half + j];
          r[i * 2 * half + 2 * j] = cs * g1 + sn * g2;
          r[i * 2 * half + 2 * j + 1] = -sn * g1 + cs * g2;
        }
      }
      set(0, gs, r);
      break;
    }
    case OpKind::bmm: {  // saved: mat2 (if self needs grad), then self (if mat2 does)
      const bool tb = info.hint == NumericHint::transpose_b;
      const bool mv = info.hint == NumericHint::megatron_v;
      const Shape& as = in_shape(0);
      Shape bs = in_shape(1);
      if (mv) bs = {as[0], as[1], as[2], c.model().head_dim()};  // the value piece
      const size_t na = as.size(), nb = bs.size();
      const int64_t M = as[na - 2], K = as[na - 1], N = tb ? bs[nb - 2] : bs[nb - 1];
      const int64_t batch = numel(as) / (M * K);
      uint32_t k = 0;
      if (needs(0)) {  // dA = dC @ B^T (B: K x N) or dC @ B (B^T given: N x K)
        const auto& braw = S(k++, "mat2");
        const NumericBuffer* bp = &braw;
        NumericBuffer vpiece;
        if (mv) {
          vpiece.v = megatron_piece(braw, 2, c.model().head_dim(), &vpiece.shape);
          bp = &vpiece;
        }
        const auto& b = *bp;
        Arr r(batch * M * K);
        for (int64_t i = 0; i < batch; ++i) {
          MapM dC(g.data() + i * M * N, M, N);
          Mat dA = tb ? Mat(dC * MapM(b.v.data() + i * N * K, N, K))
                      : Mat(dC * MapM(b.v.data() + i * K * N, K, N).transpose());
          r.segment(i * M * K, M * K) = Eigen::Map<const Arr>(dA.data(), M * K);
        }
        set(0, as, r);
      }
      if (needs(1)) {  // dB = A^T @ dC (K x N), or dC^T @ A (N x K)
        const auto& a = S(k++, "self");
        Arr r(batch * K * N);
        for (int64_t i = 0; i < batch; ++i) {
          MapM A(a.v.data() + i * M * K, M, K);
          MapM dC(g.data() + i * M * N, M, N);
          Mat dB = tb ? Mat(dC.transpose() * A) : Mat(A.transpose() * dC);
          r.segment(i * K * N, K * N) = Eigen::Map<const Arr>(dB.data(), K * N);
        }
        set(1, bs, r);
      }
      break;
    }
    case OpKind::linear: {  // next = {weight, input}; saved: input (if weight needs grad), weight
      const Shape& xs = in_shape(0);
      const Shape& ws = in_shape(1);
      const int64_t dout = ws[0], din = ws[1], rows = numel(xs) / din;
      uint32_t k = 0;
      if (needs(0)) set(0, ws, linear_weight_grad(g, S(k++, "input").v, rows, din, dout));
      if (needs(1)) set(1, xs, linear_input_grad(g, S(k++, "weight").v, rows, din, dout));
      break;
    }
    case OpKind::embedding:
    case OpKind::embedding_nn: {
      const auto& ids = S(0, "indices");
      const Shape& ws = in_shape(0);
      const int64_t D = ws[1];
      Arr r = Arr::Zero(numel(ws));
      for (Eigen::Index i = 0; i < ids.v.size(); ++i)
        r.segment(static_cast<int64_t>(ids.v[i]) * D, D) += g.segment(i * D, D);
      set(0, ws, r);
      break;
    }
    default:
      if (backward_nn(c, rt, n, saved, info)) break;     // graph/numeric/numeric_ops_nn.cpp
      if (backward_fused(c, rt, n, saved, info)) break;  // graph/numeric/numeric_ops_fused.cpp
      throw NumericError(std::string("numeric: no backward kernel for ") + backward_name(n.kind));
  }
}

}  // namespace memsim::graph
