#include "graph/ops/ops_megatron_moe.h"

#include <cstdint>
#include <stdexcept>

#include "graph/ops/megatron_global_buffer.h"
#include "graph/ops/ops_megatron_arch.h"
#include "graph/ops/ops_megatron_loss.h"

namespace memsim::graph {

namespace {

Tensor act(Runtime& rt, uint64_t bytes, OpKind k) { return rt.alloc(bytes, TensorKind::activation, k); }

bool records(const Runtime& rt, std::initializer_list<const Tensor*> ins) {
  if (!rt.grad_enabled) return false;
  for (const Tensor* t : ins)
    if (t->requires_grad()) return true;
  return false;
}

}  // namespace

Tensor moe_scatter(Runtime& rt, const Tensor& src, const Tensor& index, uint64_t out_bytes) {
  Tensor zeros = rt.alloc(out_bytes, TensorKind::temporary, OpKind::fill);  // zeros_like
  Tensor out = act(rt, out_bytes, OpKind::moe_scatter);
  zeros.reset();
  if (records(rt, {&src})) {
    const int32_t n = rt.make_node(OpKind::moe_scatter, {&src});
    rt.node(n).size[0] = src.bytes;
    rt.save(n, index);
    out.grad_fn = n;
  }
  return out;
}

// ProcessGroupNCCL's stacked copy of an equal-split tensor list (see seq_gather).
void nccl_flat_transient(Runtime& rt, uint64_t bytes, OpKind k) {
  if (bytes > 0) rt.alloc(bytes, TensorKind::temporary, k).reset();
}

Tensor seq_gather(Runtime& rt, const Tensor& x, uint64_t out_bytes, Tensor* into, uint64_t nccl_flat) {
  Tensor out = into != nullptr ? global_buffer_get(rt, *into, out_bytes) : act(rt, out_bytes, OpKind::seq_gather);
  nccl_flat_transient(rt, nccl_flat, OpKind::seq_gather);
  if (records(rt, {&x})) {
    const int32_t n = rt.make_node(OpKind::seq_gather, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).size[1] = nccl_flat;
    // use_global_buffer: backward's get_tensor looks the buffer up again (Node has no
    // pointer field; its byte counts are 64-bit, so the address fits).
    rt.node(n).size[2] = into != nullptr ? static_cast<uint64_t>(reinterpret_cast<uintptr_t>(into)) : 0;
    out.grad_fn = n;
    out.out_slot = 0;
  }
  return out;
}

Tensor seq_reduce_scatter(Runtime& rt, const Tensor& x, uint64_t out_bytes, uint64_t nccl_flat) {
  Tensor out = act(rt, out_bytes, OpKind::seq_reduce_scatter);
  nccl_flat_transient(rt, nccl_flat, OpKind::seq_reduce_scatter);
  if (records(rt, {&x})) {
    const int32_t n = rt.make_node(OpKind::seq_reduce_scatter, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).size[1] = nccl_flat;
    out.grad_fn = n;
  }
  return out;
}

Tensor all_to_all(Runtime& rt, const Tensor& x, uint64_t out_bytes) {
  Tensor out = act(rt, out_bytes, OpKind::all_to_all);
  if (records(rt, {&x})) {
    const int32_t n = rt.make_node(OpKind::all_to_all, {&x});
    rt.node(n).size[0] = x.bytes;
    out.grad_fn = n;
  }
  return out;
}

Tensor index_select_rows(Runtime& rt, const Tensor& x, const Tensor& index, uint64_t out_bytes) {
  Tensor out = act(rt, out_bytes, OpKind::index_select_rows);
  if (records(rt, {&x})) {
    const int32_t n = rt.make_node(OpKind::index_select_rows, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.save(n, index);
    out.grad_fn = n;
  }
  return out;
}

Tensor masked_select(Runtime& rt, const Tensor& x, const Tensor& mask, uint64_t out_bytes) {
  Tensor out = act(rt, out_bytes, OpKind::masked_select);
  if (records(rt, {&x})) {
    const int32_t n = rt.make_node(OpKind::masked_select, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.save(n, mask);
    out.grad_fn = n;
  }
  return out;
}

void scatter_add_rows(Runtime& rt, Tensor& self, const Tensor& index, const Tensor& src) {
  if (!records(rt, {&self, &src})) return;
  const int32_t n = rt.make_node(OpKind::scatter_add_rows, {&self, &src});
  rt.node(n).size[0] = self.bytes;
  rt.node(n).size[1] = src.bytes;
  rt.save(n, index);
  self.grad_fn = n;
  self.out_slot = 0;
}

Tensor expert_bias_scale(Runtime& rt, const Tensor& probs, uint64_t out_bytes, uint64_t bias_bytes) {
  Tensor out = act(rt, out_bytes, OpKind::expert_bias_scale);
  if (rt.grad_enabled) {  // the bias parameter always needs a grad
    const int32_t n = rt.make_node(OpKind::expert_bias_scale, {&probs});
    rt.node(n).size[0] = out_bytes;
    rt.node(n).size[1] = bias_bytes;
    rt.node(n).size[2] = probs.bytes;
    rt.save(n, probs);
    out.grad_fn = n;
  }
  return out;
}

bool run_megatron_moe_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  auto A = [&](uint64_t bytes, TensorKind kind = TensorKind::temporary) {
    return rt.alloc_raw(bytes, kind, n.kind);
  };
  auto needs = [&](int i) { return i < n.n_next && n.next[i].node >= 0; };
  const Grad& g = in[0];
  switch (n.kind) {
    case OpKind::seq_gather:           // reduce-scatter of the grad
      if (n.size[2] != 0) {
        // use_global_buffer=True: the reduce-scatter writes into the "mpu" buffer (never
        // smaller than the forward's out_bytes by now) and returns a view of it.
        if (g.storage == kNoStorage || !needs(0)) return true;
        if (n.size[1] > 0) throw std::logic_error("seq_gather: split sizes with the global buffer");
        Tensor view = global_buffer_get(rt, *reinterpret_cast<Tensor*>(static_cast<uintptr_t>(n.size[2])), n.size[0]);
        rt.retain(view.storage);  // the grad's own reference; `view` drops its one
        out[0] = Grad{view.storage, true, false};
        return true;
      }
      [[fallthrough]];
    case OpKind::seq_reduce_scatter:   // all-gather of the grad
      // With split sizes (size[1] > 0) ProcessGroupNCCL's stacked list copy follows the
      // output and dies with the collective.
      if (g.storage != kNoStorage && needs(0)) {
        out[0] = Grad{A(n.size[0]), false, false};
        if (n.size[1] > 0) rt.release(A(n.size[1]));
      }
      return true;
    case OpKind::moe_scatter:          // src: grad.gather(1, index)
    case OpKind::all_to_all:           // the reverse all-to-all
    case OpKind::index_select_rows:    // zeros(x).index_add_(0, index, grad)
    case OpKind::masked_select:        // zeros_like(x).masked_scatter_(mask, grad)
      if (g.storage != kNoStorage && needs(0)) out[0] = Grad{A(n.size[0]), false, false};
      return true;
    case OpKind::scatter_add_rows:
      if (g.storage == kNoStorage) return true;
      if (needs(0)) {
        rt.retain(g.storage);
        out[0] = Grad{g.storage, g.is_view, false};
      }
      if (needs(1)) out[1] = Grad{A(n.size[1]), false, false};  // grad.gather(0, index)
      return true;
    case OpKind::expert_bias_scale: {
      if (g.storage == kNoStorage) return true;
      // MulBackward0 for the bias (grad * probs), the engine's sum_to, the DDP hook.
      const uint32_t t = A(n.size[0]);
      const uint32_t bias = A(n.size[1], TensorKind::gradient);
      rt.release(t);
      rt.release(bias);
      if (needs(0)) {  // grad * bias, summed to the probabilities' [n, 1]
        const uint32_t p = A(n.size[0]);
        const uint32_t r = A(n.size[2]);
        rt.release(p);
        out[0] = Grad{r, false, false};
      }
      return true;
    }
    default:
      // SwiGLU / GQA attention and the router losses (issue #15, Megatron part 2).
      return run_megatron_arch_backward(rt, n, in, out) || run_megatron_loss_backward(rt, n, in, out);
  }
}

}  // namespace memsim::graph
