// Shape helpers shared by the numeric kernels (graph/numeric_ops.cpp,
// graph/numeric_ops_nn.cpp). Internal to graph/. Values are row-major in the logical
// shape of their storage (graph/numeric.h).
#pragma once

#include <algorithm>
#include <vector>

#include "graph/numeric.h"

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

}  // namespace memsim::graph::numeric_detail
