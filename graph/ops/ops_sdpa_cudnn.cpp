// SDPA's cuDNN backend: forward allocations and the backward recipe (contract and the traces
// it was read from: graph/ops/ops_sdpa_cudnn.h).
#include "graph/ops/ops_sdpa_cudnn.h"

#include "graph/ops/op_helpers.h"

namespace memsim::graph {

namespace {

// Node sizes: [0] q, [1] k, [2] v bytes, [3] the backward workspace's bytes.
uint64_t backward_workspace(const SdpaShape& s) {
  const uint64_t bhsd = s.batch * s.heads * s.seq * s.head_dim;
  const bool grouped = s.kv_heads != 0 && s.kv_heads < s.heads;
  return bhsd * 4 + (grouped ? 2 * bhsd * s.elem : 0) + s.batch * s.heads * s.seq * 4 + 256;
}

constexpr uint64_t kForwardWorkspace = 256;  // cuDNN's forward workspace, every traced shape
constexpr uint64_t kPhiloxBytes = 8;         // one int64 element each: seed, offset

}  // namespace

Tensor sdpa_cudnn(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& v,
                  const SdpaShape& s, double flops) {
  const OpKind kind = OpKind::sdpa_cudnn;
  const bool grad = detail::wants_grad(rt, {&q, &k, &v});
  // _scaled_dot_product_cudnn_attention_cuda: the philox seed and offset first (device
  // tensors, also without dropout), then run_cudnn_SDP_fprop's output and statistics.
  Tensor seed = detail::out_tensor(rt, kPhiloxBytes, kind);
  Tensor offset = detail::out_tensor(rt, kPhiloxBytes, kind);
  Tensor out = detail::out_tensor(rt, s.batch * s.heads * s.seq * s.head_dim * s.elem, kind);
  Tensor lse;
  if (grad) lse = detail::out_tensor(rt, s.batch * s.heads * s.seq * 4, kind);
  { Tensor ws = rt.alloc(kForwardWorkspace, TensorKind::temporary, kind); }  // freed on return
  rt.add_flops_forward(flops, static_cast<double>(q.bytes + k.bytes + v.bytes + out.bytes +
                                                  (lse.defined() ? lse.bytes : 0)));
  if (grad) {
    const int32_t n = rt.make_node(kind, {&q, &k, &v});
    Node& node = rt.node(n);
    node.size[0] = q.bytes;
    node.size[1] = k.bytes;
    node.size[2] = v.bytes;
    node.size[3] = backward_workspace(s);
    node.flops = 2.5 * flops;  // dQ, dK, dV plus the recomputed scores
    node.gemm_bytes = static_cast<float>(2 * (q.bytes + k.bytes + v.bytes) + 2 * out.bytes + lse.bytes);
    // ScaledDotProductCudnnAttentionBackward0's saved variables; the traces free them after
    // the backward in this order's neighbourhood (k, q, v, lse, out, offset, seed).
    rt.save(n, q);
    rt.save(n, k);
    rt.save(n, v);
    rt.save(n, out);
    rt.save(n, lse);
    rt.save(n, seed);
    rt.save(n, offset);
    out.grad_fn = n;
  }
  return out;  // without grad the seed and offset die here
}

bool run_sdpa_cudnn_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (n.kind != OpKind::sdpa_cudnn) return false;
  if (in[0].storage == kNoStorage) return true;
  // _scaled_dot_product_cudnn_attention_backward_cuda: dq, dk, dv shaped like q, k, v
  // (KV heads for grouped k/v), then run_cudnn_SDP_bprop's workspace.
  const uint32_t dq = rt.alloc_raw(n.size[0], TensorKind::temporary, n.kind);
  const uint32_t dk = rt.alloc_raw(n.size[1], TensorKind::temporary, n.kind);
  const uint32_t dv = rt.alloc_raw(n.size[2], TensorKind::temporary, n.kind);
  rt.release(rt.alloc_raw(n.size[3], TensorKind::temporary, n.kind));
  out[0] = Grad{dq, false, false};
  out[1] = Grad{dk, false, false};
  out[2] = Grad{dv, false, false};
  return true;
}

}  // namespace memsim::graph
