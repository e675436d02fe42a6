// torch.nn-level aten ops used by the Hugging Face decoders (graph/models/decoder.h), with PyTorch eager semantics like graph/ops/ops.h: each forward emits
// the op's allocations, records one autograd Node saving what derivatives.yaml saves,
// and run_nn_backward() replays the node's backward allocations in PyTorch's order.
//
// The orders and sizes were checked op by op against real PyTorch (CPU, through a
// TorchDispatchMode storage tracker: tools/fixtures/gen_torch_cpu_fixtures.py and
// tests/data/torch_cpu/). Where CPU and CUDA differ (embedding backward's sort
// temporaries, fused SDPA kernels) the CUDA behaviour is emitted and says so.
//
// Sizes are bytes; `elem` is the activation element size.
#pragma once

#include "graph/ops/linear_input.h"
#include "graph/runtime.h"

namespace memsim::graph {

// Backward of a node of one of these kinds (hook of graph::run_backward); false otherwise.
bool run_nn_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

// --- matmuls ------------------------------------------------------------------------
// addmm(bias, x2d, W) (HF Conv1D, W stored (in, out); nn.Linear with a bias, which
// at::native::linear runs as _flatten_nd_linear on a contiguous (B, S, D) input: reshape,
// addmm, view): saves x2d and W. Backward: grad_x (mm), grad_W (mm, W's layout: stolen),
// then the engine's sum_to for the bias. grad_x is a view of the mm result unless x is
// `flat` (graph/ops/linear_input.h).
Tensor addmm_bias(Runtime& rt, const Tensor& bias, const Tensor& x, const Tensor& w,
                  uint64_t out_bytes, double flops, LinearInput input = LinearInput::folded);
// F.linear(x, W) without bias = matmul(x, W.t()) -> mm on the folded (viewable) input.
// Saves x and W.t(). Backward: grad_W first (already in W's layout: stolen), then grad_x
// (a view of the mm result unless x is `flat`).
Tensor mm_linear(Runtime& rt, const Tensor& x, const Tensor& w, uint64_t out_bytes,
                 double flops, LinearInput input = LinearInput::folded);

// --- normalisation / activations ------------------------------------------------------
// native_layer_norm over `rows` rows: out + mean + rstd (rows fp32 each: CUDA accumulates
// in fp32 for every input dtype). Saves input, weight, bias, mean, rstd. Backward:
// grad_input, grad_weight, grad_bias.
Tensor layer_norm(Runtime& rt, const Tensor& x, const Tensor& w, const Tensor& b, uint64_t rows);
Tensor softmax(Runtime& rt, const Tensor& x);     // _softmax: saves result
Tensor tanh(Runtime& rt, const Tensor& x);        // saves result
Tensor silu(Runtime& rt, const Tensor& x);        // saves self
// F.gelu, exact or approximate="tanh" (gelu_pytorch_tanh): saves self; backward
// gelu_backward allocates the input's grad.
Tensor gelu(Runtime& rt, const Tensor& x);
Tensor mul_scalar(Runtime& rt, const Tensor& x);  // x * python scalar: saves nothing
// a + b with b broadcast (smaller): b's grad is reduced by the engine's sum_to (new).
Tensor add_bcast(Runtime& rt, const Tensor& a, const Tensor& b);
// x.to(dtype) to another dtype (out_bytes); backward casts the grad back (new).
Tensor to_copy(Runtime& rt, const Tensor& x, uint64_t out_bytes);
// F.dropout in training with 0 < p < 1 on CUDA = native_dropout: out + bool mask
// (x.bytes / elem bytes); saves the mask. p == 0 (or eval) returns x itself: the caller
// does not call this.
Tensor native_dropout(Runtime& rt, const Tensor& x, uint64_t elem);

// --- embedding / data movement ------------------------------------------------------------
// nn.Embedding (aten::embedding): saves the indices; backward embedding_dense_backward
// = a (num_weights, D) grad plus CUDA's sort-based int64 temporaries.
// d_model sizes embedding_dense_backward's fp32 partial sums (backward).
Tensor embedding_nn(Runtime& rt, const Tensor& weight, const Tensor& ids, uint64_t out_bytes,
                    uint64_t d_model);
// x.narrow(seq) (logits[..., :-1, :]): a view; backward zeros(input) + copy (new, x.bytes).
Tensor slice_seq(Runtime& rt, const Tensor& x, uint64_t out_bytes);
// x.select(dim, i): a view of out_bytes; SelectBackward0 allocates zeros of x's size and
// copies the grad into the selected index (a new x-sized tensor). No numeric kernel.
Tensor select_dim(Runtime& rt, const Tensor& x, uint64_t out_bytes);
// x.expand(...).reshape(...) that copies (repeat_kv): out x.bytes * n; backward is the
// expand's sum_to (new, x.bytes).
Tensor expand_clone(Runtime& rt, const Tensor& x, uint64_t n);
// The same when the reshape is a view (repeat_kv of a single KV head: the merged dims
// are (1, n_rep) with stride 0): no memory now, the consumer's reshape copies later;
// backward is the same sum_to.
Tensor expand_view(Runtime& rt, const Tensor& x, uint64_t n);
// A tied weight used twice (wte by the embedding and by lm_head): both grads meet in the
// parameter's input buffer; the first is not solely owned (a transposed view of the mm
// result), so InputBuffer adds them out of place (a new weight-sized tensor) and
// AccumulateGrad steals the sum. use(slot) gives the handle for each use: slot 0 is
// the use whose grad arrives first (lm_head), slot 1 the other. kTiedSumInPlace on the
// node: the first grad is a fresh dense tensor the buffer owns alone (autocast's cast
// back to fp32), so PyTorch 2.x adds the second into it in place (no new tensor).
inline constexpr uint8_t kTiedSumInPlace = 128;
// qkv.split(D, dim=2) + per-piece view/permute (GPT-2 c_attn). head_view(0|1|2) is the
// (B,H,S,hd) view of q, k or v. Backward: q's and v's view reshape copies (their grads
// arrive permuted); k's grad is the transpose of matmul's contiguous k^T grad, which
// permuted back is viewable as (B,S,D): no copy (CPU fixtures: two clones per layer).
// Then the split's cat allocates the (B,S,3D) grad. Slot limitation: k and v share one
// input slot.
class SplitQkv {
 public:
  SplitQkv(Runtime& rt, const Tensor& qkv);
  Tensor head_view(Runtime& rt, int which) const;
 private:
  Tensor base_;
  int32_t node_ = -1;
};

// torch.cat((a, b), dim=-1): a new tensor; CatBackward0 narrows the grad (views).
Tensor cat2(Runtime& rt, const Tensor& a, const Tensor& b);
// x.chunk(2, dim=-1) (Phi-3's gate_up): piece(0|1) is a half-sized view; the one
// SplitBackward0 node cats the two grads into a new x-sized tensor. With first_bytes,
// torch.split(x, [a, b], dim=-1) (SplitWithSizesBackward0, the same cat): piece 0 has
// first_bytes, piece 1 the rest (MLA's nope/rope and latent/rope splits).
class Chunk2 {
 public:
  Chunk2(Runtime& rt, const Tensor& x, uint64_t first_bytes = 0);
  Tensor piece(Runtime& rt, int which) const;
 private:
  Tensor base_;
  int32_t node_ = -1;
  uint64_t first_ = 0;
};

class TiedWeight {
 public:
  TiedWeight(Runtime& rt, const Tensor& param);
  Tensor use(uint8_t slot) const;
 private:
  Tensor base_;
  int32_t node_ = -1;
};

// torch.where(cond, x, other) with `other` a 0-d tensor the caller made (GPT-2's mask
// value): out x.bytes; saves cond. Backward like where_scalar: where(cond, grad, 0)
// wraps the 0 into a 0-d device tensor (elem bytes) first.
Tensor where_tensor(Runtime& rt, const Tensor& cond, const Tensor& x, uint64_t elem);

// --- attention --------------------------------------------------------------------------
// Hugging Face apply_rotary_pos_emb on one of q/k (bytes x.bytes, laid out like x):
// x*cos, rotate_half(x) = cat(-x2, x1), * sin, sum. Saves the cos and sin storages.
// One composite node: its backward replays the measured sequence (see ops_nn.cpp).
Tensor rope_hf(Runtime& rt, const Tensor& x, const Tensor& cos, const Tensor& sin);

// F.scaled_dot_product_attention on a fused backend (aten-saved-tensors.md §C).
// q (B,H,S,E), k, v: out (B,S,H,E layout, out_bytes, input dtype) + logsumexp fp32;
// saves q, k, v, out, logsumexp (RNG seed/offset are host scalars: no device bytes).
// kv_heads: k/v's heads when fewer than q's (SDPA's enable_gqa=True, transformers 5.x's
// sdpa_attention_forward); 0 when k/v have q's heads (MHA, or repeat_kv's copies).
struct SdpaShape {
  uint64_t batch = 0, heads = 0, seq = 0, head_dim = 0, elem = 2;
  uint64_t kv_heads = 0;
};
// With grouped KV heads (s.kv_heads < s.heads) flash takes k/v as they are; its backward
// (FA2 mha_bwd) computes dK/dV per query head into two (B,S,H,hd) buffers of the input
// dtype and sums them into the KV-sized dk/dv (node flag kSdpaGqa).
inline constexpr uint8_t kSdpaGqa = 32;
Tensor sdpa_flash(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& v,
                  const SdpaShape& s, double flops);
Tensor sdpa_efficient(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& v,
                      const SdpaShape& s, double flops);

}  // namespace memsim::graph
