// Node sizes: liger_flce [0] grad_input bytes [1] grad_weight bytes (0: none).
// Saved: grad_input, then grad_weight when there is one.
#include "graph/ops/ops_liger.h"

#include <algorithm>

#include "graph/ops/op_helpers.h"

namespace memsim::graph {

namespace {
uint64_t cdiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
uint64_t next_power_of_2(uint64_t x) {
  uint64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}
}  // namespace

uint64_t liger_chunk_rows(uint64_t rows, uint64_t hidden, uint64_t vocab) {
  const uint64_t inc_factor = cdiv(vocab, hidden);
  return std::min(next_power_of_2(cdiv(rows, inc_factor)), rows);
}

Tensor liger_fused_linear_cross_entropy(Runtime& rt, const Tensor& x, const Tensor& w,
                                        const Tensor& target, const LigerShape& s) {
  const OpKind k = OpKind::liger_flce;
  const bool weight_grad = rt.grad_enabled && w.requires_grad();
  const bool input_grad = rt.grad_enabled && x.requires_grad();
  const uint64_t chunk = liger_chunk_rows(s.rows, s.hidden, s.vocab);
  const uint64_t chunks = cdiv(s.rows, chunk);
  // input_requires_grad decides whether any grad buffer exists (grad_weight too).
  Tensor grad_input = rt.alloc(s.rows * s.hidden * s.in_elem, TensorKind::activation, k);
  Tensor grad_weight;
  if (input_grad && weight_grad)
    grad_weight = rt.alloc(s.vocab * s.hidden * s.w_elem, TensorKind::gradient, k);
  Tensor loss_1d = rt.alloc(s.rows * 4, TensorKind::temporary, k);
  Tensor target_mask = rt.alloc(s.rows, TensorKind::temporary, k);
  rt.release(rt.alloc_raw(8, TensorKind::temporary, k));  // target_mask.sum().item()
  Tensor logits_storage = rt.alloc(chunk * s.vocab * s.in_elem, TensorKind::temporary, k);
  const double gemm = 2.0 * static_cast<double>(s.rows) * static_cast<double>(s.hidden) *
                      static_cast<double>(s.vocab);
  for (uint64_t c = 0; c < chunks; ++c) {
    rt.note_gemm();  // mm(_input_chunk, weight.t(), out=logits_chunk)
    if (!input_grad) continue;
    rt.note_gemm();  // mm(grad_logits_chunk, weight, out=grad_input[start:end])
    if (!grad_weight.defined()) continue;
    rt.note_gemm();
    // fp32 accumulator with fp32 grad_logits: neither addmm(out=...) path applies.
    if (s.w_elem == 4) rt.release(rt.alloc_raw(s.vocab * s.hidden * 4, TensorKind::temporary, k));
  }
  {
    // Time model: each of the (up to) three GEMMs reads the input or the logits' grad and
    // the weight and writes logits-sized or operand-sized results; the in-place softmax
    // and its grad read and write the logits once more.
    const double gemms = 1.0 + (input_grad ? 1.0 : 0.0) + (grad_weight.defined() ? 1.0 : 0.0);
    const double logits = static_cast<double>(s.rows * s.vocab * s.in_elem);
    const double io = static_cast<double>(s.rows * s.hidden * s.in_elem + s.vocab * s.hidden * s.w_elem);
    rt.add_flops_forward(gemm * gemms, gemms * (io + logits) + 2 * logits);
  }
  logits_storage.reset();                                   // del logits_storage
  Tensor loss = rt.alloc(4, TensorKind::loss, k);           // torch.sum(loss_1d)
  // fused_linear_cross_entropy_forward returns: its locals die in order.
  loss_1d.reset();
  target_mask.reset();
  if (input_grad || weight_grad) {
    const int32_t n = rt.make_node(k, {&x, &w});
    Node& node = rt.node(n);
    node.size[0] = grad_input.bytes;
    node.size[1] = grad_weight.defined() ? grad_weight.bytes : 0;
    rt.save(n, grad_input);
    if (grad_weight.defined()) rt.save(n, grad_weight);
    loss.grad_fn = n;
  }
  (void)target;
  return loss;
}

bool run_liger_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (op_library(n.kind) != OpLibrary::liger) return false;
  if (in[0].storage == kNoStorage) return true;
  // torch.equal(grad_output, torch.tensor(1.0, device=...)): cuda_equal's eq(...).all().
  const uint32_t one = rt.grad_alloc(4, n.kind);
  const uint32_t eq = rt.grad_alloc(1, n.kind);
  const uint32_t all = rt.grad_alloc(1, n.kind);
  rt.release(all);
  rt.release(eq);
  rt.release(one);
  // grad_output is 1.0 (loss.backward() on this loss): no rescaling. The saved buffers
  // are the grads; the engine releases the saved variables before delivering them.
  const uint32_t gi = rt.saved_storage(n, 0);
  if (n.n_next > 0 && n.next[0].node >= 0 && gi != kNoStorage) {
    rt.retain(gi);
    out[0] = Grad{gi, false, false};
  }
  const uint32_t gw = n.size[1] != 0 ? rt.saved_storage(n, 1) : kNoStorage;
  if (n.n_next > 1 && n.next[1].node >= 0 && gw != kNoStorage) {
    rt.retain(gw);
    out[1] = Grad{gw, false, false};
  }
  return true;
}

}  // namespace memsim::graph
