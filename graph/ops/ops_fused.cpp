// Megatron-LM's fused ops (see graph/ops/ops_fused.h for each op's contract).
//
// Node::size use per kind (bytes unless noted):
//   fused_layer_norm   [0] input  [1] gamma (= beta)  [2] apex part-grad scratch (each)
//   megatron_linear    [0] input  [1] weight  [2] bias (0 = none)
//   qkv_split          [0] mixed  [2] stashed k grad storage + 1 (0 = none)
//   baddbmm            [0] q      [1] k
//   fused_softmax      [0] scores
//   dropout            [0] input
//   bias_dropout_add   [0] input  [1] bias
//   bias_gelu          [0] input  [1] bias
//   fused_attention    [0] mixed  [1] lse  [2] fp32 dq accumulator
//   megatron_embedding [0] output [1] weight [2] indices (int64) [3] 1 = grad arrives transposed
//   vocab_parallel_ce  [0] logits (16-bit) [1] rows
#include "graph/ops/ops_fused.h"
#include "graph/ops/ops_megatron_moe.h"

#include "graph/ops/op_helpers.h"

namespace memsim::graph {

namespace {

// A node is recorded when grad mode is on and either an input requires grad or the op
// owns parameters (whose grads Megatron's hook consumes).
bool records(const Runtime& rt, std::initializer_list<const Tensor*> ins, bool has_params) {
  if (!rt.grad_enabled) return false;
  if (has_params) return true;
  for (const Tensor* t : ins)
    if (t->requires_grad()) return true;
  return false;
}

Tensor act(Runtime& rt, uint64_t bytes, OpKind k) {
  return rt.alloc(bytes, TensorKind::activation, k);
}

constexpr uint64_t kRowScatterBit = 1ull << 63;

}  // namespace

Tensor fused_layer_norm(Runtime& rt, const Tensor& x, uint64_t rows, uint64_t hidden,
                        uint64_t param_elem) {
  Tensor out = act(rt, x.bytes, OpKind::fused_layer_norm);
  Tensor mean = act(rt, rows * 4, OpKind::fused_layer_norm);
  Tensor invvar = act(rt, rows * 4, OpKind::fused_layer_norm);
  detail::numeric_forward(rt, OpKind::fused_layer_norm, {&x}, {&out, &mean, &invvar});
  if (records(rt, {&x}, true)) {
    const int32_t n = rt.make_node(OpKind::fused_layer_norm, {&x});
    Node& node = rt.node(n);
    node.size[0] = x.bytes;
    node.size[1] = hidden * param_elem;
    node.size[2] = 16 * hidden * 4;  // apex cuComputePartGradGammaBeta: part_size 16, fp32
    rt.save(n, x);
    rt.save(n, mean);
    rt.save(n, invvar);
    out.grad_fn = n;
  }
  return out;
}

Tensor megatron_linear(Runtime& rt, const Tensor& x, const LinearSpec& spec) {
  Tensor out = act(rt, spec.out_bytes, OpKind::megatron_linear);
  rt.note_gemm();
  const double io = static_cast<double>(x.bytes + spec.weight_bytes + spec.out_bytes);
  rt.add_flops_forward(spec.flops, io);
  if (spec.bias_bytes != 0) {
    // `output = output + bias` inside the Function's forward: a new tensor, the GEMM
    // result dies when the name is rebound.
    Tensor biased = act(rt, spec.out_bytes, OpKind::megatron_linear);
    out = std::move(biased);
  }
  if (spec.scatter_bytes != 0) {
    // reduce_scatter_to_sequence_parallel_region: torch.empty(shard) then the collective.
    Tensor shard = act(rt, spec.scatter_bytes, OpKind::megatron_linear);
    out = std::move(shard);
  }
  detail::numeric_forward(rt, OpKind::megatron_linear, {&x}, {&out});  // numeric mode
  if (records(rt, {&x}, true)) {
    const int32_t n = rt.make_node(OpKind::megatron_linear, {&x});
    Node& node = rt.node(n);
    node.size[0] = x.bytes;
    node.size[1] = spec.weight_bytes;
    node.size[2] = spec.bias_bytes;
    node.flops = 2 * spec.flops;  // dgrad + wgrad
    node.param = spec.weight;     // names the dummy grad_weight (read by nothing else here)
    node.gemm_bytes = static_cast<float>(2 * io);
    // size[3]: sequence parallel, the all-gathered input (column) or, with the top bit
    // set, the full GEMM output whose grad is all-gathered first (row).
    node.size[3] = spec.gather_bytes != 0    ? spec.gather_bytes
                   : spec.scatter_bytes != 0 ? (spec.out_bytes | kRowScatterBit)
                                             : 0;
    rt.save(n, x);
    out.grad_fn = n;
  }
  return out;
}

QkvViews qkv_split(Runtime& rt, const Tensor& mixed) {
  QkvViews v;
  v.q = rt.view_of(mixed, mixed.bytes / 3);
  v.k = rt.view_of(mixed, mixed.bytes / 3);
  v.v = rt.view_of(mixed, mixed.bytes / 3);
  detail::numeric_forward(rt, OpKind::qkv_split, {&mixed}, {});
  if (records(rt, {&mixed}, false)) {
    const int32_t n = rt.make_node(OpKind::qkv_split, {&mixed});
    rt.node(n).size[0] = mixed.bytes;
    v.q.grad_fn = n;
    v.q.out_slot = 0;
    v.k.grad_fn = n;
    v.k.out_slot = 0;  // delivered together with q's by baddbmm (see the header)
    v.v.grad_fn = n;
    v.v.out_slot = 1;
  }
  return v;
}

Tensor baddbmm_qk(Runtime& rt, const Tensor& q, const Tensor& k, uint64_t out_bytes,
                  double flops) {
  Tensor out = act(rt, out_bytes, OpKind::baddbmm);
  detail::numeric_forward(rt, OpKind::baddbmm, {&q, &k}, {&out});
  rt.note_gemm();
  const double io = static_cast<double>(q.bytes + k.bytes + out_bytes);
  rt.add_flops_forward(flops, io);
  if (records(rt, {&q, &k}, false)) {
    // One edge: k's grad travels with q's to the split node (slot 0).
    const int32_t n = rt.make_node(OpKind::baddbmm, {&q});
    Node& node = rt.node(n);
    node.size[0] = q.bytes;
    node.size[1] = k.bytes;
    node.flops = 2 * flops;
    node.gemm_bytes = static_cast<float>(2 * io);
    rt.save(n, q);
    rt.save(n, k);
    out.grad_fn = n;
  }
  return out;
}

Tensor fused_causal_softmax(Runtime& rt, const Tensor& scores) {
  Tensor out = act(rt, scores.bytes, OpKind::fused_softmax);
  detail::numeric_forward(rt, OpKind::fused_softmax, {&scores}, {&out});
  if (records(rt, {&scores}, false)) {
    const int32_t n = rt.make_node(OpKind::fused_softmax, {&scores});
    rt.node(n).size[0] = scores.bytes;
    rt.save(n, out);
    out.grad_fn = n;
  }
  return out;
}

Tensor dropout(Runtime& rt, const Tensor& x, uint64_t elems, bool active) {
  if (!active) return x;  // p == 0: at::dropout returns its input
  Tensor out = act(rt, x.bytes, OpKind::dropout);
  Tensor mask = act(rt, elems, OpKind::dropout);
  detail::numeric_forward(rt, OpKind::dropout, {&x}, {&out, &mask});
  if (records(rt, {&x}, false)) {
    const int32_t n = rt.make_node(OpKind::dropout, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.save(n, mask);
    out.grad_fn = n;
  }
  return out;
}

Tensor bias_dropout_add(Runtime& rt, const Tensor& x, const Tensor& residual, uint64_t elems,
                        uint64_t bias_bytes, bool dropout_active) {
  Tensor out = act(rt, residual.bytes, OpKind::bias_dropout_add);
  Tensor mask;
  if (dropout_active) mask = act(rt, elems, OpKind::bias_dropout_add);
  if (mask.defined()) detail::numeric_forward(rt, OpKind::bias_dropout_add, {&x, &residual}, {&out, &mask});
  else detail::numeric_forward(rt, OpKind::bias_dropout_add, {&x, &residual}, {&out});
  if (records(rt, {&x, &residual}, bias_bytes != 0)) {
    const int32_t n = rt.make_node(OpKind::bias_dropout_add, {&x, &residual});
    Node& node = rt.node(n);
    node.size[0] = x.bytes;
    node.size[1] = bias_bytes;
    if (dropout_active) rt.save(n, mask);
    out.grad_fn = n;
  }
  return out;
}

Tensor bias_gelu(Runtime& rt, const Tensor& x, uint64_t bias_bytes) {
  Tensor out = act(rt, x.bytes, OpKind::bias_gelu);
  detail::numeric_forward(rt, OpKind::bias_gelu, {&x}, {&out});
  if (records(rt, {&x}, bias_bytes != 0)) {
    const int32_t n = rt.make_node(OpKind::bias_gelu, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).size[1] = bias_bytes;
    rt.save(n, x);
    out.grad_fn = n;
  }
  return out;
}

Tensor fused_attention(Runtime& rt, const Tensor& mixed, uint64_t out_bytes, uint64_t lse_bytes,
                       uint64_t dq_accum_bytes, bool dropout_active, double flops) {
  Tensor out = act(rt, out_bytes, OpKind::fused_attention);
  Tensor lse = act(rt, lse_bytes, OpKind::fused_attention);
  Tensor rng;
  if (dropout_active) rng = act(rt, 16, OpKind::fused_attention);  // philox seed, offset
  detail::numeric_forward(rt, OpKind::fused_attention, {&mixed}, {&out, &lse});
  // IO-aware: q, k, v (the fused projection's output) read once, out and lse written.
  const double io = static_cast<double>(mixed.bytes + out_bytes + lse_bytes);
  rt.add_flops_forward(flops, io);
  if (records(rt, {&mixed}, false)) {
    const int32_t n = rt.make_node(OpKind::fused_attention, {&mixed});
    Node& node = rt.node(n);
    node.size[0] = mixed.bytes;
    node.size[1] = lse_bytes;
    node.size[2] = dq_accum_bytes;
    node.flops = 2.5 * flops;  // recompute of P plus dV, dP, dQ, dK
    node.gemm_bytes = static_cast<float>(2 * mixed.bytes + 2 * out_bytes + lse_bytes);
    for (int i = 0; i < 3; ++i) rt.save(n, mixed);  // q, k, v
    rt.save(n, out);
    rt.save(n, lse);
    if (dropout_active) rt.save(n, rng);
    out.grad_fn = n;
  }
  return out;
}

Tensor megatron_embedding(Runtime& rt, const Tensor& ids, uint64_t out_bytes,
                          uint64_t weight_bytes, bool grad_arrives_transposed) {
  Tensor out = act(rt, out_bytes, OpKind::megatron_embedding);
  detail::numeric_forward(rt, OpKind::megatron_embedding, {&ids}, {&out});
  if (records(rt, {}, true)) {
    const int32_t n = rt.make_node(OpKind::megatron_embedding, {});
    Node& node = rt.node(n);
    node.size[0] = out_bytes;
    node.size[1] = weight_bytes;
    node.size[2] = ids.bytes;
    node.size[3] = grad_arrives_transposed ? 1 : 0;
    rt.save(n, ids);
    out.grad_fn = n;
  }
  return out;
}

Tensor vocab_parallel_cross_entropy(Runtime& rt, const Tensor& logits, uint64_t rows,
                                    uint64_t vocab) {
  // Inside the Function's forward (no autograd recording of its own ops).
  Tensor fp32 = act(rt, rows * vocab * 4, OpKind::vocab_parallel_ce);  // logits.float()
  Tensor logits_max = act(rt, rows * 4, OpKind::vocab_parallel_ce);
  {
    Tensor indices = rt.alloc(rows * 8, TensorKind::temporary, OpKind::vocab_parallel_ce);
  }  // torch.max(...)[0]: the indices die with the tuple
  // target_mask = (target < start) | (target >= end)
  Tensor lt = rt.alloc(rows, TensorKind::temporary, OpKind::vocab_parallel_ce);
  Tensor ge = rt.alloc(rows, TensorKind::temporary, OpKind::vocab_parallel_ce);
  Tensor target_mask = act(rt, rows, OpKind::vocab_parallel_ce);
  lt.reset();
  ge.reset();
  // masked_target = target.clone() - start
  Tensor cloned = rt.alloc(rows * 8, TensorKind::temporary, OpKind::vocab_parallel_ce);
  Tensor masked_target = act(rt, rows * 8, OpKind::vocab_parallel_ce);
  cloned.reset();
  Tensor arange = rt.alloc(rows * 8, TensorKind::temporary, OpKind::vocab_parallel_ce);
  Tensor picked = rt.alloc(rows * 4, TensorKind::temporary, OpKind::vocab_parallel_ce);
  Tensor predicted = rt.alloc(rows * 4, TensorKind::temporary, OpKind::vocab_parallel_ce);
  picked.reset();  // rebound by .clone().contiguous()
  // exp in place; sum_exp_logits; loss = log(sum) - predicted; div_ in place.
  Tensor sum_exp = rt.alloc(rows * 4, TensorKind::temporary, OpKind::vocab_parallel_ce);
  Tensor log_sum = rt.alloc(rows * 4, TensorKind::temporary, OpKind::vocab_parallel_ce);
  Tensor loss = act(rt, rows * 4, OpKind::vocab_parallel_ce);
  log_sum.reset();
  detail::numeric_forward(rt, OpKind::vocab_parallel_ce, {&logits},
                          {&loss, &fp32, &target_mask, &masked_target});
  if (records(rt, {&logits}, false)) {
    const int32_t n = rt.make_node(OpKind::vocab_parallel_ce, {&logits});
    rt.node(n).size[0] = logits.bytes;
    rt.node(n).size[1] = rows;
    rt.save(n, fp32);
    rt.save(n, target_mask);
    rt.save(n, masked_target);
    loss.grad_fn = n;
  }
  // The Function's locals die when forward returns (handles go out of scope here).
  return loss;
}

// ------------------------------------------------------------------------ backward
namespace {

struct FusedBw {
  Runtime& rt;
  Node& n;
  uint32_t A(uint64_t bytes, TensorKind kind = TensorKind::temporary) {
    return rt.alloc_raw(bytes, kind, n.kind);
  }
  void F(uint32_t s) { rt.release(s); }
  bool needs(int i) const { return i < n.n_next && n.next[i].node >= 0; }
  // A parameter grad handed to Megatron's DDP hook: main_grad.add_(grad); grad = None.
  void to_main_grad(uint64_t bytes) {
    if (bytes == 0) return;
    F(A(bytes, TensorKind::gradient));
  }
};

}  // namespace

bool run_fused_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (op_library(n.kind) != OpLibrary::fused) return false;
  if (run_megatron_moe_backward(rt, n, in, out)) return true;  // graph/ops/ops_megatron_moe.h
  FusedBw b{rt, n};
  const Grad& g = in[0];
  switch (n.kind) {
    case OpKind::fused_layer_norm: {
      if (g.storage == kNoStorage) break;
      const uint32_t gi = b.A(n.size[0]);
      const uint32_t gg = b.A(n.size[1], TensorKind::gradient);
      const uint32_t gb = b.A(n.size[1], TensorKind::gradient);
      const uint32_t pg = b.A(n.size[2]);
      const uint32_t pb = b.A(n.size[2]);
      b.F(pb);
      b.F(pg);
      b.F(gg);  // both go to main_grad
      b.F(gb);
      if (b.needs(0)) out[0] = Grad{gi, false, false};
      else b.F(gi);
      break;
    }
    case OpKind::megatron_linear: {
      if (g.storage == kNoStorage) break;
      const bool row_sp = (n.size[3] & kRowScatterBit) != 0;
      const uint64_t sp_bytes = n.size[3] & ~kRowScatterBit;
      // Row-parallel SP: the grad shard all-gathered (gather_from_sequence_parallel_region).
      const uint32_t gathered = row_sp ? b.A(sp_bytes) : kNoStorage;
      uint32_t gi = kNoStorage;
      if (b.needs(0)) {
        if (!row_sp && sp_bytes != 0) {
          // Column-parallel SP: the full dgrad, reduce-scattered into this rank's shard.
          const uint32_t full = b.A(sp_bytes);
          gi = b.A(n.size[0]);
          b.F(full);
        } else {
          gi = b.A(n.size[0]);  // grad_output @ W
        }
      }
      rt.note_gemm();
      // wgrad GEMM accumulates into main_grad; the dummy grad_weight keeps the hook on
      // the main thread; grad_bias = grad_output.sum(0).
      const uint32_t dummy = b.A(n.size[1], TensorKind::gradient);
      if (n.param >= 0) rt.name_as(dummy, n.param, NameRole::grad);
      const uint32_t gbias = n.size[2] ? b.A(n.size[2], TensorKind::gradient) : kNoStorage;
      b.F(dummy);
      if (gbias != kNoStorage) b.F(gbias);
      if (gathered != kNoStorage) b.F(gathered);
      if (gi != kNoStorage) out[0] = Grad{gi, false, false};
      break;
    }
    case OpKind::sequence_scatter: {
      if (g.storage == kNoStorage) break;
      const uint32_t full = b.A(n.size[0]);  // all-gather of the grad shards
      if (b.needs(0)) out[0] = Grad{full, false, false};
      else b.F(full);
      break;
    }
    case OpKind::qkv_split: {
      // cat(grad_q, grad_k, grad_v) into the mixed layout, then the parts die.
      const uint32_t cat = b.A(n.size[0]);
      if (n.size[2] != 0) {
        b.F(static_cast<uint32_t>(n.size[2] - 1));
        n.size[2] = 0;
      }
      out[0] = Grad{cat, false, false};
      break;
    }
    case OpKind::baddbmm: {
      if (g.storage == kNoStorage) break;
      // grad_q = (grad @ k) * alpha; grad_k = (q^T @ grad) * alpha.
      const uint32_t q0 = b.A(n.size[0]);
      rt.note_gemm();
      const uint32_t gq = b.A(n.size[0]);
      b.F(q0);
      const uint32_t k0 = b.A(n.size[1]);
      const uint32_t gk = b.A(n.size[1]);
      b.F(k0);
      out[0] = Grad{gq, false, false};
      const int32_t split = n.next[0].node;
      if (split >= 0 && rt.node(split).kind == OpKind::qkv_split) {
        rt.node(split).size[2] = static_cast<uint64_t>(gk) + 1;  // travels with grad_q
      } else {
        b.F(gk);
      }
      break;
    }
    case OpKind::fused_softmax:
      if (g.storage == kNoStorage) break;
      rt.retain(g.storage);  // computed in place into the incoming grad
      out[0] = Grad{g.storage, g.is_view, false};
      break;
    case OpKind::dropout:
      if (g.storage == kNoStorage) break;
      out[0] = Grad{b.A(n.size[0]), false, false};  // grad * mask * scale
      break;
    case OpKind::bias_dropout_add: {
      if (g.storage == kNoStorage) break;
      uint32_t gx = b.A(n.size[0]);
      b.to_main_grad(n.size[1]);
      if (b.needs(0)) out[0] = Grad{gx, false, false};
      else b.F(gx);
      if (b.needs(1)) {
        rt.retain(g.storage);  // residual + out: the residual's grad is the grad itself
        out[1] = Grad{g.storage, g.is_view, false};
      }
      break;
    }
    case OpKind::bias_gelu: {
      if (g.storage == kNoStorage) break;
      const uint32_t tmp = b.A(n.size[0]);  // bias_gelu_back; returned for input and bias
      b.to_main_grad(n.size[1]);            // the engine's sum_to for the bias, then the hook
      if (b.needs(0)) out[0] = Grad{tmp, false, false};
      else b.F(tmp);
      break;
    }
    case OpKind::fused_attention: {
      if (g.storage == kNoStorage) break;
      const uint32_t dqkv = b.A(n.size[0]);
      const uint32_t softmax_d = b.A(n.size[1]);
      const uint32_t dq_accum = n.size[2] ? b.A(n.size[2]) : kNoStorage;
      if (dq_accum != kNoStorage) b.F(dq_accum);
      b.F(softmax_d);
      if (b.needs(0)) out[0] = Grad{dqkv, false, false};
      else b.F(dqkv);
      break;
    }
    case OpKind::megatron_embedding: {
      if (g.storage == kNoStorage) break;
      // embedding_dense_backward: grad.contiguous().view(-1, h), new_zeros(V, h), then
      // the sort-based accumulation (sorted and original indices, int64).
      const uint32_t contig = n.size[3] ? b.A(n.size[0]) : kNoStorage;
      const uint32_t gw = b.A(n.size[1], TensorKind::gradient);
      const uint32_t sorted = b.A(n.size[2]);
      const uint32_t orig = b.A(n.size[2]);
      b.F(orig);
      b.F(sorted);
      if (contig != kNoStorage) b.F(contig);
      b.F(gw);  // main_grad.add_(grad); grad = None
      break;
    }
    case OpKind::vocab_parallel_ce: {
      if (g.storage == kNoStorage) break;
      const uint64_t rows = n.size[1];
      const uint32_t arange = b.A(rows * 8);
      const uint32_t as_float = b.A(rows * 4);  // target_mask.float()
      const uint32_t update = b.A(rows * 4);    // 1.0 - that
      b.F(as_float);
      const uint32_t picked = b.A(rows * 4);    // grad_2d[arange, target] -= update
      b.F(picked);
      b.F(update);
      b.F(arange);
      // The grad is the saved fp32 softmax (in place); the engine casts it to the
      // logits' dtype. The fp32 storage dies when the node's saved tensors are released.
      if (b.needs(0)) out[0] = Grad{b.A(n.size[0]), false, false};
      break;
    }
    default:
      break;
  }
  return true;
}

Tensor sequence_scatter(Runtime& rt, const Tensor& x, uint64_t out_bytes) {
  Tensor out = act(rt, out_bytes, OpKind::sequence_scatter);
  if (records(rt, {&x}, false)) {
    const int32_t n = rt.make_node(OpKind::sequence_scatter, {&x});
    rt.node(n).size[0] = x.bytes;
    out.grad_fn = n;
  }
  return out;
}

}  // namespace memsim::graph
