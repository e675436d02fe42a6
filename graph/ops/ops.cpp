#include "graph/ops/ops.h"
#include "graph/ops/op_helpers.h"

#include <algorithm>

#include "graph/autocast.h"
#include "graph/ops/ops_fused.h"
#include "graph/ops/ops_liger.h"
#include "graph/ops/ops_litgpt.h"
#include "graph/ops/ops_float8.h"
#include "graph/ops/ops_lora.h"
#include "graph/ops/ops_moe.h"
#include "graph/ops/ops_sdpa_cudnn.h"
#include "graph/ops/ops_nn.h"
#include "graph/ops/ops_ring.h"

namespace memsim::graph {

const char* to_string(Module m) {
  switch (m) {
    case Module::none: return "none";
    case Module::embedding: return "embedding";
    case Module::attention: return "attention";
    case Module::mlp: return "mlp";
    case Module::norm: return "norm";
    case Module::head: return "head";
    case Module::loss: return "loss";
    case Module::optimizer: return "optimizer";
  }
  return "none";
}

namespace {
#define MEMSIM_OP_FWD(kind, library, fwd, bwd) fwd,
#define MEMSIM_OP_BWD(kind, library, fwd, bwd) bwd,
#define MEMSIM_OP_LIB(kind, library, fwd, bwd) OpLibrary::library,
constexpr const char* kForwardName[] = {MEMSIM_OP_TABLE(MEMSIM_OP_FWD)};
constexpr const char* kBackwardName[] = {MEMSIM_OP_TABLE(MEMSIM_OP_BWD)};
constexpr OpLibrary kLibrary[] = {MEMSIM_OP_TABLE(MEMSIM_OP_LIB)};
#undef MEMSIM_OP_FWD
#undef MEMSIM_OP_BWD
#undef MEMSIM_OP_LIB
}  // namespace

const char* forward_name(OpKind k) { return kForwardName[static_cast<int>(k)]; }
const char* backward_name(OpKind k) { return kBackwardName[static_cast<int>(k)]; }
OpLibrary op_library(OpKind k) { return kLibrary[static_cast<int>(k)]; }

namespace {

using detail::out_tensor;
using detail::wants_grad;

// Unary op: out of x's size; `save` = 0 nothing, 1 self, 2 result.
Tensor unary(Runtime& rt, const Tensor& x, OpKind k, int save, uint64_t out_bytes = 0) {
  Tensor out = out_tensor(rt, out_bytes ? out_bytes : x.bytes, k);
  detail::numeric_forward(rt, k, {&x}, {&out});
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(k, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).size[2] = out.bytes;
    if (save == 1) rt.save(n, x);
    if (save == 2) rt.save(n, out);
    out.grad_fn = n;
  }
  return out;
}

// Binary elementwise op with numpy broadcasting of the smaller operand.
int32_t binary_node(Runtime& rt, OpKind k, const Tensor& a, const Tensor& b, Tensor& out) {
  int32_t n = rt.make_node(k, {&a, &b});
  Node& node = rt.node(n);
  node.size[0] = a.bytes;
  node.size[1] = b.bytes;
  node.size[2] = out.bytes;
  if (a.bytes < out.bytes) node.flags |= kBroadcastA;
  if (b.bytes < out.bytes) node.flags |= kBroadcastB;
  out.grad_fn = n;
  return n;
}

}  // namespace

Tensor new_tensor(Runtime& rt, uint64_t bytes, OpKind op, TensorKind kind) {
  Tensor t = rt.alloc(bytes, kind, op);
  detail::numeric_forward(rt, op, {}, {&t});  // arange, mask, gathered cos/sin
  return t;
}

Tensor pow2(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::pow2, 1); }
Tensor mean_dim(Runtime& rt, const Tensor& x, uint64_t out_bytes) {
  return unary(rt, x, OpKind::mean_dim, 0, out_bytes);
}
Tensor mean_all(Runtime& rt, const Tensor& x, uint64_t out_bytes) {
  return unary(rt, x, OpKind::mean_all, 0, out_bytes);
}
Tensor add_scalar(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::add_scalar, 0); }
Tensor div_scalar(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::div_scalar, 0); }
Tensor rsqrt(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::rsqrt, 2); }
Tensor sigmoid(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::sigmoid, 2); }
Tensor exp(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::exp, 2); }
Tensor log(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::log, 1); }
Tensor neg(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::neg, 0); }
Tensor sum_dim(Runtime& rt, const Tensor& x, uint64_t out_bytes) {
  return unary(rt, x, OpKind::sum_dim, 0, out_bytes);
}
Tensor clone(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::clone, 0); }

Tensor add(Runtime& rt, const Tensor& a, const Tensor& b) {
  Tensor out = out_tensor(rt, std::max(a.bytes, b.bytes), OpKind::add);
  detail::numeric_forward(rt, OpKind::add, {&a, &b}, {&out});
  if (wants_grad(rt, {&a, &b})) binary_node(rt, OpKind::add, a, b, out);
  return out;
}

Tensor add_(Runtime& rt, const Tensor& a, const Tensor& b) {
  Tensor out = rt.view_of(a, a.bytes);
  if (wants_grad(rt, {&a, &b})) binary_node(rt, OpKind::add, a, b, out);
  return out;
}

Tensor sub(Runtime& rt, const Tensor& a, const Tensor& b) {
  Tensor out = out_tensor(rt, std::max(a.bytes, b.bytes), OpKind::sub);
  detail::numeric_forward(rt, OpKind::sub, {&a, &b}, {&out});
  if (wants_grad(rt, {&a, &b})) binary_node(rt, OpKind::sub, a, b, out);
  return out;
}

Tensor mul(Runtime& rt, const Tensor& a, const Tensor& b, Broadcast bc, uint64_t elem) {
  Tensor out = out_tensor(rt, std::max(a.bytes, b.bytes), OpKind::mul);
  detail::numeric_forward(rt, OpKind::mul, {&a, &b}, {&out});
  if (wants_grad(rt, {&a, &b})) {
    int32_t n = binary_node(rt, OpKind::mul, a, b, out);
    if (bc == Broadcast::leading_dims) {
      rt.node(n).flags |= kOuterBroadcast;
      rt.node(n).size[3] = elem;
    }
    // derivatives.yaml: self's grad needs other, other's grad needs self.
    detail::save_cross(rt, n, a, b);
  }
  return out;
}

Tensor div(Runtime& rt, const Tensor& a, const Tensor& b) {
  Tensor out = out_tensor(rt, std::max(a.bytes, b.bytes), OpKind::div);
  detail::numeric_forward(rt, OpKind::div, {&a, &b}, {&out});
  if (wants_grad(rt, {&a, &b})) {
    int32_t n = binary_node(rt, OpKind::div, a, b, out);
    rt.save(n, b);                        // other: needed by both grads
    if (b.requires_grad()) rt.save(n, a); // self: only for other's grad
  }
  return out;
}

MaxResult max_dim(Runtime& rt, const Tensor& x, uint64_t rows, uint64_t elem) {
  MaxResult r;
  r.values = out_tensor(rt, rows * elem, OpKind::max_dim);
  r.indices = out_tensor(rt, rows * 8, OpKind::max_dim);
  detail::numeric_forward(rt, OpKind::max_dim, {&x}, {&r.values, &r.indices});
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::max_dim, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.save(n, r.indices);
    r.values.grad_fn = n;
  }
  return r;
}

Tensor where_scalar(Runtime& rt, const Tensor& mask, const Tensor& x, uint64_t elem) {
  // The python scalar becomes a 0-d device tensor (a 512-B block), freed after the op.
  Tensor scalar = rt.alloc(elem, TensorKind::temporary, OpKind::scalar_tensor);
  Tensor out = out_tensor(rt, x.bytes, OpKind::where_scalar);
  detail::numeric_forward(rt, OpKind::where_scalar, {&mask, &x}, {&out});
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::where_scalar, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).size[3] = elem;
    rt.save(n, mask);
    out.grad_fn = n;
  }
  scalar.reset();
  return out;
}

Tensor gather(Runtime& rt, const Tensor& self, const Tensor& index, uint64_t out_bytes) {
  Tensor out = out_tensor(rt, out_bytes, OpKind::gather);
  detail::numeric_forward(rt, OpKind::gather, {&self, &index}, {&out});
  if (wants_grad(rt, {&self})) {
    int32_t n = rt.make_node(OpKind::gather, {&self});
    rt.node(n).size[0] = self.bytes;
    rt.save(n, self);  // GatherBackward0 keeps the whole input alive (§6)
    rt.save(n, index);
    out.grad_fn = n;
  }
  return out;
}

Tensor view(Runtime& rt, const Tensor& x, bool copy_in_backward) {
  Tensor out = rt.view_of(x, x.bytes);
  detail::numeric_forward(rt, OpKind::view, {&x}, {&out});
  if (copy_in_backward && wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::view, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).flags |= kCopyInBackward;
    out.grad_fn = n;
    out.out_slot = 0;  // the view's own node (x may be a piece of a multi-output node)
  }
  return out;
}

Tensor bmm(Runtime& rt, const Tensor& a, const Tensor& b, uint64_t out_bytes, double flops) {
  Tensor out = out_tensor(rt, out_bytes, OpKind::bmm);
  detail::numeric_forward(rt, OpKind::bmm, {&a, &b}, {&out});
  rt.note_gemm();
  const double io = static_cast<double>(a.bytes + b.bytes + out_bytes);
  rt.add_flops_forward(flops, io);
  if (wants_grad(rt, {&a, &b})) {
    int32_t n = rt.make_node(OpKind::bmm, {&a, &b});
    Node& node = rt.node(n);
    node.size[0] = a.bytes;
    node.size[1] = b.bytes;
    node.flops = detail::matmul_backward_flops(a, b, flops);
    node.gemm_bytes = detail::matmul_backward_bytes(a, b, io);
    detail::save_cross(rt, n, a, b);
    out.grad_fn = n;
  }
  return out;
}

Tensor linear_einsum(Runtime& rt, const Tensor& x, const Tensor& w, uint64_t out_bytes,
                     double flops) {
  Tensor out = out_tensor(rt, out_bytes, OpKind::linear);
  detail::numeric_forward(rt, OpKind::linear, {&x, &w}, {&out});
  rt.note_gemm();
  const double io = static_cast<double>(x.bytes + w.bytes + out_bytes);
  rt.add_flops_forward(flops, io);
  if (wants_grad(rt, {&x, &w})) {
    // Edges in the order the engine reaches them: the weight path's view nodes were
    // created after the input path's, so the weight grad reaches AccumulateGrad first.
    int32_t n = rt.make_node(OpKind::linear, {&w, &x});
    Node& node = rt.node(n);
    node.size[0] = w.bytes;
    node.size[1] = x.bytes;
    node.flops = detail::matmul_backward_flops(x, w, flops);
    node.gemm_bytes = detail::matmul_backward_bytes(x, w, io);
    detail::save_cross(rt, n, w, x);
    out.grad_fn = n;
  }
  return out;
}

Tensor embedding(Runtime& rt, const Tensor& weight, const Tensor& ids, uint64_t out_bytes) {
  Tensor out = out_tensor(rt, out_bytes, OpKind::embedding);
  detail::numeric_forward(rt, OpKind::embedding, {&weight, &ids}, {&out});
  if (wants_grad(rt, {&weight})) {
    int32_t n = rt.make_node(OpKind::embedding, {&weight});
    rt.node(n).size[0] = weight.bytes;
    rt.node(n).size[1] = ids.bytes;
    rt.save(n, ids);
    out.grad_fn = n;
  }
  return out;
}

Tensor log_softmax(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::log_softmax, 2); }

Tensor nll_loss(Runtime& rt, const Tensor& logp, const Tensor& target, uint64_t elem) {
  Tensor out = out_tensor(rt, elem, OpKind::nll_loss);
  Tensor total_weight = rt.alloc(elem, TensorKind::temporary, OpKind::nll_loss);
  detail::numeric_forward(rt, OpKind::nll_loss, {&logp, &target}, {&out, &total_weight});
  if (wants_grad(rt, {&logp})) {
    int32_t n = rt.make_node(OpKind::nll_loss, {&logp});
    rt.node(n).size[0] = logp.bytes;
    rt.save(n, logp);
    rt.save(n, target);
    rt.save(n, total_weight);
    out.grad_fn = n;
  }
  return out;
}

Tensor rope_cs336(Runtime& rt, const Tensor& x, const Tensor& freq_buffer) {
  // x1_rot = cos*x1 - sin*x2 ; x2_rot = sin*x1 + cos*x2 ; cat(x1_rot, x2_rot).
  // CPython drops a binary op's left operand, then its right one.
  const uint64_t h = x.bytes / 2;
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
  Tensor out = out_tensor(rt, x.bytes, OpKind::rope);
  detail::numeric_forward(rt, OpKind::rope, {&x, &freq_buffer}, {&out});
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::rope, {&x});
    rt.node(n).size[0] = x.bytes;
    // The four muls each save a cos or sin view of the (non-grad) buffer.
    for (int i = 0; i < 4; ++i) rt.save(n, freq_buffer);
    out.grad_fn = n;
  }
  x1r.reset();
  x2r.reset();
  return out;
}

// ------------------------------------------------------------------------ backward
namespace {

struct Bw {
  Runtime& rt;
  Node& n;
  uint32_t A(uint64_t bytes, TensorKind kind = TensorKind::temporary) {
    return rt.alloc_raw(bytes, kind, n.kind);
  }
  void F(uint32_t s) { rt.release(s); }
  bool needs(int i) const { return n.next[i].node >= 0; }
  // A grad that AccumulateGrad will steal (the parameter has no .grad yet) is a
  // parameter gradient from birth; one added into an existing .grad is a temporary.
  TensorKind kind_for(int i) const {
    if (!needs(i)) return TensorKind::temporary;
    const Node* to = &rt.node(n.next[i].node);
    // Through a pass-through view of a parameter (ops_moe.h view_with_node: PEFT's
    // lora_A.reshape, graph/models/moe_param_lora.cpp): its ViewBackward0 hands the grad on
    // as it came, so AccumulateGrad steals this one.
    if (to->kind == OpKind::view && (to->flags & kCopyInBackward) == 0 && to->n_next == 1 && to->next[0].node >= 0 &&
        rt.node(to->next[0].node).kind == OpKind::accumulate_grad)
      to = &rt.node(to->next[0].node);
    const Node& target = *to;
    if (target.kind != OpKind::accumulate_grad || target.param < 0) return TensorKind::temporary;
    return rt.parameters()[target.param].grad == kNoStorage ? TensorKind::gradient
                                                             : TensorKind::temporary;
  }
  Grad pass(const Grad& g, bool as_view) {
    rt.retain(g.storage);
    return Grad{g.storage, as_view || g.is_view, false};
  }
  // Engine validate_outputs: a broadcast input's grad is reduced with sum_to. A
  // reduction over the leading dims may stage partials in global memory.
  void sum_to(Grad& g, uint64_t bytes, int i) {
    if (g.storage == kNoStorage) return;
    uint32_t r = A(bytes, kind_for(i));
    if (n.flags & kOuterBroadcast) {
      // size[3]: the broadcast operand's element size, unless Autocast::promoted took the
      // slot for a low input's bytes: an fp32 product, whose broadcast operand (an RMSNorm
      // weight under autocast) is fp32.
      const uint64_t elem = !has_promoted_input(n) && n.size[3] != 0 ? n.size[3] : 4;
      detail::outer_reduce_staging(rt, n.size[2] / bytes, bytes / elem, n.kind);
    }
    F(g.storage);
    g = Grad{r, false, false};
  }
};

}  // namespace

void run_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (run_fused_backward(rt, n, in, out)) return;  // graph/ops/ops_fused.h
  if (run_ring_backward(rt, n, in, out)) return;   // graph/ops/ops_ring.h (an sdpa_flash node)
  if (run_litgpt_backward(rt, n, in, out)) return;  // graph/ops/ops_litgpt.h
  if (run_sdpa_cudnn_backward(rt, n, in, out)) return;  // graph/ops/ops_sdpa_cudnn.h
  if (run_nn_backward(rt, n, in, out)) return;     // graph/ops/ops_nn.h
  if (run_autocast_backward(rt, n, in, out)) return;  // graph/autocast.h
  if (run_lora_backward(rt, n, in, out)) return;   // graph/ops/ops_lora.h
  if (run_float8_backward(rt, n, in, out)) return;  // graph/ops/ops_float8.h
  if (run_liger_backward(rt, n, in, out)) return;  // graph/ops/ops_liger.h
  if (run_moe_backward(rt, n, in, out)) return;    // graph/ops/ops_moe.h
  Bw b{rt, n};
  const Grad& g = in[0];
  if (g.storage == kNoStorage && n.kind != OpKind::max_dim) return;
  switch (n.kind) {
    case OpKind::pow2: {  // grad * (2 * x.pow(1))
      uint32_t t1 = b.A(n.size[0]);
      uint32_t t2 = b.A(n.size[0]);
      uint32_t r = b.A(n.size[0]);
      b.F(t1);
      b.F(t2);
      out[0] = Grad{r, false, false};
      break;
    }
    case OpKind::rsqrt: {  // -0.5 * grad * result^3
      uint32_t t1 = b.A(n.size[0]);
      uint32_t t2 = b.A(n.size[0]);
      uint32_t r = b.A(n.size[0]);
      b.F(t1);
      b.F(t2);
      out[0] = Grad{r, false, false};
      break;
    }
    case OpKind::mean_dim:
    case OpKind::mean_all:  // expand, then / numel: materialises the input size
    case OpKind::div_scalar:
    case OpKind::sigmoid:
    case OpKind::exp:
    case OpKind::log:
    case OpKind::neg:
    case OpKind::log_softmax:  // _log_softmax_backward_data
    case OpKind::nll_loss:     // nll_loss_backward: zeros(N, C) + scatter
    case OpKind::gather:  // zeros(self) + scatter_add
      out[0] = Grad{b.A(n.size[0], b.kind_for(0)), false, false};
      break;
    case OpKind::add_scalar:
    case OpKind::clone:
      out[0] = b.pass(g, false);
      break;
    case OpKind::sum_dim:  // grad.expand(sizes): a stride-0 view of the reduced grad
      out[0] = b.pass(g, true);
      break;
    case OpKind::view:
      if (n.flags & kCopyInBackward)
        out[0] = Grad{b.A(n.size[0], b.kind_for(0)), false, false};
      else
        out[0] = b.pass(g, true);
      break;
    case OpKind::add:
      if (b.needs(0)) out[0] = b.pass(g, false);
      if (b.needs(1)) out[1] = b.pass(g, false);
      cast_promoted_grads(rt, n, out);  // graph/autocast.h (validate_outputs)
      break;
    case OpKind::sub:
      if (b.needs(1)) out[1] = Grad{b.A(n.size[2]), false, false};  // -grad
      if (b.needs(0)) out[0] = b.pass(g, false);
      cast_promoted_grads(rt, n, out);  // output 0's cast precedes output 1's sum_to
      if (n.flags & kBroadcastB) b.sum_to(out[1], n.size[1], 1);
      break;
    case OpKind::mul:
      // The generated code computes the later input's grad first.
      if (b.needs(1)) out[1] = Grad{b.A(n.size[2]), false, false};
      if (b.needs(0)) out[0] = Grad{b.A(n.size[2]), false, false};
      // validate_outputs, output by output: a broadcast input's sum_to, then the cast of
      // a low-precision input's fp32 grad (an input promoted into an fp32 product).
      if (n.flags & kBroadcastA) b.sum_to(out[0], n.size[0], 0);
      cast_promoted_grad(rt, n, out[0], 0);
      if (n.flags & kBroadcastB) b.sum_to(out[1], n.size[1], 1);
      cast_promoted_grad(rt, n, out[1], 1);
      break;
    case OpKind::div:
      if (b.needs(1)) {  // -grad * ((self / other) / other): 4 full-size tensors at once
        uint32_t t1 = b.A(n.size[2]);
        uint32_t t2 = b.A(n.size[2]);
        uint32_t t3 = b.A(n.size[2]);
        uint32_t t4 = b.A(n.size[2]);
        b.F(t3);
        b.F(t2);
        b.F(t1);
        out[1] = Grad{t4, false, false};
      }
      if (b.needs(0)) out[0] = Grad{b.A(n.size[2]), false, false};
      if (n.flags & kBroadcastB) b.sum_to(out[1], n.size[1], 1);
      break;
    case OpKind::max_dim:
      if (g.storage == kNoStorage) return;
      out[0] = Grad{b.A(n.size[0]), false, false};  // zeros + scatter
      break;
    case OpKind::where_scalar: {
      // size[3] 0: masked_fill_'s backward (grad.masked_fill(mask, 0)) has no 0-d tensor.
      const bool scalar = n.size[3] != 0;
      uint32_t s = scalar ? b.A(n.size[3]) : 0;
      uint32_t r = b.A(n.size[0]);
      if (scalar) b.F(s);
      out[0] = Grad{r, false, false};
      break;
    }
    case OpKind::bmm:
      if (b.needs(1)) {
        // kind_for: a parameter's first grad when the operand is the parameter itself
        // (einsum_bmm's lora_A: the grad AccumulateGrad steals).
        out[1] = Grad{b.A(n.size[1], b.kind_for(1)), false, false};
        // einsum_bmm (graph/ops/ops_moe.h): CUDA copies the untransposable left^T.
        if (n.size[2] > 0) b.F(b.A(n.size[2]));
      }
      rt.note_gemm();
      if (b.needs(0)) out[0] = Grad{b.A(n.size[0], b.kind_for(0)), false, false};
      break;
    case OpKind::linear:
      // next[0] = weight (its grad arrives transposed: AccumulateGrad clones it),
      // next[1] = input (a view of the bmm result).
      if (b.needs(0)) out[0] = Grad{b.A(n.size[0]), false, true};
      rt.note_gemm();
      if (b.needs(1)) out[1] = Grad{b.A(n.size[1]), true, false};
      break;
    case OpKind::embedding: {
      // new_zeros(V, D), then CUDA's sort-based index_put_ with accumulate=True.
      uint32_t w = b.A(n.size[0], b.kind_for(0));
      const uint64_t k = n.size[1];
      uint32_t a1 = b.A(k), a2 = b.A(k);
      b.F(a1);
      uint32_t a3 = b.A(k), a4 = b.A(k), a5 = b.A(k), a6 = b.A(1);
      b.F(a6);
      b.F(a2);
      b.F(a3);
      b.F(a4);
      b.F(a5);
      out[0] = Grad{w, false, false};
      break;
    }
    case OpKind::rope: {
      // Backward of cat (narrow views), add, sub, four muls by cos/sin, unbind (stack),
      // and the einops reshape (a copy: the grad is permuted). cs336-model.md §9.13.
      const uint64_t h = n.size[0] / 2;
      uint32_t m1 = b.A(h), m2 = b.A(h), n1 = b.A(h), m3 = b.A(h);
      b.F(m3);  // added in place into m1
      b.F(n1);
      uint32_t m4 = b.A(h);
      n.grad[0] = kNoStorage;  // the narrow views' base dies with the last mul node
      b.F(g.storage);
      rt.release_saved(n);  // the cos/sin views die with the last mul node too
      b.F(m4);  // added in place into m2
      uint32_t s = b.A(n.size[0]);
      b.F(m2);
      b.F(m1);
      uint32_t c = b.A(n.size[0]);
      b.F(s);
      out[0] = Grad{c, false, false};
      break;
    }
    default:
      break;
  }
}

}  // namespace memsim::graph
