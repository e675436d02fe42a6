#include "graph/autocast.h"

#include <stdexcept>

#include "graph/ops/op_helpers.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

namespace {
// Node flag: a to_copy of a Parameter. Its grad reaches AccumulateGrad in the einsum's
// transposed layout (_to_copy preserves strides), so AccumulateGrad clones it.
constexpr uint8_t kWeightCast = 16;
// add/sub node flags: input 0 / input 1 was a widened low-precision tensor.
constexpr uint8_t kPromoted0 = 32;
constexpr uint8_t kPromoted1 = 64;
}  // namespace

void Autocast::enter(bool inference_mode) {
  active_ = true;
  cache_enabled_ = !inference_mode && cache_flag_;
}

void Autocast::exit() {
  active_ = false;
  for (Tensor& t : cache_) t.reset();  // copies saved for backward stay alive as saved tensors
}

void Autocast::enter_nested(const std::vector<Tensor>* leaves) {
  if (nested_) throw std::logic_error("Autocast::enter_nested: already nested");
  nested_ = true;
  leaves_.clear();
  if (leaves != nullptr)
    for (const Tensor& t : *leaves)
      if (t.requires_grad()) leaves_.push_back(t);  // detach_variable keeps requires_grad
  leaf_casts_.assign(leaves_.size(), Tensor());
  outer_active_ = active_;
  outer_cache_enabled_ = cache_enabled_;
  outer_cache_.swap(cache_);  // the recompute's casts start afresh
  outer_cache_graph_.swap(cache_graph_);
  outer_cache_seq_.swap(cache_seq_);
  active_ = true;
  cache_enabled_ = cache_flag_;  // checkpoint records is_autocast_cache_enabled()
}

void Autocast::leave_nested() {
  if (!nested_) return;
  nested_ = false;
  for (Tensor& t : cache_) t.reset();  // clear_autocast_cache at the outermost exit
  cache_.clear();
  cache_graph_.clear();
  cache_seq_.clear();
  for (Tensor& t : leaf_casts_) t.reset();
  leaf_casts_.clear();
  leaves_.clear();
  cache_.swap(outer_cache_);
  cache_graph_.swap(outer_cache_graph_);
  cache_seq_.swap(outer_cache_seq_);
  active_ = outer_active_;
  cache_enabled_ = outer_cache_enabled_;
}

Tensor Autocast::cast(const Tensor& x, uint64_t out_bytes) {
  // A reentrant recompute's input (a detached leaf requiring grad) cast to the low dtype:
  // cached like a weight (enter_nested). The same handle, not a view of it.
  for (size_t i = 0; cache_enabled_ && i < leaves_.size() && out_bytes < x.bytes; ++i) {
    const Tensor& l = leaves_[i];
    if (l.storage != x.storage || l.bytes != x.bytes || l.grad_fn != x.grad_fn ||
        l.out_slot != x.out_slot)
      continue;
    if (!leaf_casts_[i].defined()) leaf_casts_[i] = new_cast(x, out_bytes);
    return leaf_casts_[i];
  }
  return new_cast(x, out_bytes);
}

Tensor Autocast::new_cast(const Tensor& x, uint64_t out_bytes) {
  Tensor out = rt_.alloc(out_bytes, TensorKind::activation, OpKind::autocast_copy);
  if (detail::wants_grad(rt_, {&x})) {
    const int32_t n = rt_.make_node(OpKind::autocast_copy, {&x});
    rt_.node(n).size[0] = x.bytes;
    out.grad_fn = n;
  }
  return out;
}

Tensor Autocast::weight(int32_t param, bool grad_transposed, const Tensor* source) {
  // cached_cast: only a leaf (not a view) that requires grad is cached; FSDP's parameters
  // are views, and a frozen parameter (PEFT's LoRA base weights, requires_grad=False) is
  // cast anew at every use, its copy living as long as an op saves it (graph/models/lora.h).
  const bool frozen = static_cast<size_t>(param) < rt_.parameters().size() && rt_.parameters()[param].frozen;
  const bool cache = cache_enabled_ && !params_are_views_ && !frozen;
  if (cache && static_cast<size_t>(param) < cache_.size() && cache_[param].defined()) {
    Tensor& c = cache_[param];
    // A region spanning several steps (autocast_region whole-run): the copy was made in
    // an earlier forward whose graph is gone. torch reuses its ToCopyBackward0 node, whose
    // edge still leads to the parameter's AccumulateGrad; memsim records that node again
    // in the current graph (it saves nothing) with the old node's sequence number: the
    // engine runs it after every node of the new graph, so the low-precision weight
    // grads wait in its input buffer until the end of backward (NiuHuangxiaozi's bf16
    // trace: iterations 2 and 3 cast all weight grads to fp32 after the embedding's).
    if (c.grad_fn >= 0 && rt_.grad_enabled && static_cast<size_t>(param) < cache_graph_.size() &&
        cache_graph_[param] != rt_.current_graph()) {
      Tensor w = source != nullptr ? *source : rt_.param(param);
      const int32_t n = rt_.make_node(OpKind::autocast_copy, {&w});
      rt_.node(n).size[0] = w.bytes;
      if (grad_transposed) rt_.node(n).flags |= kWeightCast;
      rt_.node(n).seq = cache_seq_[param];
      c.grad_fn = n;
      cache_graph_[param] = rt_.current_graph();
    }
    return c;
  }
  Tensor w = source != nullptr ? *source : rt_.param(param);
  Tensor c = new_cast(w, w.bytes / 4 * low_);  // autocast casts fp32 parameters only
  rt_.name_as(c.storage, param, fp16_ ? ParamLabel::autocast_f16 : ParamLabel::autocast_bf16);
  if (c.grad_fn >= 0 && grad_transposed) rt_.node(c.grad_fn).flags |= kWeightCast;
  if (cache) {
    if (cache_.size() <= static_cast<size_t>(param)) cache_.resize(param + 1);
    if (cache_graph_.size() <= static_cast<size_t>(param)) {
      cache_graph_.resize(param + 1, 0);
      cache_seq_.resize(param + 1, 0);
    }
    cache_[param] = c;
    cache_graph_[param] = rt_.current_graph();
    cache_seq_[param] = c.grad_fn >= 0 ? rt_.node(c.grad_fn).seq : 0;
  }
  return c;
}

Tensor Autocast::linear(const Tensor& x, int32_t param, int64_t rows, int64_t d_in,
                        int64_t d_out, double flops) {
  const uint64_t low_in = static_cast<uint64_t>(rows * d_in) * low_;
  Tensor xc = x.bytes == low_in ? x : cast(x, low_in);
  Tensor wc = weight(param);
  Tensor out = detail::out_tensor(rt_, static_cast<uint64_t>(rows * d_out) * low_, OpKind::linear);
  rt_.note_gemm();
  const double io = static_cast<double>(xc.bytes + wc.bytes + out.bytes);
  rt_.add_flops_forward(flops, io);
  if (detail::wants_grad(rt_, {&xc, &wc})) {
    const int32_t n = rt_.make_node(OpKind::linear, {&wc, &xc});
    Node& node = rt_.node(n);
    node.size[0] = wc.bytes;
    node.size[1] = xc.bytes;
    node.flops = detail::matmul_backward_flops(xc, wc, flops);
    node.gemm_bytes = detail::matmul_backward_bytes(xc, wc, io);
    // BmmBackward0 releases the W copy before the x copy (LINYUN bf16 trace).
    if (xc.requires_grad()) rt_.save(n, wc);
    if (wc.requires_grad()) rt_.save(n, xc);
    out.grad_fn = n;
  }
  // Uncached (inference_mode): the casts are temporaries of the einsum, x's first.
  xc.reset();
  wc.reset();
  return out;
}

Tensor Autocast::mm_linear(const Tensor& x, int32_t param, int64_t rows, int64_t d_in,
                           int64_t d_out, double flops) {
  const uint64_t low_in = static_cast<uint64_t>(rows * d_in) * low_;
  Tensor wc = weight(param, /*grad_transposed=*/false);
  Tensor xc = x.bytes == low_in ? x : cast(x, low_in);
  Tensor out = graph::mm_linear(rt_, xc, wc, static_cast<uint64_t>(rows * d_out) * low_, flops);
  xc.reset();
  wc.reset();
  return out;
}

Tensor Autocast::addmm(const Tensor& x, int32_t w, int32_t b, int64_t rows, int64_t d_in,
                       int64_t d_out, double flops) {
  const uint64_t low_in = static_cast<uint64_t>(rows * d_in) * low_;
  // Conv1D's W is (in, out): addmm's mat2 grad comes back in W's layout (stolen).
  Tensor wc = weight(w, /*grad_transposed=*/false);
  Tensor xc = x.bytes == low_in ? x : cast(x, low_in);
  Tensor bc = weight(b, /*grad_transposed=*/false);
  Tensor out = graph::addmm_bias(rt_, bc, xc, wc, static_cast<uint64_t>(rows * d_out) * low_, flops);
  xc.reset();
  wc.reset();
  bc.reset();
  return out;
}

Tensor Autocast::linear_bias(const Tensor& x, int32_t w, int32_t b, int64_t rows, int64_t d_in,
                             int64_t d_out, double flops) {
  const uint64_t low_in = static_cast<uint64_t>(rows * d_in) * low_;
  Tensor bc = weight(b, /*grad_transposed=*/false);
  Tensor wc = weight(w, /*grad_transposed=*/false);
  Tensor xc = x.bytes == low_in ? x : cast(x, low_in);
  Tensor out = graph::addmm_bias(rt_, bc, xc, wc, static_cast<uint64_t>(rows * d_out) * low_, flops);
  xc.reset();
  wc.reset();
  bc.reset();
  return out;
}

Tensor Autocast::fp32_softmax(const Tensor& x) {
  const uint64_t f32 = x.bytes / low_ * 4;
  if (!fp16_) {
    Tensor xf = cast(x, f32);  // softmax's own toType: ToCopyBackward0, saves nothing
    return graph::softmax(rt_, xf);
  }
  // _softmax(x, dim, half_to_float=true): fp32 out (saved), backward gives x's dtype.
  Tensor out = detail::out_tensor(rt_, f32, OpKind::softmax);
  if (detail::wants_grad(rt_, {&x})) {
    const int32_t n = rt_.make_node(OpKind::softmax, {&x});
    rt_.node(n).size[0] = x.bytes;
    rt_.node(n).size[2] = f32;
    rt_.save(n, out);
    out.grad_fn = n;
  }
  return out;
}

Tensor Autocast::to_fp32(const Tensor& x, uint64_t fp32_bytes) {
  return x.bytes == fp32_bytes ? x : cast(x, fp32_bytes);
}

Tensor Autocast::widen(const Tensor& x) const { return rt_.view_of(x, x.bytes / low_ * 4); }

void Autocast::promoted(Runtime& rt, const Tensor& out, int slot, const Tensor& low_input) {
  if (out.grad_fn < 0 || !low_input.requires_grad()) return;
  Node& n = rt.node(out.grad_fn);
  n.flags |= slot == 0 ? kPromoted0 : kPromoted1;
  n.size[3] = low_input.bytes;  // add/sub nodes leave size[3] unused
}

void cast_promoted_grad(Runtime& rt, Node& n, Grad& g, int slot) {
  if (!(n.flags & (slot == 0 ? kPromoted0 : kPromoted1)) || g.storage == kNoStorage) return;
  const uint32_t low = rt.alloc_raw(n.size[3], TensorKind::temporary, OpKind::grad_cast);
  rt.release(g.storage);
  g = Grad{low, false, false};
}

bool has_promoted_input(const Node& n) { return (n.flags & (kPromoted0 | kPromoted1)) != 0; }

void cast_promoted_grads(Runtime& rt, Node& n, Grad out[3]) {
  for (int i = 0; i < 2; ++i) cast_promoted_grad(rt, n, out[i], i);
}

Tensor rope_cs336_autocast(Runtime& rt, const Tensor& x, const Tensor& freq_buffer) {
  // As rope_cs336, but each product of a low-precision half with fp32 cos/sin is an
  // fp32 half: x.bytes. CPython drops a binary op's left operand, then its right one.
  const uint64_t h = x.bytes;
  Tensor t1 = rt.alloc(h, TensorKind::temporary, OpKind::mul);
  Tensor t2 = rt.alloc(h, TensorKind::temporary, OpKind::mul);
  Tensor x1r = rt.alloc(h, TensorKind::temporary, OpKind::sub);
  t1.reset();
  t2.reset();
  Tensor t3 = rt.alloc(h, TensorKind::temporary, OpKind::mul);
  Tensor t4 = rt.alloc(h, TensorKind::temporary, OpKind::mul);
  Tensor x2r = rt.alloc(h, TensorKind::temporary, OpKind::add);
  t3.reset();
  t4.reset();
  Tensor out = detail::out_tensor(rt, 2 * x.bytes, OpKind::rope);
  if (detail::wants_grad(rt, {&x})) {
    const int32_t n = rt.make_node(OpKind::rope_autocast, {&x});
    rt.node(n).size[0] = x.bytes;
    for (int i = 0; i < 4; ++i) rt.save(n, freq_buffer);
    out.grad_fn = n;
  }
  x1r.reset();
  x2r.reset();
  return out;
}

Tensor rope_hf_autocast(Runtime& rt, const Tensor& x, const Tensor& cos, const Tensor& sin) {
  // CPython frees each temporary once the op that consumes it returns (CPU fixture
  // llama_..._autocast_bf16: mul 2X, neg X/2, cat X, mul 2X, add 2X).
  const uint64_t X = x.bytes;
  Tensor a = rt.alloc(2 * X, TensorKind::temporary, OpKind::mul);  // x * cos: fp32
  Tensor neg = rt.alloc(X / 2, TensorKind::temporary, OpKind::neg);
  Tensor cat = rt.alloc(X, TensorKind::temporary, OpKind::rope_hf_autocast);
  neg.reset();
  Tensor b = rt.alloc(2 * X, TensorKind::temporary, OpKind::mul);  // rotate_half(x) * sin
  cat.reset();
  Tensor out = detail::out_tensor(rt, 2 * X, OpKind::rope_hf_autocast);  // a + b
  if (detail::wants_grad(rt, {&x})) {
    const int32_t n = rt.make_node(OpKind::rope_hf_autocast, {&x});
    rt.node(n).size[0] = X;
    rt.save(n, cos);
    rt.save(n, sin);
    out.grad_fn = n;
  }
  a.reset();
  b.reset();
  return out;
}

Tensor cs336_cross_entropy_autocast(Autocast& ac, Runtime& rt, const Tensor& logits,
                                    const Tensor& targets, uint64_t rows) {
  const Module outer = rt.ctx.module;
  rt.ctx.module = Module::loss;
  const uint64_t low = ac.low_elem();
  MaxResult mx = max_dim(rt, logits, rows, low);  // bf16 values
  mx.indices.reset();
  Tensor shifted = sub(rt, logits, mx.values);    // bf16
  Tensor e;
  {
    Tensor ef = ac.to_fp32(shifted, shifted.bytes / low * 4);  // exp is on the fp32 list
    e = exp(rt, ef);
  }
  Tensor z = sum_dim(rt, e, rows * 4);
  Tensor lz = log(rt, z);
  Tensor lsm = sub(rt, ac.widen(shifted), lz);  // bf16 - fp32 promotes to fp32
  Autocast::promoted(rt, lsm, 0, shifted);
  lz.reset();
  z.reset();
  e.reset();
  shifted.reset();
  mx.values.reset();
  Tensor nl = neg(rt, lsm);
  lsm.reset();
  Tensor picked = gather(rt, nl, targets, rows * 4);
  nl.reset();
  Tensor loss = mean_all(rt, picked, 4);
  picked.reset();
  rt.ctx.module = outer;
  return loss;
}

Tensor torch_cross_entropy_autocast(Autocast& ac, Runtime& rt, const Tensor& logits,
                                    const Tensor& targets) {
  const Module outer = rt.ctx.module;
  rt.ctx.module = Module::loss;
  // CUDA autocast (H100 trace, torch 2.11): cross_entropy_loss calls log_softmax with the
  // input's own dtype, so it runs in low precision (its result saved); nll_loss is on the
  // fp32 list and saves its fp32 copy of the log-probabilities.
  Tensor logp = log_softmax(rt, logits);
  Tensor lf = ac.to_fp32(logp, logp.bytes / ac.low_elem() * 4);
  Tensor loss = nll_loss(rt, lf, targets, 4);
  lf.reset();
  logp.reset();
  rt.ctx.module = outer;
  return loss;
}

bool run_autocast_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (op_library(n.kind) != OpLibrary::autocast) return false;
  const Grad& g = in[0];
  if (g.storage == kNoStorage) return true;
  auto A = [&](uint64_t bytes) { return rt.alloc_raw(bytes, TensorKind::temporary, n.kind); };
  auto F = [&](uint32_t s) { rt.release(s); };
  switch (n.kind) {
    case OpKind::autocast_copy: {  // grad.to(self's dtype), strides preserved
      // A weight's fp32 grad in its own layout is stolen by AccumulateGrad: a gradient
      // from birth (a transposed one is cloned, so this copy stays a temporary).
      const bool stolen = !(n.flags & kWeightCast) && n.next[0].node >= 0 &&
                          rt.node(n.next[0].node).kind == OpKind::accumulate_grad;
      out[0] = Grad{rt.alloc_raw(n.size[0], stolen ? TensorKind::gradient : TensorKind::temporary,
                                 n.kind),
                    false, (n.flags & kWeightCast) != 0};
      break;
    }
    case OpKind::rope_autocast: {
      // The four muls' grads are fp32 halves (x.bytes), each cast to the input's dtype by
      // validate_outputs (x.bytes/2); the sub's -grad; two casts add into earlier
      // buffers in place; unbind's stack and the einops reshape copy (LINYUN trace).
      const uint64_t h = n.size[0];
      uint32_t m = A(h);
      uint32_t c1 = A(h / 2);
      F(m);
      m = A(h);
      uint32_t c2 = A(h / 2);
      F(m);
      uint32_t ng = A(h);
      m = A(h);
      uint32_t c3 = A(h / 2);
      F(m);
      F(ng);
      F(c3);
      m = A(h);
      uint32_t c4 = A(h / 2);
      F(m);
      n.grad[0] = kNoStorage;  // the cat grad dies with the last mul node
      F(g.storage);
      rt.release_saved(n);
      F(c4);
      uint32_t s = A(h);  // stack
      F(c1);
      F(c2);
      uint32_t c = A(h);  // reshape copy
      F(s);
      out[0] = Grad{c, false, false};
      break;
    }
    case OpKind::rope_hf_autocast: {
      // The autograd nodes of (x * cos) + (rotate_half(x) * sin) with low-precision x and
      // fp32 cos/sin, latest first (H100 trace, torch 2.11): grad*sin (fp32), cast to x's
      // dtype (validate_outputs); neg of the x2 half; slice_backward of x2 (zeros + copy)
      // and of x1, added into x2's in place; grad*cos (fp32) and its cast, the incoming
      // grad released, the cast added in place too.
      const uint64_t X = n.size[0];
      uint32_t m1 = A(2 * X);
      uint32_t c1 = A(X);
      F(m1);
      rt.release_saved_slot(n, 1);  // sin, once its MulBackward0 has run
      uint32_t ng = A(X / 2);
      uint32_t s2 = A(X);
      F(ng);
      uint32_t s1 = A(X);
      F(c1);
      F(s1);
      uint32_t m2 = A(2 * X);
      uint32_t c2 = A(X);
      F(m2);
      rt.release_saved_slot(n, 0);  // cos
      n.grad[0] = kNoStorage;
      F(g.storage);
      F(c2);
      out[0] = Grad{s2, false, false};
      break;
    }
    default:
      return false;
  }
  return true;
}

}  // namespace memsim::graph
