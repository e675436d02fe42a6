// Ops that LitGPT's model code and fine-tuning loss use where transformers' do not
// (graph/models/decoder_litgpt.cpp, docs/implementations.md), modelled from
// Lightning-AI/litgpt v0.5.13 (26857050fe3ff627cd714fe92f5838f51a3d5efa) with PyTorch 2.x's
// autograd. Each is one composite autograd node whose backward replays the allocations of
// the autograd nodes it stands for, in the engine's order (latest node first).
#pragma once

#include <cstdint>

#include "graph/runtime.h"

namespace memsim::graph {

// litgpt/model.py apply_rope(x, cos, sin) on q or k (B,h,T,hs) of x.bytes, with the model's
// cos/sin buffers of element size cache_elem (no grad):
//   x1, x2 = halves (views); rotated = cat((-x2, x1), -1)     neg (x/2), cat (x); neg dies
//   roped = (x * cos) + (rotated * sin)                        two products and their sum,
//                                                              promoted to fp32 when the
//                                                              cache is fp32 and x 16-bit
//   return roped.to(dtype=x.dtype)                             a copy when promoted
// The function's local `rotated` (and the fp32 sum) die as it returns. Returns the roped
// tensor (no grad_fn: rope_litgpt_cat records the node).
Tensor rope_litgpt(Runtime& rt, const Tensor& x, uint64_t elem, uint64_t cache_elem);

// torch.cat((roped, x[..., rope_n_elem:]), dim=-1) with rope_n_elem = head size: the
// second piece is empty, the cat a new x-sized tensor. One node for apply_rope and this
// cat (input x; saves cos and sin). Its backward, PyTorch 2.x (size[1] = the fp32 size
// when promoted, else 0):
//   SliceBackward0 of the empty slice: zeros(x) + copy -- the buffer the rest adds into
//   [ToCopyBackward0: the grad to fp32]
//   MulBackward0 rotated*sin: grad*sin [fp32, then the engine's cast to x's dtype]
//   MulBackward0 x*cos: grad*cos [the same], added into the buffer in place
//   CatBackward0 (rotated): views; NegBackward0 (x/2); SliceBackward0 of x2 and of x1:
//   zeros(x) + copy each, added in place; rotated's grad dies
Tensor rope_litgpt_cat(Runtime& rt, const Tensor& roped, const Tensor& x, const Tensor& cos,
                       const Tensor& sin, uint64_t elem, uint64_t cache_elem);

// litgpt/utils.py chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:]) (the
// finetune/full.py call; chunk_size 128, lm_head not chunked) on fp32 (B, S, V) logits:
//   logits.reshape(-1, V)           a copy of the slice when B > 1 (dies at return)
//   targets.reshape(-1)             an int64 copy when B > 1 (saved by every nll_loss)
//   per 128-row chunk (the last one short): log_softmax (saved), nll_loss reduction
//                                   "none": (rows,) fp32 and a 0-d total_weight (saved)
//   (targets != -100).sum()         bool (rows), int64 0-d
//   torch.cat(loss_chunks).sum() / non_masked.maximum(ones_like(non_masked))
//                                   the maximum (8 bytes) is saved by the division
// Backward: the division's grad (4 bytes); per chunk, last first: nll_loss_backward's
// zeros (chunk), _log_softmax_backward_data (chunk), the first dies, the chunk's log-probs
// are released; SplitBackward0 cats every chunk's grad ((B*(S-1), V) fp32), they die;
// [CloneBackward0 passes]; SliceBackward0: zeros (B, S, V) + copy, the cat dies.
// Returns the 0-d loss.
// shifted false: pretrain.py's chunked_cross_entropy(logits, targets) on the whole
// (contiguous) logits: B*S rows, both reshapes are views (no copies whatever B), and the
// backward ends at SplitBackward0's cat (no SliceBackward0).
Tensor chunked_ce_litgpt(Runtime& rt, const Tensor& logits, uint64_t batch, uint64_t seq,
                         uint64_t vocab, bool shifted = true);

// finetune/lora.py's loss: chunked_cross_entropy on the list that GPT.forward returns with
// lm_head_chunk_size=128 (litgpt/utils.py, the list branch). The list's chunks come from
// separate autograd nodes, so the function is emitted as one node per chunk, a chain of
// joins and one node for the total (all OpKind::chunked_ce_litgpt; Node::flags says
// which, kLitCe*). In order:
//   logit_chunks = [c.reshape(-1, V) ...]   views; the caller clones the sliced last
//                                           chunk when B > 1 (graph::clone)
//   target_chunks = [t.reshape(-1) ...]     the caller's int64 copies when B > 1, else
//                                           views of the batch (no bytes)
//   per chunk: ce_chunk_litgpt              cross_entropy(reduction="none")
//   lit_ce_join                             torch.cat's n inputs as a chain of 2-way joins
//                                           (no bytes: CatBackward0 narrows, views)
//   ce_total_litgpt                         (targets != -100).sum(), cat(...).sum(),
//                                           maximum(ones_like), the division
inline constexpr uint8_t kLitCeChunk = 1, kLitCeJoin = 2, kLitCeTotal = 3;

// F.cross_entropy(chunk (rows, V) fp32, target, reduction="none"): log_softmax (saved),
// nll_loss's (rows,) fp32 output (returned) and 0-d total_weight (saved); `target` (an
// int64 copy, or undefined for a view of the batch) is saved. Backward, as
// chunked_ce_litgpt's per chunk: NllLossBackward0's zeros (the chunk), its input (a view
// of the division's grad) and saved total_weight / target released,
// _log_softmax_backward_data (the chunk; the returned grad), the zeros die, the
// log-probs are released.
Tensor ce_chunk_litgpt(Runtime& rt, const Tensor& chunk, const Tensor& target, uint64_t rows,
                       uint64_t row_bytes);
// torch.cat's inputs a and b (loss chunks or a join): no bytes either way; the handle
// returned carries the node (a view of a: drop it once the total is made).
Tensor lit_ce_join(Runtime& rt, const Tensor& a, const Tensor& b);
// The tail of chunked_cross_entropy over `rows` = B*(S-1) targets: bool (rows) and its
// int64 sum, the (rows,) fp32 cat and its 0-d sum, ones_like and maximum (8 bytes each;
// the maximum saved by the division), the 0-d loss. Backward: the division's grad (4
// bytes), handed down the joins as views (SumBackward0's expand, CatBackward0's narrows).
Tensor ce_total_litgpt(Runtime& rt, const Tensor& joined, uint64_t rows);

// Backward of rope_litgpt and chunked_ce_litgpt; false for any other kind.
bool run_litgpt_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

}  // namespace memsim::graph
