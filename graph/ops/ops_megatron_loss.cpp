#include "graph/ops/ops_megatron_loss.h"

namespace memsim::graph {

namespace {

Tensor act(Runtime& rt, uint64_t bytes, OpKind k) { return rt.alloc(bytes, TensorKind::activation, k); }
Tensor tmp(Runtime& rt, uint64_t bytes, OpKind k) { return rt.alloc(bytes, TensorKind::temporary, k); }

bool records(const Runtime& rt, std::initializer_list<const Tensor*> ins) {
  if (!rt.grad_enabled) return false;
  for (const Tensor* t : ins)
    if (t->requires_grad()) return true;
  return false;
}

}  // namespace

Tensor logsumexp_rows(Runtime& rt, const Tensor& x, uint64_t rows, uint64_t elem) {
  Tensor result;
  {
    Tensor maxes = tmp(rt, rows * elem, OpKind::logsumexp_rows);  // amax(self, -1, True)
    {
      Tensor a = tmp(rt, rows * elem, OpKind::logsumexp_rows);     // maxes.abs()
      Tensor inf = tmp(rt, rows, OpKind::logsumexp_rows);          // == INFINITY (bool)
    }                                                              // masked_fill_ in place
    Tensor shifted = tmp(rt, x.bytes, OpKind::logsumexp_rows);     // (self - maxes).exp_()
    result = act(rt, rows * elem, OpKind::logsumexp_rows);         // sum, log_, add_ in place
  }
  rt.add_flops_forward(0, static_cast<double>(2 * x.bytes + result.bytes));
  if (records(rt, {&x})) {
    const int32_t n = rt.make_node(OpKind::logsumexp_rows, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.save(n, x);
    rt.save(n, result);
    result.grad_fn = n;
  }
  return result;
}

Tensor switch_aux_loss(Runtime& rt, const Tensor& scores, const Tensor& tokens_per_expert,
                       uint64_t experts) {
  Tensor loss;
  {
    Tensor agg = tmp(rt, experts * 4, OpKind::switch_aux_loss);   // probs.sum(dim=0)
    Tensor prod = tmp(rt, experts * 4, OpKind::switch_aux_loss);  // * tokens_per_expert
    Tensor total = tmp(rt, 4, OpKind::switch_aux_loss);           // torch.sum
    loss = act(rt, 4, OpKind::switch_aux_loss);                   // * coefficient
  }
  if (records(rt, {&scores})) {
    const int32_t n = rt.make_node(OpKind::switch_aux_loss, {&scores});
    rt.node(n).size[0] = experts * 4;
    rt.save(n, tokens_per_expert);
    loss.grad_fn = n;
  }
  return loss;
}

Tensor aux_loss_scaler(Runtime& rt, const Tensor& x, const Tensor& loss) {
  Tensor out = rt.view_of(x, x.bytes);
  if (records(rt, {&x, &loss})) {
    const int32_t n = rt.make_node(OpKind::aux_loss_scaler, {&x, &loss});
    rt.node(n).size[0] = loss.bytes;
    rt.save(n, loss);
    out.grad_fn = n;
    out.out_slot = 0;
  }
  return out;
}

bool run_megatron_loss_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  auto A = [&](uint64_t bytes) { return rt.alloc_raw(bytes, TensorKind::temporary, n.kind); };
  auto needs = [&](int i) { return i < n.n_next && n.next[i].node >= 0; };
  const Grad& g = in[0];
  switch (n.kind) {
    case OpKind::logsumexp_rows: {
      if (g.storage == kNoStorage || !needs(0)) return true;
      const uint32_t diff = A(n.size[0]);  // self - result
      const uint32_t e = A(n.size[0]);     // .exp()
      rt.release(diff);
      const uint32_t r = A(n.size[0]);     // grad * that
      rt.release(e);
      out[0] = Grad{r, false, false};
      return true;
    }
    case OpKind::switch_aux_loss: {
      if (g.storage == kNoStorage || !needs(0)) return true;
      const uint32_t s = A(4);             // MulBackward0 of the coefficient
      const uint32_t per = A(n.size[0]);   // SumBackward0 expands (a view); * tokens_per_expert
      rt.release(s);
      out[0] = Grad{per, true, false};     // SumBackward1: expand over the tokens (a view)
      return true;
    }
    case OpKind::aux_loss_scaler: {
      if (g.storage != kNoStorage && needs(0)) {
        rt.retain(g.storage);
        out[0] = Grad{g.storage, g.is_view, false};
      }
      if (needs(1)) {
        const uint32_t ones = A(n.size[0]);  // torch.ones_like(aux_loss)
        const uint32_t scaled = A(n.size[0]);  // * main_loss_backward_scale
        rt.release(ones);
        out[1] = Grad{scaled, false, false};
      }
      return true;
    }
    default:
      return false;
  }
}

}  // namespace memsim::graph
