// The op library: one function per aten op, with PyTorch eager semantics.
//
// Each forward function emits the op's allocations (activation outputs, short-lived
// temporaries) through the Runtime and, when grad mode is on and an input requires
// grad, records an autograd Node that saves exactly what derivatives.yaml saves
// (aten-saved-tensors.md §B). run_backward() replays that node's backward allocations
// in PyTorch's order (checked against the CS336 snapshots, cs336-model.md §9).
//
// Sizes are in bytes: shapes matter to memory only through them. Where an op's output
// size is not the elementwise size of its inputs the caller passes it.
#pragma once

#include "graph/runtime.h"

namespace memsim::graph {

// Node flag bits.
inline constexpr uint8_t kBroadcastA = 1;     // first input was broadcast: its grad is sum_to'd
inline constexpr uint8_t kBroadcastB = 2;     // second input was broadcast
inline constexpr uint8_t kCopyInBackward = 4; // view: the grad is not viewable, reshape copies
inline constexpr uint8_t kOuterBroadcast = 8; // the broadcast operand spans the trailing dims

// How the smaller operand of a binary op broadcasts: over trailing size-1 dims
// ((B,S,1) against (B,S,D)) or over the leading dims ((D,) against (B,S,D)). Only the
// second kind's grad reduction needs CUDA reduction scratch (graph/ops/cuda_reduce.h).
enum class Broadcast : uint8_t { trailing_ones, leading_dims };

// --- elementwise (out size = the larger input) ------------------------------------------
Tensor pow2(Runtime& rt, const Tensor& x);                        // saves x
Tensor mean_dim(Runtime& rt, const Tensor& x, uint64_t out_bytes); // keepdim reduction
Tensor mean_all(Runtime& rt, const Tensor& x, uint64_t out_bytes);
Tensor add_scalar(Runtime& rt, const Tensor& x);
Tensor add(Runtime& rt, const Tensor& a, const Tensor& b);
// a += b (b may broadcast): no allocation, an AddBackward0 node on a's storage.
Tensor add_(Runtime& rt, const Tensor& a, const Tensor& b);
Tensor sub(Runtime& rt, const Tensor& a, const Tensor& b);  // b may broadcast
// elem: bytes per element of the broadcast operand (leading_dims: its grad's reduction).
Tensor mul(Runtime& rt, const Tensor& a, const Tensor& b,
           Broadcast bc = Broadcast::trailing_ones, uint64_t elem = 4);  // either may broadcast
Tensor div(Runtime& rt, const Tensor& a, const Tensor& b);  // b may broadcast
Tensor div_scalar(Runtime& rt, const Tensor& x);
Tensor rsqrt(Runtime& rt, const Tensor& x);
Tensor sigmoid(Runtime& rt, const Tensor& x);
Tensor exp(Runtime& rt, const Tensor& x);
Tensor log(Runtime& rt, const Tensor& x);
Tensor neg(Runtime& rt, const Tensor& x);
struct MaxResult {
  Tensor values, indices;
};
// max.dim(-1, keepdim) over `rows` rows: values rows*elem, indices rows*8 (int64).
MaxResult max_dim(Runtime& rt, const Tensor& x, uint64_t rows, uint64_t elem);
Tensor sum_dim(Runtime& rt, const Tensor& x, uint64_t out_bytes);
// torch.where(mask, x, python_scalar): the scalar becomes a 0-d device tensor first.
Tensor where_scalar(Runtime& rt, const Tensor& mask, const Tensor& x, uint64_t elem);
Tensor gather(Runtime& rt, const Tensor& self, const Tensor& index, uint64_t out_bytes);

// F.cross_entropy pieces: _log_softmax (saves its result) and nll_loss_forward (a
// scalar output and a 0-d total_weight; saves the log-probs, target, total_weight).
Tensor log_softmax(Runtime& rt, const Tensor& x);
Tensor nll_loss(Runtime& rt, const Tensor& logp, const Tensor& target, uint64_t elem);

// --- data movement --------------------------------------------------------------------
Tensor clone(Runtime& rt, const Tensor& x);  // reshape that cannot be a view
// A view (no memory). copy_in_backward: the grad arriving here is not viewable as the
// input's shape, so its backward reshape makes a copy (ViewBackward0 + empty_like).
Tensor view(Runtime& rt, const Tensor& x, bool copy_in_backward);

// --- matmuls ----------------------------------------------------------------------------
// bmm on (reshaped) operands a and b: both saved; backward allocates grad_b then grad_a.
Tensor bmm(Runtime& rt, const Tensor& a, const Tensor& b, uint64_t out_bytes, double flops);
// einops.einsum(x, W, "... d_in, d_out d_in -> ... d_out") (cs336-model.md §2.1): one
// bmm; saves the x view and the W view; the weight grad reaches AccumulateGrad
// transposed and is cloned.
Tensor linear_einsum(Runtime& rt, const Tensor& x, const Tensor& w, uint64_t out_bytes,
                     double flops);
// weight[ids] (aten::index): saves ids; backward = zeros(V,D) + sort-based index_put_.
Tensor embedding(Runtime& rt, const Tensor& weight, const Tensor& ids, uint64_t out_bytes);
// CS336 RotaryEmbedding.forward on a (B,H,S,h) view (cs336-model.md §2.4): six
// elementwise ops on half-size tensors and a cat; saves only buffer views.
Tensor rope_cs336(Runtime& rt, const Tensor& x, const Tensor& freq_buffer);

// --- no-grad helpers ------------------------------------------------------------------
Tensor new_tensor(Runtime& rt, uint64_t bytes, OpKind op, TensorKind kind = TensorKind::activation);

// Runs node n's backward: allocates its temporaries and fills out[i] (one owned
// reference each) for next edge i. The engine then drops the incoming grads and the
// saved tensors and delivers the outputs.
void run_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

}  // namespace memsim::graph
