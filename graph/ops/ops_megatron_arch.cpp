#include "graph/ops/ops_megatron_arch.h"

namespace memsim::graph {

namespace {

Tensor act(Runtime& rt, uint64_t bytes, OpKind k) { return rt.alloc(bytes, TensorKind::activation, k); }

bool records(const Runtime& rt, std::initializer_list<const Tensor*> ins, bool has_params) {
  if (!rt.grad_enabled) return false;
  if (has_params) return true;
  for (const Tensor* t : ins)
    if (t->requires_grad()) return true;
  return false;
}

}  // namespace

Tensor fused_swiglu(Runtime& rt, const Tensor& x, uint64_t bias_bytes) {
  Tensor out = act(rt, x.bytes / 2, OpKind::fused_swiglu);
  rt.add_flops_forward(0, static_cast<double>(x.bytes + out.bytes));
  if (records(rt, {&x}, bias_bytes != 0)) {
    const int32_t n = rt.make_node(OpKind::fused_swiglu, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).size[1] = bias_bytes;
    rt.save(n, x);
    out.grad_fn = n;
  }
  return out;
}

Tensor weighted_swiglu(Runtime& rt, const Tensor& x, const Tensor& probs) {
  Tensor out = act(rt, x.bytes / 2, OpKind::weighted_swiglu);
  rt.add_flops_forward(0, static_cast<double>(x.bytes + probs.bytes + out.bytes));
  if (records(rt, {&x, &probs}, false)) {
    const int32_t n = rt.make_node(OpKind::weighted_swiglu, {&x, &probs});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).size[1] = probs.bytes;
    rt.save(n, x);
    rt.save(n, probs);
    out.grad_fn = n;
  }
  return out;
}

Tensor checkpointed_weighted_swiglu(Runtime& rt, const Tensor& x, const Tensor& probs) {
  Tensor out = weighted_swiglu(rt, x, probs);
  if (out.grad_fn >= 0) rt.save_placeholder(out.grad_fn);  // ctx.outputs, set by the recompute
  return out;
}

Tensor discard_moe_act(Runtime& rt, Tensor& act, const Tensor& fc2_out) {
  const int32_t fc2 = fc2_out.grad_fn, ckpt = act.grad_fn;
  if (fc2 < 0 || ckpt < 0) {  // no grad: nothing saved act, no hook is registered
    act.reset();
    return fc2_out;
  }
  const uint64_t act_bytes = act.bytes;
  const uint64_t io = rt.node(ckpt).size[0] + rt.node(ckpt).size[1];  // the re-run reads x, probs
  rt.release_saved_slot(rt.node(fc2), 0);  // output.untyped_storage().resize_(0)
  act.reset();
  Tensor out = rt.view_of(fc2_out, fc2_out.bytes);
  const int32_t n = rt.make_node(OpKind::moe_act_recompute, {&fc2_out});
  rt.node(n).size[0] = act_bytes;
  rt.node(n).size[1] = static_cast<uint64_t>(ckpt);
  rt.node(n).size[2] = io;
  out.grad_fn = n;
  out.out_slot = 0;
  return out;
}

Tensor gqa_query_copy(Runtime& rt, const Tensor& mixed, uint64_t q_bytes) {
  (void)mixed;  // read only: the copy has no autograd node of its own (see the header)
  rt.add_flops_forward(0, 2.0 * static_cast<double>(q_bytes));
  return act(rt, q_bytes, OpKind::clone);
}

Tensor fused_attention_gqa(Runtime& rt, const Tensor& q, const Tensor& mixed, uint64_t out_bytes,
                           uint64_t lse_bytes, uint64_t dq_accum_bytes, bool dropout_active,
                           double flops) {
  Tensor out = act(rt, out_bytes, OpKind::fused_attention_gqa);
  Tensor lse = act(rt, lse_bytes, OpKind::fused_attention_gqa);
  Tensor rng;
  if (dropout_active) rng = act(rt, 16, OpKind::fused_attention_gqa);  // philox seed, offset
  // IO-aware: q and k, v read once (k, v are mixed minus its query part), out and lse written.
  const double io = static_cast<double>(q.bytes + (mixed.bytes - q.bytes) + out_bytes + lse_bytes);
  rt.add_flops_forward(flops, io);
  if (records(rt, {&mixed}, false)) {
    const int32_t n = rt.make_node(OpKind::fused_attention_gqa, {&mixed});
    Node& node = rt.node(n);
    node.size[0] = mixed.bytes;
    node.size[1] = lse_bytes;
    node.size[2] = dq_accum_bytes;
    node.size[3] = q.bytes;
    node.flops = 2.5 * flops;  // recompute of P plus dV, dP, dQ, dK
    node.gemm_bytes = static_cast<float>(2 * mixed.bytes + 2 * out_bytes + lse_bytes);
    rt.save(n, q);
    rt.save(n, mixed);  // key
    rt.save(n, mixed);  // value
    rt.save(n, out);
    rt.save(n, lse);
    if (dropout_active) rt.save(n, rng);
    out.grad_fn = n;
  }
  return out;
}

bool run_megatron_arch_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  auto A = [&](uint64_t bytes, TensorKind kind = TensorKind::temporary) {
    return rt.alloc_raw(bytes, kind, n.kind);
  };
  auto needs = [&](int i) { return i < n.n_next && n.next[i].node >= 0; };
  const Grad& g = in[0];
  switch (n.kind) {
    case OpKind::fused_swiglu: {
      if (g.storage == kNoStorage) return true;
      const uint32_t tmp = A(n.size[0]);  // swiglu_back: cat of the halves' grads
      if (n.size[1] != 0) rt.release(A(n.size[1], TensorKind::gradient));  // bias: main_grad
      if (needs(0)) out[0] = Grad{tmp, false, false};
      else rt.release(tmp);
      return true;
    }
    case OpKind::weighted_swiglu: {
      if (g.storage == kNoStorage) return true;
      const uint32_t gx = A(n.size[0]);  // swiglu_back(g * weights, y)
      const uint32_t gw = A(n.size[1]);  // sum(swiglu(y) * g, -1, keepdim)
      if (needs(0)) out[0] = Grad{gx, false, false};
      else rt.release(gx);
      if (needs(1)) out[1] = Grad{gw, false, false};
      else rt.release(gw);
      return true;
    }
    case OpKind::moe_act_recompute: {
      // CheckpointWithoutOutput._recompute as the hook on fc2's output grad (see the header):
      // the weighted SwiGLU re-run with grad on, its output shared into the emptied storage.
      if (g.storage == kNoStorage) return true;
      const int32_t fc2 = n.next[0].node;
      const int32_t ckpt = static_cast<int32_t>(n.size[1]);
      if (fc2 >= 0 && rt.node(ckpt).saved_count == 3 && rt.saved_storage(rt.node(ckpt), 2) == kNoStorage) {
        rt.recomputing = true;  // a forward op inside backward: its forward name, recompute cost
        const uint32_t r = rt.alloc_raw(n.size[0], TensorKind::activation, OpKind::weighted_swiglu);
        rt.add_flops_forward(0, static_cast<double>(n.size[2] + n.size[0]));
        rt.recomputing = false;
        rt.fill_saved(fc2, 0, r);   // fc2's saved input (the views TE saved) sees the data
        rt.fill_saved(ckpt, 2, r);  // ctx.outputs: alive until the checkpoint's backward ran
        rt.release(r);
      }
      if (needs(0)) {
        rt.retain(g.storage);
        out[0] = Grad{g.storage, g.is_view, g.transposed};
      }
      return true;
    }
    case OpKind::fused_attention_gqa: {
      if (g.storage == kNoStorage) return true;
      const uint32_t dq = A(n.size[3]);
      const uint32_t dkv = A(n.size[0] - n.size[3]);
      const uint32_t softmax_d = A(n.size[1]);
      const uint32_t dq_accum = n.size[2] ? A(n.size[2]) : kNoStorage;
      if (dq_accum != kNoStorage) rt.release(dq_accum);
      rt.release(softmax_d);
      // The query's reshape hands back a view of dq; _SplitAlongDim's backward cats dq,
      // dk, dv into the mixed_qkv layout, then they die.
      const uint32_t cat = A(n.size[0]);
      rt.release(dq);
      rt.release(dkv);
      if (needs(0)) out[0] = Grad{cat, false, false};
      else rt.release(cat);
      return true;
    }
    default:
      return false;
  }
}

}  // namespace memsim::graph
