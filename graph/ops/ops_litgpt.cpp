#include "graph/ops/ops_litgpt.h"

#include <algorithm>
#include <vector>

#include "graph/ops/op_helpers.h"

namespace memsim::graph {

using detail::out_tensor;
using detail::wants_grad;

namespace {

constexpr uint64_t kChunkRows = 128;  // chunked_cross_entropy's chunk_size default
// chunked_ce_litgpt's Node::size[3] bits: the label copy is saved; the logits were not
// sliced (pretrain.py: no SliceBackward0).
constexpr uint64_t kCeCopies = 1, kCeUnshifted = 2;

// The promoted (fp32) size of x's products with the cache, or 0 when they keep x's dtype.
uint64_t promoted_bytes(const Tensor& x, uint64_t elem, uint64_t cache_elem) {
  return cache_elem > elem ? x.bytes / elem * cache_elem : 0;
}

// chunked_cross_entropy's end, `torch.cat(losses).sum() / torch.maximum(non_masked,
// ones)`, over `rows` targets: the scalars stay alive until the caller lets them go (the
// members die in reverse order when it just returns); denom is what DivBackward0 saves.
struct CeTotal {
  Tensor non_masked, total, denom;
};

CeTotal ce_total_scalars(Runtime& rt, uint64_t rows) {
  CeTotal t;
  {
    Tensor ne = rt.alloc(rows, TensorKind::temporary, OpKind::eq);  // targets != -100
    t.non_masked = rt.alloc(8, TensorKind::temporary, OpKind::reduce_sum);
  }
  {
    Tensor cat = rt.alloc(rows * 4, TensorKind::temporary, OpKind::cat_n);
    t.total = rt.alloc(4, TensorKind::temporary, OpKind::reduce_sum);
  }
  {
    Tensor ones = rt.alloc(8, TensorKind::temporary, OpKind::fill);
    t.denom = rt.alloc(8, TensorKind::temporary, OpKind::other);  // maximum
  }
  return t;
}

}  // namespace

Tensor rope_litgpt(Runtime& rt, const Tensor& x, uint64_t elem, uint64_t cache_elem) {
  const uint64_t X = x.bytes, P = promoted_bytes(x, elem, cache_elem), prod = P ? P : X;
  Tensor rotated;
  {
    Tensor neg = rt.alloc(X / 2, TensorKind::temporary, OpKind::neg);  // -x2
    rotated = rt.alloc(X, TensorKind::temporary, OpKind::cat2);          // cat((-x2, x1))
  }
  Tensor roped;
  {
    Tensor a = rt.alloc(prod, TensorKind::temporary, OpKind::mul);  // x * cos
    Tensor b = rt.alloc(prod, TensorKind::temporary, OpKind::mul);  // rotated * sin
    roped = rt.alloc(prod, TensorKind::temporary, OpKind::add);
  }
  if (P == 0) {  // .to(dtype=x.dtype) returns roped itself
    rotated.reset();
    return roped;
  }
  Tensor out = rt.alloc(X, TensorKind::temporary, OpKind::to_copy);
  rotated.reset();  // apply_rope's locals die as it returns
  roped.reset();
  return out;
}

Tensor rope_litgpt_cat(Runtime& rt, const Tensor& roped, const Tensor& x, const Tensor& cos,
                       const Tensor& sin, uint64_t elem, uint64_t cache_elem) {
  Tensor out = out_tensor(rt, roped.bytes, OpKind::rope_litgpt);
  if (wants_grad(rt, {&x})) {
    const int32_t n = rt.make_node(OpKind::rope_litgpt, {&x});
    Node& node = rt.node(n);
    node.size[0] = x.bytes;
    node.size[1] = promoted_bytes(x, elem, cache_elem);
    rt.save(n, cos);  // x * cos saves cos; rotated * sin saves sin (buffers: no bytes)
    rt.save(n, sin);
    out.grad_fn = n;
  }
  return out;
}

Tensor chunked_ce_litgpt(Runtime& rt, const Tensor& logits, uint64_t batch, uint64_t seq,
                         uint64_t vocab, bool shifted) {
  const uint64_t rows = batch * (shifted ? seq - 1 : seq), row_bytes = vocab * 4;
  // the (B, S-1) slices are not contiguous when B > 1: reshape copies
  const bool copies = shifted && batch > 1;
  Tensor flat = copies ? rt.alloc(rows * row_bytes, TensorKind::temporary, OpKind::clone) : Tensor();
  Tensor targets = copies ? rt.alloc(rows * 8, TensorKind::temporary, OpKind::clone) : Tensor();
  std::vector<Tensor> logp, total_weight, losses;
  for (uint64_t r = 0; r < rows; r += kChunkRows) {
    const uint64_t c = std::min(kChunkRows, rows - r);
    logp.push_back(rt.alloc(c * row_bytes, TensorKind::activation, OpKind::log_softmax));
    losses.push_back(rt.alloc(c * 4, TensorKind::temporary, OpKind::nll_loss));
    total_weight.push_back(rt.alloc(4, TensorKind::temporary, OpKind::nll_loss));
  }
  CeTotal scalars = ce_total_scalars(rt, rows);
  const Tensor& denom = scalars.denom;
  Tensor loss = out_tensor(rt, 4, OpKind::chunked_ce_litgpt);  // the division
  if (wants_grad(rt, {&logits})) {
    const int32_t n = rt.make_node(OpKind::chunked_ce_litgpt, {&logits});
    Node& node = rt.node(n);
    node.size[0] = logits.bytes;
    node.size[1] = row_bytes;
    node.size[2] = rows;
    node.size[3] = (copies ? kCeCopies : 0) | (shifted ? 0 : kCeUnshifted);
    rt.save(n, denom);  // slot 0
    for (size_t i = 0; i < logp.size(); ++i) {  // slots 1 + 2i, 2 + 2i
      rt.save(n, logp[i]);
      rt.save(n, total_weight[i]);
    }
    if (copies) rt.save(n, targets);  // the label chunks are views of the copy
    loss.grad_fn = n;
  }
  // chunked_cross_entropy returns: its locals die (the reshaped logits, the label copy,
  // the chunk lists, non_masked_elems).
  flat.reset();
  targets.reset();
  logp.clear();
  losses.clear();
  total_weight.clear();
  scalars.non_masked.reset();
  scalars.total.reset();
  scalars.denom.reset();
  return loss;
}

Tensor ce_chunk_litgpt(Runtime& rt, const Tensor& chunk, const Tensor& target, uint64_t rows,
                       uint64_t row_bytes) {
  Tensor logp = rt.alloc(rows * row_bytes, TensorKind::activation, OpKind::log_softmax);
  Tensor loss = out_tensor(rt, rows * 4, OpKind::chunked_ce_litgpt);  // nll_loss's output
  Tensor total_weight = rt.alloc(4, TensorKind::temporary, OpKind::nll_loss);
  if (wants_grad(rt, {&chunk})) {
    const int32_t n = rt.make_node(OpKind::chunked_ce_litgpt, {&chunk});
    Node& node = rt.node(n);
    node.flags = kLitCeChunk;
    node.size[0] = chunk.bytes;
    node.size[1] = row_bytes;
    node.size[2] = rows;
    rt.save(n, total_weight);  // slot 0
    rt.save(n, logp);          // slot 1
    if (target.defined()) rt.save(n, target);  // slot 2
    loss.grad_fn = n;
  }
  return loss;
}

Tensor lit_ce_join(Runtime& rt, const Tensor& a, const Tensor& b) {
  Tensor out = rt.view_of(a, a.bytes);
  if (wants_grad(rt, {&a, &b})) {
    const int32_t n = rt.make_node(OpKind::chunked_ce_litgpt, {&a, &b});
    rt.node(n).flags = kLitCeJoin;
    out.grad_fn = n;
    out.out_slot = 0;
  }
  return out;
}

Tensor ce_total_litgpt(Runtime& rt, const Tensor& joined, uint64_t rows) {
  CeTotal scalars = ce_total_scalars(rt, rows);
  const Tensor& denom = scalars.denom;
  Tensor loss = out_tensor(rt, 4, OpKind::chunked_ce_litgpt);  // the division
  if (wants_grad(rt, {&joined})) {
    const int32_t n = rt.make_node(OpKind::chunked_ce_litgpt, {&joined});
    rt.node(n).flags = kLitCeTotal;
    rt.save(n, denom);
    loss.grad_fn = n;
  }
  return loss;
}

// The list branch's nodes (flags kLitCe*; see ops_litgpt.h).
static void run_ce_list_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  auto A = [&](uint64_t bytes) { return rt.alloc_raw(bytes, TensorKind::temporary, n.kind); };
  if (n.flags == kLitCeJoin) {  // CatBackward0: narrowed views of the one grad
    for (int i = 0; i < 2; ++i) {
      if (n.next[i].node < 0) continue;
      rt.retain(in[0].storage);
      out[i] = Grad{in[0].storage, true, false};
    }
    return;
  }
  if (n.next[0].node < 0) return;
  if (n.flags == kLitCeTotal) {
    const uint32_t d = A(4);  // DivBackward0: grad / denominator
    rt.release_saved_slot(n, 0);
    out[0] = Grad{d, true, false};  // SumBackward0's expand: a view from here on
    return;
  }
  // kLitCeChunk: NllLossBackward0, then LogSoftmaxBackward0.
  const uint64_t bytes = n.size[0];
  const uint32_t z = A(bytes);
  if (n.grad[0] != kNoStorage) {  // NllLossBackward0 returns: its input dies first
    rt.release(n.grad[0]);
    n.grad[0] = kNoStorage;
  }
  rt.release_saved_slot(n, 0);
  if (n.saved_count > 2) rt.release_saved_slot(n, 2);
  const uint32_t g = A(bytes);
  rt.release(z);
  rt.release_saved_slot(n, 1);
  out[0] = Grad{g, false, false};
}

bool run_litgpt_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (n.kind != OpKind::rope_litgpt && n.kind != OpKind::chunked_ce_litgpt) return false;
  if (in[0].storage == kNoStorage) return true;
  if (n.kind == OpKind::chunked_ce_litgpt && n.flags != 0) {
    run_ce_list_backward(rt, n, in, out);
    return true;
  }
  if (n.next[0].node < 0) return true;
  auto A = [&](uint64_t bytes) { return rt.alloc_raw(bytes, TensorKind::temporary, n.kind); };
  auto F = [&](uint32_t s) { rt.release(s); };
  if (n.kind == OpKind::rope_litgpt) {
    const uint64_t X = n.size[0], P = n.size[1];
    const uint32_t acc = A(X);  // SliceBackward0 of the empty q[..., n:]
    const uint32_t up = P ? A(P) : kNoStorage;  // ToCopyBackward0 of .to(dtype)
    auto product = [&]() {  // grad * cos|sin, cast back to x's dtype when promoted
      const uint32_t m = A(P ? P : X);
      if (!P) return m;
      const uint32_t cast = A(X);
      F(m);
      return cast;
    };
    const uint32_t rot_grad = product();  // rotated * sin
    const uint32_t x_grad = product();    // x * cos
    if (up != kNoStorage) F(up);
    F(x_grad);  // added into acc in place
    const uint32_t ng = A(X / 2);  // NegBackward0
    const uint32_t s2 = A(X);      // SliceBackward0 (x2)
    F(s2);
    F(ng);
    const uint32_t s1 = A(X);  // SliceBackward0 (x1)
    F(s1);
    F(rot_grad);
    out[0] = Grad{acc, false, false};
    return true;
  }
  // chunked_ce_litgpt
  const uint64_t row_bytes = n.size[1], rows = n.size[2];
  const uint64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  const uint32_t d = A(4);  // DivBackward0: grad / denominator
  rt.release_saved_slot(n, 0);
  std::vector<uint32_t> grads(chunks, kNoStorage);
  for (uint64_t i = chunks; i-- > 0;) {
    const uint64_t c = std::min(kChunkRows, rows - i * kChunkRows);
    // NllLossBackward0: zeros + scatter; then it releases its saved total_weight and
    // target (the label copy: with the first chunk's node, the last to run).
    const uint32_t z = A(c * row_bytes);
    rt.release_saved_slot(n, static_cast<uint32_t>(2 + 2 * i));
    if (i == 0 && (n.size[3] & kCeCopies) != 0)
      rt.release_saved_slot(n, static_cast<uint32_t>(1 + 2 * chunks));
    grads[i] = A(c * row_bytes);  // LogSoftmaxBackward0, which then drops the log-probs
    F(z);
    rt.release_saved_slot(n, static_cast<uint32_t>(1 + 2 * i));
  }
  F(d);
  const uint32_t cat = A(rows * row_bytes);  // SplitBackward0
  for (uint32_t g : grads) F(g);
  if ((n.size[3] & kCeUnshifted) != 0) {  // the grad of logits.reshape(-1, V): a view
    out[0] = Grad{cat, false, false};
    return true;
  }
  const uint32_t full = rt.alloc_raw(n.size[0], TensorKind::temporary, n.kind);  // SliceBackward0
  F(cat);
  out[0] = Grad{full, false, false};
  return true;
}

}  // namespace memsim::graph
