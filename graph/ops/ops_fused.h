// Megatron-LM's fused kernels and custom autograd Functions, as memory events.
//
// These ops differ from the aten ops of graph/ops/ops.h in two ways that matter to memory:
//  1. Fusion: one kernel (or one autograd.Function) replaces several aten ops, so the
//     intermediates never exist and the node saves only what the Function's
//     save_for_backward names (e.g. bias-dropout-add keeps a 1-byte mask, nothing else).
//  2. Parameter gradients never reach AccumulateGrad's .grad for good: Megatron's DDP
//     keeps a persistent main_grad buffer (allocated by the scheduler) and a backward
//     hook adds each produced grad into it and sets param.grad = None. A parameter is
//     therefore passed to these ops as a byte count, not a Tensor: the op records a node
//     whenever grad mode is on and its backward emits the grad it would hand to the hook
//     and frees it at once (main_grad.add_ + grad = None). Weight GEMMs with
//     gradient_accumulation_fusion write straight into main_grad; current Megatron still
//     returns an empty dummy weight grad so the hook runs on the main thread
//     (grad_added_to_main_grad), which is a weight-sized transient.
//
// Sizes are in bytes; `rows` is s*b. Activations are 16-bit except where noted.
#pragma once

#include "graph/runtime.h"

namespace memsim::graph {

// Backward of a fused node (hook of graph::run_backward). Returns false for other kinds.
bool run_fused_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

// apex FusedLayerNormAffineFunction over `rows` rows of `hidden` elements: out (x.bytes)
// then mean and invvar (rows fp32 each). Saves input, mean, invvar (gamma and beta are
// parameter references). Backward: grad_input, grad_gamma, grad_beta, apex's fp32
// part-grad scratch (16 x hidden x 2), then the two parameter grads go to main_grad.
Tensor fused_layer_norm(Runtime& rt, const Tensor& x, uint64_t rows, uint64_t hidden,
                        uint64_t param_elem);

// LinearWithGradAccumulationAndAsyncCommunication (tensor parallel 1): out = x @ W^T
// (out_bytes) and, with add_bias, `out + bias` (a second out_bytes allocation; the GEMM
// result dies). skip_bias_add layers pass add_bias = false and bias_bytes = 0 (their bias
// grad is produced by the fused op that consumes the bias). Saves x only.
struct LinearSpec {
  uint64_t out_bytes = 0;
  uint64_t weight_bytes = 0;
  uint64_t bias_bytes = 0;   // 0: no bias in this Function
  double flops = 0;          // forward GEMM FLOPs
  // Sequence parallel (Megatron --sequence-parallel), 0 otherwise. gather_bytes: a
  // column-parallel linear whose input x is this rank's sequence shard; forward
  // all-gathers it into Megatron's global buffer (the model owns it) and saves only x;
  // backward's dgrad is gather_bytes, reduce-scattered into a new x-sized grad.
  // scatter_bytes: a row-parallel linear whose out_bytes GEMM output is reduce-scattered
  // into a new scatter_bytes tensor (the full one dies); backward all-gathers the
  // incoming grad into a new out_bytes tensor first.
  uint64_t gather_bytes = 0;
  uint64_t scatter_bytes = 0;
  // The weight's parameter id (-1: none): backward's dummy grad_weight (the wgrad itself
  // accumulates into main_grad) is named "grad of <weight>" (program/tensor_names.h).
  int32_t weight = -1;
};
Tensor megatron_linear(Runtime& rt, const Tensor& x, const LinearSpec& spec);

// The fused QKV output [s, b, np, 3*hn] split into q, k, v views (no memory). Autograd
// emulation: q and k share slot 0 of one split node (baddbmm hands it both grads), v
// uses slot 1; the split's backward cats the three grads into one mixed-sized tensor.
struct QkvViews {
  Tensor q, k, v;
};
QkvViews qkv_split(Runtime& rt, const Tensor& mixed);

// torch.baddbmm(buffer, q^T, k, beta=0, alpha=1/norm): a new [b*np, sq, sk] scores tensor
// (the preallocated input buffer is only read). Saves q and k (views of the QKV output,
// so that whole tensor stays alive). Backward: each grad is a bmm then a scale by alpha
// (two allocations, the first dies).
Tensor baddbmm_qk(Runtime& rt, const Tensor& q, const Tensor& k, uint64_t out_bytes,
                  double flops);

// ScaledUpperTriangMaskedSoftmax (causal, fused): a new output; saves it. Backward works
// in place on the incoming grad.
Tensor fused_causal_softmax(Runtime& rt, const Tensor& scores);

// torch.nn.Dropout in training: with p > 0 native_dropout allocates the output then a
// bool mask (1 byte per element) and saves the mask; with p == 0 it returns its input.
Tensor dropout(Runtime& rt, const Tensor& x, uint64_t elems, bool active);

// bias_dropout_add_fused_train (TorchScript-fused): out = residual + dropout(x + bias).
// A new output plus, with dropout active, a bool mask that is the only saved tensor.
// Backward: grad_x (new), the residual gets the incoming grad itself, the bias grad
// (bias_bytes, reduced over rows) goes to main_grad.
Tensor bias_dropout_add(Runtime& rt, const Tensor& x, const Tensor& residual, uint64_t elems,
                        uint64_t bias_bytes, bool dropout_active);

// GeLUFunction (bias_gelu_impl): gelu(x + bias), a new output; saves x (and the bias).
// Backward: one x-sized grad, also returned for the bias and reduced to it by the engine.
Tensor bias_gelu(Runtime& rt, const Tensor& x, uint64_t bias_bytes);

// Fused attention (flash / cuDNN through Transformer Engine, sbhd layout): q, k, v are
// views of `mixed`, out [s, b, h] (out_bytes) is new, the softmax logsumexp is fp32
// (lse_bytes) and, with dropout, a 2 x int64 RNG state. Saves q, k, v, out, lse (and the
// RNG state); no s x s tensor. Backward: dqkv (mixed-sized) plus fp32 scratch.
Tensor fused_attention(Runtime& rt, const Tensor& mixed, uint64_t out_bytes, uint64_t lse_bytes,
                       uint64_t dq_accum_bytes, bool dropout_active, double flops);

// F.embedding(ids, weight): a new output; saves the indices. Backward
// (embedding_dense_backward): a contiguous copy of the grad when it arrives transposed,
// the weight grad (weight_bytes, then handed to main_grad) and sort scratch.
Tensor megatron_embedding(Runtime& rt, const Tensor& ids, uint64_t out_bytes,
                          uint64_t weight_bytes, bool grad_arrives_transposed);

// _VocabParallelCrossEntropy(logits, target) with tensor parallel 1: logits.float() (a
// 4*rows*vocab copy that becomes the softmax in place), small per-row tensors; saves the
// softmax, the target mask and the masked target. Returns the per-token loss (rows fp32).
// Backward: small per-row temporaries, the gradient is the saved softmax itself (in
// place), cast back to the logits' dtype by the engine (a new logits-sized tensor).
Tensor vocab_parallel_cross_entropy(Runtime& rt, const Tensor& logits, uint64_t rows,
                                    uint64_t vocab);

// scatter_to_sequence_parallel_region: this rank's sequence shard as a new contiguous
// out_bytes tensor (saves nothing). Backward all-gathers the grad into a new x-sized one.
Tensor sequence_scatter(Runtime& rt, const Tensor& x, uint64_t out_bytes);

}  // namespace memsim::graph
