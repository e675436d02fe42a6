// Shape helpers and shared math of the numeric kernels (graph/numeric/numeric_ops.cpp,
// graph/numeric/numeric_ops_nn.cpp, graph/numeric/numeric_ops_fused.cpp). Internal to graph/. Values are row-major in the logical
// shape of their storage (graph/numeric/numeric.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "graph/numeric/numeric.h"

namespace memsim::graph::numeric_detail {

using Shape = std::vector<int64_t>;
using Arr = Eigen::ArrayXd;
using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapM = Eigen::Map<const Mat>;

inline int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// A backward kernel's inputs, checked: saved slot `k` of node `n` (read through the
// context, so a freed buffer is a recorded violation), and the shape of the forward's
// operand `i` (known once its forward kernel ran).
inline const NumericBuffer& saved_slot(NumericContext& c, const Node& n, const uint32_t* saved,
                                       uint32_t k, const char* what) {
  if (k >= n.saved_count)
    throw NumericError("numeric: " + std::string(backward_name(n.kind)) + " has no saved slot " +
                       std::to_string(k));
  return c.read(saved[k], what);
}
inline const Shape& operand_shape(const Node& n, const NumericContext::NodeInfo& info, size_t i) {
  if (i >= info.in_shapes.size())
    throw NumericError("numeric: " + std::string(backward_name(n.kind)) +
                       ": the forward's operand shapes are unknown (no forward kernel ran)");
  return info.in_shapes[i];
}

// y = x W^T for x (rows, din) and W (dout, din): the weight's grad dY^T x and the input's
// grad dY W, from the incoming grad dY (rows, dout).
inline Arr linear_weight_grad(const Arr& dY, const Arr& x, int64_t rows, int64_t din,
                              int64_t dout) {
  const Mat dW = MapM(dY.data(), rows, dout).transpose() * MapM(x.data(), rows, din);
  return Eigen::Map<const Arr>(dW.data(), dout * din);
}
inline Arr linear_input_grad(const Arr& dY, const Arr& w, int64_t rows, int64_t din,
                             int64_t dout) {
  const Mat dX = MapM(dY.data(), rows, dout) * MapM(w.data(), dout, din);
  return Eigen::Map<const Arr>(dX.data(), rows * din);
}

// LayerNorm over the last dimension D of `x` (rows of D values): y = (x - mean) * rstd *
// w + b, with each row's mean and rstd = 1 / sqrt(var + eps) kept for backward (torch's
// native_layer_norm and Megatron's fused LayerNorm compute the same).
struct LayerNormForward {
  Arr y, mean, rstd;
};
inline LayerNormForward layer_norm_forward(const Arr& x, int64_t D, const Arr& w, const Arr& b,
                                           double eps) {
  const int64_t rows = x.size() / D;
  LayerNormForward f{Arr(x.size()), Arr(rows), Arr(rows)};
  for (int64_t i = 0; i < rows; ++i) {
    const Arr row = x.segment(i * D, D);
    f.mean[i] = row.mean();
    f.rstd[i] = 1.0 / std::sqrt((row - f.mean[i]).square().mean() + eps);
    f.y.segment(i * D, D) = (row - f.mean[i]) * f.rstd[i] * w + b;
  }
  return f;
}

// LayerNorm's backward from the saved input, mean and rstd and the incoming grad `g`.
struct LayerNormBackward {
  Arr dx, dw, db;
};
inline LayerNormBackward layer_norm_backward(const Arr& x, int64_t D, const Arr& w,
                                             const Arr& mean, const Arr& rstd, const Arr& g) {
  const int64_t rows = x.size() / D;
  LayerNormBackward b{Arr(x.size()), Arr::Zero(D), Arr::Zero(D)};
  for (int64_t i = 0; i < rows; ++i) {
    const Arr xh = (x.segment(i * D, D) - mean[i]) * rstd[i];
    const Arr dy = g.segment(i * D, D);
    const Arr dxh = dy * w;
    b.dx.segment(i * D, D) = rstd[i] * (dxh - dxh.mean() - xh * (dxh * xh).mean());
    b.dw += dy * xh;
    b.db += dy;
  }
  return b;
}

// Numpy broadcasting: the output shape of two operands.
inline Shape broadcast_shape(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) throw NumericError("numeric: shapes do not broadcast");
    out[i] = std::max(da, db);
  }
  return out;
}

// For each element of `out`, the flat index of the element of `in` it reads.
inline std::vector<int64_t> broadcast_map(const Shape& out, const Shape& in) {
  const size_t n = out.size();
  std::vector<int64_t> stride(n, 0);
  int64_t s = 1;
  for (size_t i = in.size(); i-- > 0;) {
    const size_t o = i + (n - in.size());
    stride[o] = in[i] == 1 ? 0 : s;
    s *= in[i];
  }
  std::vector<int64_t> map(static_cast<size_t>(numel(out)));
  std::vector<int64_t> idx(n, 0);
  for (size_t j = 0; j < map.size(); ++j) {
    int64_t f = 0;
    for (size_t d = 0; d < n; ++d) f += idx[d] * stride[d];
    map[j] = f;
    for (size_t d = n; d-- > 0;) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
  return map;
}

inline Arr expand(const Arr& v, const Shape& from, const Shape& to) {
  const std::vector<int64_t> m = broadcast_map(to, from);
  Arr r(static_cast<Eigen::Index>(m.size()));
  for (size_t j = 0; j < m.size(); ++j) r[j] = v[m[j]];
  return r;
}

// sum_to: reduce a grad of shape `from` to a broadcast operand's shape `to`.
inline Arr sum_to(const Arr& g, const Shape& from, const Shape& to) {
  if (from == to) return g;
  const std::vector<int64_t> m = broadcast_map(from, to);
  Arr r = Arr::Zero(numel(to));
  for (size_t j = 0; j < m.size(); ++j) r[m[j]] += g[static_cast<Eigen::Index>(j)];
  return r;
}

// (B,S,H,h) <-> (B,H,S,h) with D = H*h as the last dim of the merged layout.
inline Arr split_heads(const Arr& x, int64_t B, int64_t S, int64_t H, int64_t h) {
  Arr r(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t hh = 0; hh < H; ++hh)
        for (int64_t d = 0; d < h; ++d)
          r[((b * H + hh) * S + s) * h + d] = x[((b * S + s) * H + hh) * h + d];
  return r;
}
inline Arr merge_heads(const Arr& x, int64_t B, int64_t S, int64_t H, int64_t h) {
  Arr r(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t hh = 0; hh < H; ++hh)
        for (int64_t d = 0; d < h; ++d)
          r[((b * S + s) * H + hh) * h + d] = x[((b * H + hh) * S + s) * h + d];
  return r;
}

inline Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}


// A causal mask (Sq,Sk), or a larger (P,P) buffer of which the top-left (Sq,Sk) is used
// (GPT-2's bias[:, :, k-q:k, :k] with no past), broadcast to `to` (...,Sq,Sk).
inline Arr expand_mask(const NumericBuffer& mask, const Shape& to) {
  const size_t n = to.size();
  const int64_t Sq = to[n - 2], Sk = to[n - 1];
  if (mask.shape.size() == 2 && (mask.shape[0] != Sq || mask.shape[1] != Sk)) {
    const int64_t cols = mask.shape[1];
    Arr top(Sq * Sk);
    for (int64_t i = 0; i < Sq; ++i) top.segment(i * Sk, Sk) = mask.v.segment(i * cols, Sk);
    return expand(top, {Sq, Sk}, to);
  }
  return expand(mask.v, mask.shape, to);
}

// The first `cols` columns of a 2-D (rows, T) buffer (LLaMA's mask[:, :, :, :S]).
inline Arr mask_columns(const NumericBuffer& m, int64_t cols) {
  const int64_t rows = m.shape[0], T = m.shape[1];
  Arr r(rows * cols);
  for (int64_t i = 0; i < rows; ++i) r.segment(i * cols, cols) = m.v.segment(i * T, cols);
  return r;
}

// megatron: piece p (0 q, 1 k, 2 v) of the fused QKV output (B,S,3h), whose last dim is
// laid out (np, 3, hn) (mixed.view(s, b, np, 3 hn).split(hn)): (B,np,S,hn).
inline Arr megatron_piece(const NumericBuffer& mixed, int p, int64_t hn, Shape* shape) {
  const int64_t B = mixed.shape[0], S = mixed.shape[1], h3 = mixed.shape[2], np = h3 / 3 / hn;
  Arr r(B * np * S * hn);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < np; ++j)
      for (int64_t s = 0; s < S; ++s)
        r.segment(((b * np + j) * S + s) * hn, hn) =
            mixed.v.segment((b * S + s) * h3 + (j * 3 + p) * hn, hn);
  if (shape != nullptr) *shape = {B, np, S, hn};
  return r;
}

// Causal scaled-dot-product attention over `heads` independent (S, hd) blocks laid out
// contiguously (q, k, v: heads*S*hd): o (heads,S,hd) and the log-sum-exp of each scaled
// score row, lse (heads,S). The flash / mem-efficient / TE kernels' math.
inline void flash_forward(const Arr& q, const Arr& k, const Arr& v, int64_t heads, int64_t S,
                          int64_t hd, Arr& o, Arr& lse) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  o.resize(heads * S * hd);
  lse.resize(heads * S);
  for (int64_t x = 0; x < heads; ++x) {
    const int64_t off = x * S * hd;
    Mat p = MapM(q.data() + off, S, hd) * MapM(k.data() + off, S, hd).transpose() * scale;
    for (int64_t i = 0; i < S; ++i) {
      const double mx = p.row(i).head(i + 1).maxCoeff();
      const double l = mx + std::log((p.row(i).head(i + 1).array() - mx).exp().sum());
      lse[x * S + i] = l;
      for (int64_t j = 0; j < S; ++j) p(i, j) = j <= i ? std::exp(p(i, j) - l) : 0.0;
    }
    const Mat oh = p * MapM(v.data() + off, S, hd);
    o.segment(off, S * hd) = Eigen::Map<const Arr>(oh.data(), S * hd);
  }
}

// Its backward from the saved output and log-sum-exp (P recomputed as exp(s - lse), as
// the kernels do): dq, dk, dv (heads,S,hd) from dO (heads,S,hd).
inline void flash_backward(const Arr& q, const Arr& k, const Arr& v, const Arr& o, const Arr& lse,
                           const Arr& dO, int64_t heads, int64_t S, int64_t hd, Arr& dq, Arr& dk,
                           Arr& dv) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  dq.resize(heads * S * hd);
  dk.resize(heads * S * hd);
  dv.resize(heads * S * hd);
  for (int64_t x = 0; x < heads; ++x) {
    const int64_t off = x * S * hd;
    Mat P = MapM(q.data() + off, S, hd) * MapM(k.data() + off, S, hd).transpose() * scale;
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < S; ++j) P(i, j) = j <= i ? std::exp(P(i, j) - lse[x * S + i]) : 0.0;
    MapM dOx(dO.data() + off, S, hd), Ox(o.data() + off, S, hd);
    const Mat dV = P.transpose() * dOx;
    const Mat dP = dOx * MapM(v.data() + off, S, hd).transpose();
    const Eigen::VectorXd Di = (dOx.array() * Ox.array()).rowwise().sum();
    const Mat dS = (P.array() * (dP.colwise() - Di).array()).matrix() * scale;
    const Mat dQ = dS * MapM(k.data() + off, S, hd);
    const Mat dK = dS.transpose() * MapM(q.data() + off, S, hd);
    dq.segment(off, S * hd) = Eigen::Map<const Arr>(dQ.data(), S * hd);
    dk.segment(off, S * hd) = Eigen::Map<const Arr>(dK.data(), S * hd);
    dv.segment(off, S * hd) = Eigen::Map<const Arr>(dV.data(), S * hd);
  }
}

}  // namespace memsim::graph::numeric_detail
