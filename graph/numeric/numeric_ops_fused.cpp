// Numeric kernels of Megatron-LM's fused ops (graph/ops/ops_fused.h), tensor parallel 1, no
// sequence parallelism, eager core attention or TE fused attention, fp32 (dropout:
// NumericContext::dropout_mask).
//
// Megatron's ops take their parameters as byte counts, so the builder names them
// (numeric_param_hint: weight and bias indices) and the kernels read the parameters'
// storages directly (alive for the whole run). Their grads go to main_grad
// (NumericContext::add_main_grad), as gradient-accumulation fusion and the DDP hooks do;
// only activation grads travel through the schedule's storages.
//
// Layout: memsim keeps Megatron's [s, b, h] activations; numerically the rows are kept in
// [b, s] order throughout (the embedding's transpose(0, 1).contiguous() and the loss's
// transpose back are identities on these values). Every op but attention is row-wise, so
// only the attention kernels see the order. The fused QKV output's last dim is laid out
// (np, 3, hn) (mixed.view(s, b, np, 3 hn).split(hn)).
#include <cmath>

#include "graph/numeric/numeric.h"
#include "graph/numeric/numeric_detail.h"

namespace memsim::graph {

using namespace numeric_detail;

namespace {

constexpr double kGeluC = 0.79788456;  // Megatron's bias_gelu: sqrt(2/pi), as written
constexpr double kGeluA = 0.044715;

Arr gelu(const Arr& z) { return z * 0.5 * (1.0 + (kGeluC * z * (1.0 + kGeluA * z * z)).tanh()); }
Arr gelu_grad(const Arr& z) {  // d/dz of gelu() above
  const Arr t = (kGeluC * z * (1.0 + kGeluA * z * z)).tanh();
  return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * kGeluC * (1.0 + 3.0 * kGeluA * z * z);
}

// Column sums of a (rows, n) row-major array.
Arr col_sums(const Arr& g, int64_t n) {
  return MapM(g.data(), g.size() / n, n).colwise().sum().transpose().array();
}

// The pieces' (B,np,S,hn) grads back into the fused (B,S,3h) layout.
Arr megatron_cat(const Arr* parts, int64_t B, int64_t np, int64_t S, int64_t hn) {
  const int64_t h3 = 3 * np * hn;
  Arr r(B * S * h3);
  for (int p = 0; p < 3; ++p)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < np; ++j)
        for (int64_t s = 0; s < S; ++s)
          r.segment((b * S + s) * h3 + (j * 3 + p) * hn, hn) =
              parts[p].segment(((b * np + j) * S + s) * hn, hn);
  return r;
}

}  // namespace

bool NumericKernels::forward_fused(NumericContext& c, Runtime& rt, OpKind k,
                                   const std::vector<const Tensor*>& in,
                                   const std::vector<const Tensor*>& out) {
  const NumericModel& m = c.model();
  const NumericContext::NodeInfo& info = c.last_fwd_;
  auto R = [&](size_t i, const char* what) -> const NumericBuffer& {
    return c.read(in[i]->storage, what);
  };
  auto W = [&](size_t i, Shape s, uint64_t esize = 0) -> Arr& {
    return c.write(out[i]->storage, std::move(s), esize ? esize : m.elem).v;
  };
  auto P = [&](int32_t i, const char* what) -> const NumericBuffer& {
    if (i < 0 || static_cast<size_t>(i) >= rt.parameters().size())
      throw NumericError(std::string("numeric: ") + forward_name(k) + ": its " + what +
                         " parameter is not named (numeric_param_hint)");
    return c.read(rt.parameters()[static_cast<size_t>(i)].storage, what);
  };
  const int32_t weight = info.hint == NumericHint::param ? static_cast<int32_t>(info.scalar) : -1;
  const int64_t hn = m.head_dim();
  switch (k) {
    case OpKind::megatron_embedding: {
      const auto& ids = R(0, "indices");
      const auto& w = P(weight, "embedding");
      const int64_t D = w.shape[1];
      Arr r(ids.v.size() * D);
      for (Eigen::Index i = 0; i < ids.v.size(); ++i)
        r.segment(i * D, D) = w.v.segment(static_cast<int64_t>(ids.v[i]) * D, D);
      Shape s = ids.shape;
      s.push_back(D);
      W(0, s) = r;
      return true;
    }
    case OpKind::megatron_linear: {  // x @ W^T (+ b): W (out, in)
      const auto& x = R(0, "input");
      const auto& w = P(weight, "weight");
      const int64_t dout = w.shape[0], din = w.shape[1], rows = numel(x.shape) / din;
      Mat C = MapM(x.v.data(), rows, din) * MapM(w.v.data(), dout, din).transpose();
      if (info.bias >= 0)
        C.rowwise() += Eigen::Map<const Eigen::RowVectorXd>(P(info.bias, "bias").v.data(), dout);
      W(0, with_last(x.shape, dout)) = Eigen::Map<const Arr>(C.data(), rows * dout);
      return true;
    }
    case OpKind::fused_layer_norm: {
      const auto& x = R(0, "input");
      const auto& w = P(weight, "weight");
      const auto& b = P(info.bias, "bias");
      const LayerNormForward f = layer_norm_forward(x.v, x.shape.back(), w.v, b.v, m.rms_eps);
      W(0, x.shape) = f.y;
      W(1, with_last(x.shape, 1), 4) = f.mean;
      W(2, with_last(x.shape, 1), 4) = f.rstd;  // Megatron's invvar
      return true;
    }
    case OpKind::qkv_split:  // views; the attention kernels read the pieces
      R(0, "self");
      return true;
    case OpKind::baddbmm: {  // q k^T / sqrt(hn) of the q and k pieces: (B,np,S,S)
      const auto& mixed = R(0, "query");
      R(1, "key");
      Shape qs;
      const Arr q = megatron_piece(mixed, 0, hn, &qs), kk = megatron_piece(mixed, 1, hn, nullptr);
      const int64_t S = qs[2], heads = qs[0] * qs[1];
      Arr r(heads * S * S);
      for (int64_t i = 0; i < heads; ++i) {
        Mat sc = MapM(q.data() + i * S * hn, S, hn) * MapM(kk.data() + i * S * hn, S, hn).transpose() /
                 std::sqrt(static_cast<double>(hn));
        r.segment(i * S * S, S * S) = Eigen::Map<const Arr>(sc.data(), S * S);
      }
      W(0, {qs[0], qs[1], S, S}) = r;
      return true;
    }
    case OpKind::fused_softmax: {  // scale 1, upper triangle masked, softmax
      const auto& x = R(0, "scores");
      const int64_t S = x.shape.back(), rows = numel(x.shape) / S;
      Arr r = Arr::Zero(x.v.size());
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t q = i % S;  // the query position: keys 0..q
        const Arr row = x.v.segment(i * S, q + 1);
        const Arr e = (row - row.maxCoeff()).exp();
        r.segment(i * S, q + 1) = e / e.sum();
      }
      W(0, x.shape) = r;
      return true;
    }
    case OpKind::bias_dropout_add: {  // residual + dropout(x + bias)
      const auto& x = R(0, "input");
      const auto& res = R(1, "residual");
      Arr z = x.v;
      if (info.bias >= 0) {
        const auto& b = P(info.bias, "bias");
        z += expand(b.v, b.shape, x.shape);
      }
      if (out.size() > 1) {  // dropout active: the mask is an output
        const Arr keep = c.dropout_mask(rt, z.size());
        z = z * keep / (1.0 - m.dropout);
        W(1, x.shape, 1) = keep;
      }
      W(0, x.shape) = res.v + z;
      return true;
    }
    case OpKind::fused_attention: {  // TE fused attention on the packed QKV, causal
      const auto& mixed = R(0, "qkv");
      Shape qs;
      const Arr q = megatron_piece(mixed, 0, hn, &qs), kk = megatron_piece(mixed, 1, hn, nullptr),
                v = megatron_piece(mixed, 2, hn, nullptr);
      const int64_t B = qs[0], np = qs[1], Sq = qs[2];
      Arr o, lse;
      flash_forward(q, kk, v, B * np, Sq, hn, o, lse);
      W(0, {B, Sq, np * hn}) = merge_heads(o, B, Sq, np, hn);  // [s, b, h]: the proj input
      W(1, {B, np, Sq}, 4) = lse;
      return true;
    }
    case OpKind::dropout: {
      const auto& x = R(0, "input");
      const Arr keep = c.dropout_mask(rt, x.v.size());
      W(0, x.shape) = x.v * keep / (1.0 - m.dropout);
      W(1, x.shape, 1) = keep;
      return true;
    }
    case OpKind::bias_gelu: {
      const auto& x = R(0, "input");
      Arr z = x.v;
      if (info.bias >= 0) {
        const auto& b = P(info.bias, "bias");
        z += expand(b.v, b.shape, x.shape);
      }
      W(0, x.shape) = gelu(z);
      return true;
    }
    case OpKind::vocab_parallel_ce: {
      // outputs: loss (rows), the saved fp32 softmax, target_mask (none out of range),
      // masked_target (the labels: t == 1).
      const auto& lg = R(0, "logits");
      if (info.hint != NumericHint::labels)
        throw NumericError("numeric: vocab_parallel_cross_entropy without its labels");
      const auto& t = c.read(c.last_aux_, "the labels");
      const int64_t V = lg.shape.back(), rows = numel(lg.shape) / V;
      Arr loss(rows), sm(rows * V);
      for (int64_t i = 0; i < rows; ++i) {
        const Arr row = lg.v.segment(i * V, V);
        const double mx = row.maxCoeff();
        const Arr e = (row - mx).exp();
        const double sum = e.sum();
        loss[i] = mx + std::log(sum) - row[static_cast<int64_t>(t.v[i])];
        sm.segment(i * V, V) = e / sum;
      }
      W(0, {rows}, 4) = loss;
      W(1, {rows, V}, 4) = sm;
      W(2, {rows}, 1) = Arr::Zero(rows);
      W(3, {rows}, 8) = t.v;
      return true;
    }
    default:
      return false;
  }
}

bool NumericKernels::backward_fused(NumericContext& c, Runtime& rt, const Node& n,
                                    const uint32_t* saved, const NumericContext::NodeInfo& info) {
  auto needs = [&](int i) { return i < n.n_next && n.next[i].node >= 0; };
  auto S = [&](uint32_t k, const char* what) -> const NumericBuffer& {
    return saved_slot(c, n, saved, k, what);
  };
  auto P = [&](int32_t i, const char* what) -> const NumericBuffer& {
    if (i < 0 || static_cast<size_t>(i) >= rt.parameters().size())
      throw NumericError("numeric: " + std::string(backward_name(n.kind)) + ": its " + what +
                         " parameter is not named (numeric_param_hint)");
    return c.read(rt.parameters()[static_cast<size_t>(i)].storage, what);
  };
  auto set = [&](int i, Shape s, Arr v) { set_grad(c, i, std::move(s), std::move(v)); };
  auto in_shape = [&](size_t i) -> const Shape& { return operand_shape(n, info, i); };
  const int32_t weight = info.hint == NumericHint::param ? static_cast<int32_t>(info.scalar) : -1;
  const int64_t hn = c.model().head_dim();
  if (n.kind == OpKind::qkv_split) {
    // cat of the q (slot 0), k (kept by BaddbmmBackward, see SplitParts) and v (slot 1)
    // grads into the fused layout.
    if (n.grad[0] == kNoStorage && n.grad[1] == kNoStorage) return true;
    NumericContext::SplitParts parts = take_split_parts(c);
    const Shape& base = in_shape(0);  // (B,S,3h)
    const int64_t B = base[0], Sq = base[1], np = base[2] / 3 / hn;
    const int64_t piece = B * np * Sq * hn;
    Arr p[3];
    p[0] = n.grad[0] != kNoStorage ? c.read(n.grad[0], "grad of q").v : Arr(Arr::Zero(piece));
    p[1] = parts.set[1] ? parts.part[1] : Arr(Arr::Zero(piece));
    p[2] = n.grad[1] != kNoStorage ? c.read(n.grad[1], "grad of v").v : Arr(Arr::Zero(piece));
    for (const Arr& a : p)
      if (a.size() != piece) throw NumericError("numeric: SplitWithSizesBackward0: a piece's grad has the wrong size");
    set(0, base, megatron_cat(p, B, np, Sq, hn));
    return true;
  }
  if (n.grad[0] == kNoStorage) return true;
  const NumericBuffer& gb = c.read(n.grad[0], "grad_output");
  const Arr g = gb.v;
  const Shape gs = gb.shape;
  switch (n.kind) {
    case OpKind::megatron_embedding: {  // main_grad[W] += scatter-add of the rows
      const auto& ids = S(0, "indices");
      const auto& w = P(weight, "embedding");
      const int64_t D = w.shape[1];
      Arr gw = Arr::Zero(w.v.size());
      for (Eigen::Index i = 0; i < ids.v.size(); ++i)
        gw.segment(static_cast<int64_t>(ids.v[i]) * D, D) += g.segment(i * D, D);
      c.add_main_grad(weight, gw);
      return true;
    }
    case OpKind::megatron_linear: {  // saved: input
      const auto& x = S(0, "input");
      const auto& w = P(weight, "weight");
      const int64_t dout = w.shape[0], din = w.shape[1], rows = numel(x.shape) / din;
      MapM dY(g.data(), rows, dout);
      if (needs(0)) {
        Mat dX = dY * MapM(w.v.data(), dout, din);
        set(0, x.shape, Eigen::Map<const Arr>(dX.data(), rows * din));
      }
      Mat dW = dY.transpose() * MapM(x.v.data(), rows, din);
      c.add_main_grad(weight, Eigen::Map<const Arr>(dW.data(), dout * din));
      if (info.bias >= 0) c.add_main_grad(info.bias, col_sums(g, dout));
      return true;
    }
    case OpKind::fused_layer_norm: {  // saved: input, mean, invvar
      const auto& x = S(0, "input");
      const auto& mean = S(1, "mean");
      const auto& invvar = S(2, "invvar");
      const auto& w = P(weight, "weight");
      const LayerNormBackward d =
          layer_norm_backward(x.v, x.shape.back(), w.v, mean.v, invvar.v, g);
      if (needs(0)) set(0, x.shape, d.dx);
      c.add_main_grad(weight, d.dw);
      c.add_main_grad(info.bias, d.db);
      return true;
    }
    case OpKind::baddbmm: {  // saved: q, k (the fused output); grad (B,np,S,S)
      const auto& mq = S(0, "query");
      const auto& mk = S(1, "key");
      Shape qs;
      const Arr q = megatron_piece(mq, 0, hn, &qs), kk = megatron_piece(mk, 1, hn, nullptr);
      const int64_t Sq = qs[2], heads = qs[0] * qs[1];
      const double scale = 1.0 / std::sqrt(static_cast<double>(hn));
      Arr gq(q.size()), gk(kk.size());
      for (int64_t i = 0; i < heads; ++i) {
        MapM dS(g.data() + i * Sq * Sq, Sq, Sq);
        Mat a = dS * MapM(kk.data() + i * Sq * hn, Sq, hn) * scale;
        Mat b = dS.transpose() * MapM(q.data() + i * Sq * hn, Sq, hn) * scale;
        gq.segment(i * Sq * hn, Sq * hn) = Eigen::Map<const Arr>(a.data(), Sq * hn);
        gk.segment(i * Sq * hn, Sq * hn) = Eigen::Map<const Arr>(b.data(), Sq * hn);
      }
      set(0, qs, std::move(gq));
      // k's grad travels with q's to the split node (graph/ops/ops_fused.cpp).
      stash_split_part(c, n.next[0].node, 1, gk);
      return true;
    }
    case OpKind::fused_softmax: {  // saved: result; computed in place into the grad
      const auto& y = S(0, "result");
      const int64_t len = y.shape.back(), rows = numel(y.shape) / len;
      Arr r(y.v.size());
      for (int64_t i = 0; i < rows; ++i) {
        const Arr yi = y.v.segment(i * len, len), gi = g.segment(i * len, len);
        r.segment(i * len, len) = yi * (gi - (gi * yi).sum());
      }
      set(0, y.shape, std::move(r));
      return true;
    }
    case OpKind::bias_dropout_add: {  // saved: the mask (dropout active)
      Arr gz = g;
      if (n.saved_count > 0) gz = g * S(0, "mask").v / (1.0 - c.model().dropout);
      if (info.bias >= 0) c.add_main_grad(info.bias, col_sums(gz, gs.back()));
      if (needs(0)) set(0, gs, std::move(gz));
      if (needs(1)) set(1, gs, g);
      return true;
    }
    case OpKind::fused_attention: {  // saved: qkv (3 times), out, lse
      const auto& mixed = S(0, "query");
      S(1, "key");
      S(2, "value");
      const auto& o = S(3, "out");
      const auto& lse = S(4, "softmax_lse");
      Shape qs;
      const Arr q = megatron_piece(mixed, 0, hn, &qs), kk = megatron_piece(mixed, 1, hn, nullptr),
                v = megatron_piece(mixed, 2, hn, nullptr);
      const int64_t B = qs[0], np = qs[1], Sq = qs[2];
      Arr d[3];
      flash_backward(q, kk, v, split_heads(o.v, B, Sq, np, hn), lse.v, split_heads(g, B, Sq, np, hn),
                     B * np, Sq, hn, d[0], d[1], d[2]);
      if (needs(0)) set(0, mixed.shape, megatron_cat(d, B, np, Sq, hn));
      return true;
    }
    case OpKind::dropout:  // saved: the mask
      set(0, gs, g * S(0, "mask").v / (1.0 - c.model().dropout));
      return true;
    case OpKind::bias_gelu: {  // saved: input (the bias is a parameter, alive)
      const auto& x = S(0, "input");
      Arr z = x.v;
      if (info.bias >= 0) {
        const auto& b = P(info.bias, "bias");
        z += expand(b.v, b.shape, x.shape);
      }
      Arr dz = g * gelu_grad(z);
      if (info.bias >= 0) c.add_main_grad(info.bias, col_sums(dz, x.shape.back()));
      if (needs(0)) set(0, x.shape, std::move(dz));
      return true;
    }
    case OpKind::vocab_parallel_ce: {  // saved: fp32 softmax, target_mask, masked_target
      const auto& sm = S(0, "softmax");
      S(1, "target_mask");
      const auto& t = S(2, "masked_target");
      const int64_t V = sm.shape.back(), rows = numel(sm.shape) / V;
      Arr r = sm.v;
      for (int64_t i = 0; i < rows; ++i) {
        r[i * V + static_cast<int64_t>(t.v[i])] -= 1.0;
        r.segment(i * V, V) *= g[i];
      }
      if (needs(0)) set(0, in_shape(0), std::move(r));
      return true;
    }
    default:
      return false;
  }
}

}  // namespace memsim::graph
