#include "graph/ops/ops_moe.h"

#include "graph/autocast.h"
#include "graph/checkpoint.h"
#include "graph/ops/op_helpers.h"
#include "graph/ops/ops.h"

namespace memsim::graph {

using detail::out_tensor;
using detail::wants_grad;

Tensor moe_scratch(Runtime& rt, uint64_t bytes, OpKind op) {
  return rt.alloc(bytes, TensorKind::temporary, op);
}

Tensor cat_n(Runtime& rt, const std::vector<Tensor>& inputs) {
  uint64_t bytes = 0;
  for (const Tensor& t : inputs) bytes += t.bytes;
  Tensor out = out_tensor(rt, bytes, OpKind::cat_n);
  bool grad = false;
  for (const Tensor& t : inputs) grad = grad || wants_grad(rt, {&t});
  if (!grad) return out;
  // From the tail: each node takes two inputs and, as its third edge, the chain after it.
  Tensor rest;  // a handle whose grad_fn is the chain after the current node
  size_t end = inputs.size();
  size_t first = end > 2 ? (end - 1) / 2 * 2 : 0;  // the last pair (or single) starts here
  for (;;) {
    const Tensor* a = &inputs[first];
    const Tensor* b = first + 1 < end ? &inputs[first + 1] : nullptr;
    const int32_t n = rest.grad_fn >= 0 ? rt.make_node(OpKind::cat_n, {a, b, &rest})
                                        : rt.make_node(OpKind::cat_n, {a, b});
    rest = Tensor{};
    rest.grad_fn = n;
    rest.out_slot = 0;
    end = first;
    if (first == 0) break;
    first -= 2;
  }
  out.grad_fn = rest.grad_fn;
  out.out_slot = 0;
  return out;
}

Tensor index_rows(Runtime& rt, const Tensor& self, const Tensor& index_storage, uint64_t index_bytes,
                  uint64_t out_bytes) {
  Tensor out = out_tensor(rt, out_bytes, OpKind::moe_index);
  if (wants_grad(rt, {&self})) {
    int32_t n = rt.make_node(OpKind::moe_index, {&self});
    rt.node(n).size[0] = self.bytes;
    rt.node(n).size[1] = index_bytes;
    rt.save(n, index_storage);
    out.grad_fn = n;
  }
  return out;
}

TopkResult topk(Runtime& rt, const Tensor& x, uint64_t rows, uint64_t k, uint64_t elem) {
  TopkResult r;
  r.values = out_tensor(rt, rows * k * elem, OpKind::topk);
  r.indices = out_tensor(rt, rows * k * 8, OpKind::topk);
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::topk, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.save(n, r.indices);
    r.values.grad_fn = n;
  }
  return r;
}

Tensor view_with_node(Runtime& rt, const Tensor& x) {
  Tensor out = rt.view_of(x, x.bytes);
  detail::numeric_forward(rt, OpKind::view, {&x}, {&out});
  if (wants_grad(rt, {&x})) {
    const int32_t n = rt.make_node(OpKind::view, {&x});
    rt.node(n).size[0] = x.bytes;  // backward: the grad passed on as a view (ops.cpp)
    out.grad_fn = n;
    out.out_slot = 0;
  }
  return out;
}

Tensor masked_fill_scalar(Runtime& rt, const Tensor& x, const Tensor& mask) {
  Tensor out = out_tensor(rt, x.bytes, OpKind::where_scalar);
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::where_scalar, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).size[3] = 0;  // masked_fill's backward: no 0-d scalar tensor
    rt.save(n, mask);
    out.grad_fn = n;
  }
  return out;
}

void div_inplace(Runtime& rt, Tensor& a, const Tensor& b) {
  if (!wants_grad(rt, {&a, &b})) return;
  // original_self: the generated in-place code clones self before overwriting it. Not in
  // a reentrant checkpoint's forward, which torch runs under no_grad (graph/checkpoint.h):
  // there the save is a placeholder that the re-run's clone fills.
  Tensor original;
  if (rt.checkpoint == nullptr || !rt.checkpoint->forward_without_grad())
    original = rt.alloc(a.bytes, TensorKind::activation, OpKind::clone);
  int32_t n = rt.make_node(OpKind::div_inplace, {&a, &b});
  Node& node = rt.node(n);
  node.size[0] = a.bytes;
  node.size[1] = b.bytes;
  node.size[2] = a.bytes;
  rt.save(n, b);
  if (b.requires_grad()) rt.save(n, original);
  a.grad_fn = n;
  a.out_slot = 0;
}

Tensor mul_column(Runtime& rt, const Tensor& a, const Tensor& col, uint64_t out_bytes) {
  Tensor out = out_tensor(rt, out_bytes, OpKind::mul);
  if (wants_grad(rt, {&a, &col})) {
    int32_t n = rt.make_node(OpKind::mul, {&a, &col});
    Node& node = rt.node(n);
    node.size[0] = a.bytes;
    node.size[1] = col.bytes;
    node.size[2] = out_bytes;
    node.flags |= kBroadcastB;
    detail::save_cross(rt, n, a, col);
    out.grad_fn = n;
    // A 16-bit a in an fp32 product: the engine casts its grad back (validate_outputs).
    if (a.bytes < out_bytes) Autocast::promoted(rt, out, 0, a);
  }
  return out;
}

void index_add_(Runtime& rt, Tensor& self, const Tensor& index_storage, const Tensor& source) {
  if (!wants_grad(rt, {&self, &source})) return;
  int32_t n = rt.make_node(OpKind::index_add, {&self, &source});
  rt.node(n).size[0] = self.bytes;
  rt.node(n).size[1] = source.bytes;
  rt.save(n, index_storage);
  rt.save(n, source);  // the formula reads source.dim() and expand_as(source)
  self.grad_fn = n;
  self.out_slot = 0;
}

Tensor grouped_mm(Runtime& rt, const Tensor& x, const Tensor& w, const Tensor& offs, uint64_t out_bytes,
                  double flops) {
  Tensor out = out_tensor(rt, out_bytes, OpKind::grouped_mm);
  rt.note_gemm();
  const double io = static_cast<double>(x.bytes + w.bytes + out_bytes);
  rt.add_flops_forward(flops, io);
  if (wants_grad(rt, {&x, &w})) {
    int32_t n = rt.make_node(OpKind::grouped_mm, {&x, &w});
    Node& node = rt.node(n);
    node.size[0] = x.bytes;
    node.size[1] = w.bytes;
    node.flops = detail::matmul_backward_flops(x, w, flops);
    node.gemm_bytes = detail::matmul_backward_bytes(x, w, io);
    // The generated node's saved variables in the order the formulas first name them
    // (mat2 in self's, offs, then self in mat2's), which is the order they are released
    // after it runs (the H200 trace frees the offsets before the input).
    if (x.requires_grad()) rt.save(n, w);
    rt.save(n, offs);
    if (w.requires_grad()) rt.save(n, x);
    out.grad_fn = n;
  }
  return out;
}

Tensor masked_fill(Runtime& rt, const Tensor& x, const Tensor& mask, bool in_place) {
  Tensor out = in_place ? x : out_tensor(rt, x.bytes, OpKind::masked_fill);
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::where_scalar, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).size[3] = 0;  // no 0-d scalar tensor in its backward
    rt.save(n, mask);
    out.grad_fn = n;
    out.out_slot = 0;
  }
  return out;
}

bool run_moe_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (op_library(n.kind) != OpLibrary::moe) return false;
  const Grad& g = in[0];
  if (g.storage == kNoStorage) return true;
  auto A = [&](uint64_t bytes, TensorKind kind = TensorKind::temporary) {
    return rt.alloc_raw(bytes, kind, n.kind);
  };
  auto F = [&](uint32_t s) { rt.release(s); };
  auto needs = [&](int i) { return n.next[i].node >= 0; };
  auto kind_for = [&](int i) {
    if (!needs(i)) return TensorKind::temporary;
    const Node& target = rt.node(n.next[i].node);
    if (target.kind != OpKind::accumulate_grad || target.param < 0) return TensorKind::temporary;
    return rt.parameters()[target.param].grad == kNoStorage ? TensorKind::gradient
                                                             : TensorKind::temporary;
  };
  auto fresh = [](uint32_t s) { return Grad{s, false, false}; };
  switch (n.kind) {
    case OpKind::cat_n:  // narrow views of the grad: to both inputs and the chain after them
      for (int i = 0; i < n.n_next; ++i) {
        if (!needs(i)) continue;
        rt.retain(g.storage);
        out[i] = Grad{g.storage, true, false};
      }
      return true;
    case OpKind::moe_index:
    case OpKind::expand_index: {
      // index_backward: zeros(self), then _index_put_impl_(accumulate=True) in place. On
      // CUDA the accumulate path sorts the linear indices (the temporaries the core
      // `embedding` op's IndexBackward0 emits, measured on an H100 for CS336).
      const uint32_t w = A(n.size[0], kind_for(0));
      if (rt.kernel_scratch) {
        const uint64_t k = n.size[1];
        const uint32_t a1 = A(k), a2 = A(k);
        F(a1);
        const uint32_t a3 = A(k), a4 = A(k), a5 = A(k), a6 = A(1);
        F(a6);
        F(a2);
        F(a3);
        F(a4);
        F(a5);
      }
      out[0] = fresh(w);
      return true;
    }
    case OpKind::topk: {
      // value_selecting_reduction_backward (torch 2.x FunctionsManual.cpp): zeros(x) and an
      // in-place scatter_ into it: one x-sized tensor (the H200 trace of the grouped_mm run
      // shows one). torch 1.13 (the CPU fixtures) scattered out of place: a second one.
      out[0] = fresh(A(n.size[0]));
      return true;
    }
    case OpKind::div_inplace: {
      uint32_t other = kNoStorage;
      if (needs(1)) {  // -grad * ((self / other) / other)
        const uint32_t t1 = A(n.size[2]), t2 = A(n.size[2]), t3 = A(n.size[2]), t4 = A(n.size[2]);
        F(t3);
        F(t2);
        F(t1);
        other = t4;
      }
      if (needs(0)) out[0] = fresh(A(n.size[2]));
      if (other != kNoStorage) {  // sum_to the broadcast divisor
        const uint32_t r = A(n.size[1]);
        F(other);
        out[1] = fresh(r);
      }
      return true;
    }
    case OpKind::index_add:
      if (needs(0)) {
        rt.retain(g.storage);
        out[0] = Grad{g.storage, g.is_view, false};
      }
      if (needs(1)) out[1] = fresh(A(n.size[1]));  // grad.index_select(0, index)
      return true;
    case OpKind::grouped_mm:
      if (needs(1)) out[1] = fresh(A(n.size[1], kind_for(1)));  // in W's layout: stolen
      rt.note_gemm();
      if (needs(0)) out[0] = fresh(A(n.size[0]));
      return true;  // its FLOPs and bytes are counted by the engine (runtime.cpp run_node)
    default:
      return true;
  }
}

Tensor einsum_bmm(Runtime& rt, const Tensor& left, const Tensor& right, uint64_t out_bytes, double flops,
                  uint64_t clone_bytes) {
  Tensor out = bmm(rt, left, right, out_bytes, flops);
  if (clone_bytes > 0) {
    rt.alloc(clone_bytes, TensorKind::temporary, OpKind::bmm).reset();
    if (out.grad_fn >= 0) rt.node(out.grad_fn).size[2] = clone_bytes;
  }
  return out;
}

}  // namespace memsim::graph
