// graph/ IR: the vocabulary shared by the op library, the autograd emulation and the
// model-family builders.
//
// DESIGN NOTE (read this first). memsim's graph layer is a *symbolic eager PyTorch*:
//  - A builder (graph/cs336.h, later hf-gpt2 / hf-llama / megatron) is written like the
//    model's Python forward, one op call per aten op, against graph::Runtime.
//  - Every op call emits the allocator requests PyTorch eager would make, in the same
//    order, straight into a sim::Program (no graph is materialised first; the Program
//    IS the op-by-op trace).
//  - Storages are reference counted exactly like c10::StorageImpl. References are held
//    by (a) graph::Tensor handles, which stand for Python names and temporaries: C++
//    scopes mirror Python lifetimes, and builders reset() a handle where Python rebinds
//    or drops a name; (b) autograd saved tensors (SavedVariable); (c) gradient buffers.
//    A storage is freed when its count reaches 0, so every free lands where PyTorch's
//    would (aten-saved-tensors.md §A.1).
//  - With grad mode on, each differentiable op records one autograd Node (OpKind +
//    byte sizes + saved storages + next edges). Runtime::backward() then emulates the
//    autograd engine: highest sequence number first, saved tensors released after each
//    node, grads accumulated in place or out of place like InputBuffer::accumulate,
//    AccumulateGrad stealing or cloning into .grad (aten-saved-tensors.md §E).
//  - Ops are typed (OpKind) and every event carries phase, layer, Module and a region
//    id, so a checkpointing pass can re-invoke a layer's forward emitter, and a numeric
//    executor can interpret the same op stream.
#pragma once

#include <cstdint>

namespace memsim::graph {

// Element types of device tensors.
enum class ScalarType : uint8_t { f32, bf16, f16, i64, b8 };
inline constexpr uint64_t element_size(ScalarType t) {
  switch (t) {
    case ScalarType::f32: return 4;
    case ScalarType::bf16: return 2;
    case ScalarType::f16: return 2;
    case ScalarType::i64: return 8;
    case ScalarType::b8: return 1;
  }
  return 4;
}

// Which part of the model an op belongs to (for reports and checkpoint policies).
enum class Module : uint8_t { none, embedding, attention, mlp, norm, head, loss, optimizer };
inline constexpr int kModuleCount = 8;
const char* to_string(Module m);

// The op library. Forward semantics and backward recipes are in graph/ops.cpp; each
// enumerator names the aten op (forward) and its autograd node (backward).
enum class OpKind : uint8_t {
  // leaves / bookkeeping
  accumulate_grad,  // AccumulateGrad: steals or clones the incoming grad into .grad
  // elementwise / reductions
  pow2,         // pow.Tensor_Scalar(x, 2): saves x
  mean_dim,     // mean(-1, keepdim): saves nothing; backward materialises input size
  mean_all,     // mean(): scalar
  add_scalar,   // x + python scalar: pass-through backward
  add,          // add.Tensor, same shapes: pass-through to both inputs
  sub,          // sub.Tensor, other may broadcast (reduced): other gets -grad (+sum_to)
  mul,          // mul.Tensor, either side may broadcast
  div,          // div.Tensor(self, other), other may broadcast
  div_scalar,   // x / python scalar
  rsqrt,        // saves result
  sigmoid,      // saves result
  exp,          // saves result
  log,          // saves self
  neg,          // saves nothing
  max_dim,      // max.dim: values + int64 indices; saves indices
  sum_dim,      // sum(-1, keepdim): backward is an expand (view)
  where_scalar, // where(mask, x, python scalar): saves mask
  gather,       // gather(self, -1, idx): saves self (!) and idx
  // data movement
  clone,        // reshape that cannot be a view: clone + _unsafe_view
  view,         // view/permute/reshape-alias; backward copies when the grad is not viewable
  rope,         // CS336 RotaryEmbedding.forward, one composite node (cs336-model.md §2.4)
  // matmuls
  bmm,          // bmm(self, mat2): saves both
  linear,       // einops.einsum(x, W) = views + bmm; weight grad reaches AccumulateGrad transposed
  embedding,    // weight[ids]: aten::index; saves ids
  log_softmax,  // _log_softmax: saves result
  nll_loss,     // nll_loss_forward: output + total_weight; saves self, target, total_weight
  // Hugging Face families (graph/ops_nn.h; backward recipes in graph/ops_nn.cpp)
  addmm, mm_linear, layer_norm, embedding_nn, softmax, tanh, silu, mul_scalar, add_bcast,
  to_copy, native_dropout, slice_seq, expand_clone, tied_sum, rope_hf, sdpa_flash,
  sdpa_efficient, split_qkv,
  // no-grad helpers (never recorded as nodes)
  arange, compare, scalar_tensor, fill, optimizer_math, other,
  // Megatron-LM's fused kernels and autograd Functions (graph/ops_fused.h)
  fused_layer_norm,   // apex FusedLayerNormAffineFunction: saves input, mean, invvar
  megatron_linear,    // LinearWithGradAccumulationAndAsyncCommunication: saves input
  qkv_split,          // views of the fused QKV output; backward cats the q, k, v grads
  baddbmm,            // QK^T into a new scores tensor: saves q and k
  fused_softmax,      // scaled_upper_triang_masked_softmax: saves its result
  dropout,            // native_dropout: output + bool mask; saves the mask
  bias_dropout_add,   // jit-fused bias + dropout + residual add: saves the mask
  bias_gelu,          // GeLUFunction (fused bias + gelu): saves its input
  fused_attention,    // flash / cuDNN attention: saves q, k, v, out, softmax lse
  megatron_embedding, // F.embedding whose weight grad goes to main_grad
  vocab_parallel_ce,  // _VocabParallelCrossEntropy: saves the fp32 softmax
  autocast_copy,      // _to_copy made by autocast: ToCopyBackward0 casts the grad back
  grad_cast,          // names the engine's validate_outputs dtype cast of a grad (no node)
  rope_autocast,      // CS336 RoPE on a bf16/fp16 input (fp32 products; graph/autocast.h)
  // bitsandbytes (graph/ops_lora.h)
  matmul_4bit,        // MatMul4Bit: dequantise the NF4 weight, linear; saves nothing
  rope_hf_autocast,   // HF apply_rotary_pos_emb on a bf16/fp16 input with fp32 cos/sin
  // Megatron sequence parallelism (graph/ops_fused.h)
  sequence_scatter,   // _ScatterToSequenceParallelRegion: this rank's contiguous shard
  // indexing (graph/ops_nn.h)
  select_dim,         // x.select(dim, i), a view; SelectBackward0 = zeros(input) + copy
  // activations (graph/ops_nn.h)
  gelu,               // F.gelu (exact or approximate='tanh'): saves self
  cat2,               // torch.cat((a, b), -1): new; CatBackward0 hands back views of the grad
  chunk2,             // x.chunk(2, -1): two views; SplitBackward0 cats the grads (new, x)
};
inline constexpr int kOpKindCount = static_cast<int>(OpKind::chunk2) + 1;
const char* forward_name(OpKind k);   // aten op name, e.g. "bmm"
const char* backward_name(OpKind k);  // autograd node name, e.g. "BmmBackward0"

}  // namespace memsim::graph
