// Helpers shared by the op libraries (graph/ops/ops.cpp, graph/ops/ops_nn.cpp): the pieces of
// recording an aten op that every op does the same way. Internal to graph/.
#pragma once

#include <initializer_list>

#include "graph/checkpoint.h"
#include "graph/ops/cuda_reduce.h"
#include "graph/runtime.h"

namespace memsim::graph::detail {

// Numeric mode (graph/numeric/numeric.h): runs op k's forward kernel on the freshly allocated
// outputs. Called right after the outputs are allocated, before the node saves anything
// (a checkpoint re-run may stop at a save). Out of line: ops.cpp stays free of Eigen.
void numeric_forward_impl(Runtime& rt, OpKind k, std::initializer_list<const Tensor*> in,
                          std::initializer_list<const Tensor*> out);
inline void numeric_forward(Runtime& rt, OpKind k, std::initializer_list<const Tensor*> in,
                            std::initializer_list<const Tensor*> out) {
  if (rt.numeric != nullptr) numeric_forward_impl(rt, k, in, out);
}

// Selective checkpointing (graph/checkpoint.h): an op the policy may save calls
// sac_reused before allocating its outputs (true: a re-run got the forward's cached
// outputs, so the op allocates and runs nothing) and sac_cache right after allocating
// them (the forward of a checkpointed region caches them if the policy saves the call).
inline bool sac_reused(Runtime& rt, OpKind k, std::initializer_list<Tensor*> outs) {
  return rt.checkpoint != nullptr && rt.checkpoint->sac_reused(k, outs);
}
inline void sac_cache(Runtime& rt, OpKind k, std::initializer_list<const Tensor*> outs) {
  if (rt.checkpoint != nullptr) rt.checkpoint->sac_cache(k, outs);
}

// Whether an op records an autograd node: grad mode is on and some input needs a grad.
inline bool wants_grad(const Runtime& rt, std::initializer_list<const Tensor*> ins) {
  if (!rt.grad_enabled) return false;
  for (const Tensor* t : ins)
    if (t->requires_grad()) return true;
  return false;
}

// A forward output: a new activation storage made by op `k`.
inline Tensor out_tensor(Runtime& rt, uint64_t bytes, OpKind k) {
  return rt.alloc(bytes, TensorKind::activation, k);
}

// Products (mul, mm, bmm, addmm; derivatives.yaml): each operand's grad needs the other
// operand, so `q` is saved when `p` needs a grad, then `p` when `q` does. The order of
// the two saves is the order autograd releases them, so callers keep theirs.
inline void save_cross(Runtime& rt, int32_t node, const Tensor& p, const Tensor& q) {
  if (p.requires_grad()) rt.save(node, q);
  if (q.requires_grad()) rt.save(node, p);
}

// A grad summed over the leading dim of a (rows, cols) tensor (a broadcast weight's or a
// bias's): CUDA's reduction kernel may stage fp32 partials and semaphores in global
// memory for its duration (graph/ops/cuda_reduce.h). It vectorises 4 outputs whatever the
// dtype, so the config is fp32's (bf16 weights: the same 32 MiB + 32 B on the H100
// trace). Emitted by backward op `op`; nothing without kernel scratch (a CPU run).
inline void outer_reduce_staging(Runtime& rt, uint64_t rows, uint64_t cols, OpKind op) {
  if (!rt.kernel_scratch) return;
  const ReduceScratch s = outer_reduce_scratch(rows, cols, 4);
  if (s.global_bytes == 0) return;
  const uint32_t staging = rt.grad_alloc(s.global_bytes, op);
  rt.release(rt.grad_alloc(s.semaphore_bytes, op));
  rt.release(staging);
}

// Backward FLOPs of a matmul: one forward's worth per operand that needs a grad.
inline double matmul_backward_flops(const Tensor& a, const Tensor& b, double forward_flops) {
  return (a.requires_grad() ? forward_flops : 0) + (b.requires_grad() ? forward_flops : 0);
}
// Its bytes for the time model: each operand's grad is one GEMM that reads the output's
// grad and the other operand and writes a grad of the operand's size, as many bytes as
// the forward GEMM's (a + b + out).
inline float matmul_backward_bytes(const Tensor& a, const Tensor& b, double forward_bytes) {
  return static_cast<float>((a.requires_grad() ? forward_bytes : 0) +
                            (b.requires_grad() ? forward_bytes : 0));
}

}  // namespace memsim::graph::detail
