// Context parallelism's ring attention (parallel.context N; scenario/context_parallel_keys.h):
// the flash SDPA call of one rank run the way torch's context_parallel runs it, on the
// rank's local (B, H, L = S/N, hd) q, k, v.
//
// Modelled from pytorch/pytorch torch/distributed/tensor/experimental/_context_parallel/
// _attention.py (the stored snapshot 09b101c5; the same code as the v2.9-v2.11 releases'
// file of that path): context_parallel() (MONKEY_PATCH: F.scaled_dot_product_attention
// wraps q, k, v as DTensors sharded on dim 2, so autograd sees one
// _scaled_dot_product_flash_attention node above DTensor's dispatch), _sdpa_handler,
// _templated_ring_attention, _SDPAMerger, _AllGatherRotater / _AllToAllRotater,
// _templated_ring_attention_backward, _partial_update; the head-tail load balancer is on
// (enable_load_balance, torchtitan's default): every step after the first runs without the
// causal mask on half of q (i > rank) or half of k/v (i <= rank).
//
// Notation: X = B*H*L*hd*e (one local q, k or v; e the compute dtype), Xf the same in fp32,
// l = B*H*L*4 (the fp32 logsumexp), N the ring size, r this rank. Everything below runs
// under the autograd node (DTensor's handler), so every intermediate is a plain temporary.
//
// Forward (what _templated_ring_attention allocates, in its order):
//  - key.contiguous(), value.contiguous(): X each when k / v are not contiguous as
//    (B,H,L,hd) (RingSpec::kv_contiguous false: a transposed (B,S,H,hd) projection, or one
//    KV head expanded); alive until step 1 rebinds k and v. repeat_kv's expand + reshape
//    copies are contiguous already: no copy (the H200 traces of tools/gpu/measure_cp.py,
//    kv_heads 4 of 16, show none).
//  - per step i < N-1 the send buffer cat([k, v]) (2X). allgather (torch's default): at i = 0
//    the all-gather output (2X*N, held by the rotater to the end) and the cat kept by the
//    collective until the wait at step 1; at later steps the cat dies at once (next_kv = None).
//    alltoall: each step permute_tensor's output (2X), the cat kept until the next wait; the
//    received buffer lives while k and v view it.
//  - the kernel: out (B*H*Lq*hd*e) and logsumexp (B*H*Lq*4), Lq = L at step 0 and for
//    i <= r, L/2 for i > r. The previous step's out (and its logsumexp, unless the merger
//    holds it) dies when the loop rebinds the names.
//  - _SDPAMerger.step: out.to(float32) (fp32 copy); the first step's fp32 out and logsumexp
//    become the accumulators; later steps: block_lse - lse (l), its sigmoid (l), out -
//    block_out (Xf), the product (Xf), the new out (Xf); lse - block_lse (l), its logsigmoid
//    (l), the new lse (l); each temporary dies when the expression consumed it. With i > r
//    all of these are half size and _partial_update's torch.cat rebuilds a full Xf / l
//    accumulator.
//  - results(): the fp32 accumulator .to(e): the autograd output (X); the logsumexp is the
//    fp32 accumulator itself (.to(float32) is a no-op). The accumulators, the last block
//    results and the rotater's buffers die when the function returns.
// The output's layout (ring_output_contiguous): the one-GPU kernel returns a (B,H,L,hd)
// view of a (B,L,H,hd) buffer, so the model's transpose(1, 2).contiguous() is a no-op. A
// rank whose last step is partial (r < N-1; rank 0 always) ends with _partial_update's
// torch.cat, which makes a contiguous (B,H,L,hd) accumulator, and .to(e) keeps those
// strides: the model's transpose(1, 2).contiguous() then copies (X, saved by o_proj in
// place of the kernel output's view), and the flash backward's out.contiguous() copies
// (below). (Measured: tools/gpu/measure_cp.py's traces, torch 2.11, one X per layer
// allocated at the model's `.contiguous()` line and kept to backward.) Rank N-1 merges
// out-of-place (out - sigmoid(..) * (out - block_out)), whose TensorIterator output
// follows the first operand's (B,L,H,hd) strides: the kernel's layout (a reading).
// Rank 0's cat in flight: under the fake process group of the measurement the collective
// holds nothing (FakeProcessGroup completes the work at once) and the cat dies at the
// call; memsim keeps it to the wait, ProcessGroupNCCL's stash of an async collective's
// input (a reading for real jobs; docs/torchtitan-recipes.md).
// Saved for backward: q, k, v (the inputs), the merged out and the logsumexp: the same as
// the one-GPU SDPA node at length L.
//
// Backward (_templated_ring_attention_backward):
//  - grad_query / grad_key / grad_value = zeros_like(.., float32): Xf each; key.contiguous(),
//    value.contiguous(): X each (until step 1) unless kv_contiguous, as in the forward.
//  - K/V rotation as in the forward (method parallel.context_rotate), except that the cat
//    is kept by `next_kv` until the next step's cat (the call's result is not assigned).
//  - dK/dV always rotate with all-to-all: from step 1 the received buffer (2Xf) replaces
//    grad_key / grad_value (views of it; the zeros die at step 1); for i <= r
//    _partial_update's cats make new Xf grad_key and grad_value; each step the send cat
//    (2Xf, kept by `next_grad_kv` and the collective until the next wait) and the
//    permute_tensor output (2Xf).
//  - the kernel per step: dq, dk, dv at the step's shapes (e), and the flash backward's
//    softmax_d / dq_accum scratch (as graph/ops/ops_nn.h sdpa_flash). Before them
//    _flash_attention_backward's grad_out.contiguous() and out.contiguous() on the
//    (B,L,H,hd) transposes: grad_out (the (B,L,H,hd)-laid gradient of the model's
//    transpose) copies only its i > r half when B > 1 (X/2); out copies when it is not in
//    the kernel's layout: with a contiguous merged output (ring_output_contiguous) the full
//    out when H > 1 (X) and the i > r half when B*H > 1 (X/2), else (rank N-1) the half
//    when B > 1. For i > r the logsumexp half is made contiguous (l/2) when B*H > 1.
//    i > r: grad_query = _partial_update(...) (a new Xf); i <= r: in place.
//  - the end: grad_query.to(e) (X) and the last received dK/dV .to(e) (2X): dq, and dk / dv
//    as two views of one buffer.
// Left out: NCCL's internal buffers; the collectives' own streams (every buffer is on the
// default stream: functional collectives allocate their outputs on the current stream);
// the cuDNN and mem-efficient kernels (scenario keys refuse them); dropout.
#pragma once

#include "graph/ops/ops_nn.h"
#include "graph/runtime.h"

namespace memsim::graph {

struct RingSpec {
  uint32_t degree = 1;    // N: the context-parallel group size
  uint32_t rank = 0;      // r: this rank's place in it (the load balancer's chunks r, 2N-1-r)
  bool alltoall = false;  // parallel.context_rotate: alltoall (else allgather)
  // k and v arrive contiguous as (B,H,L,hd) (repeat_kv's copies): key.contiguous() and
  // value.contiguous() are no-ops in forward and backward.
  bool kv_contiguous = false;
};

// Whether this rank's merged output is a contiguous (B,H,L,hd) tensor (its last step is a
// partial one: r < N-1) rather than the kernel's (B,L,H,hd) layout: then the model's
// `attn_output.transpose(1, 2).contiguous()` copies it.
inline bool ring_output_contiguous(const RingSpec& ring) { return ring.rank + 1 < ring.degree; }

// FLOPs of one rank's ring forward in memsim's SDPA convention (4*B*H*Lq*Lk*hd per kernel
// call, the causal mask not halved): step 0 on L x L, every later step on L x L/2.
double ring_forward_flops(const SdpaShape& local, const RingSpec& ring);

// F.scaled_dot_product_attention(q, k, v, is_causal=True) under context_parallel on the
// flash backend. `local` is the rank's shape (seq = L). Returns the merged output (X,
// input dtype). Its autograd node is the _scaled_dot_product_flash_attention node
// (OpKind::sdpa_flash, as torch records it above DTensor's dispatch), marked as a ring node:
// its backward is run_ring_backward's, not the one-GPU kernel's.
Tensor sdpa_ring_flash(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& v,
                       const SdpaShape& local, const RingSpec& ring);

// Backward of a ring node (graph/ops/ops.cpp run_backward, ahead of graph/ops/ops_nn.h).
bool run_ring_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

}  // namespace memsim::graph
