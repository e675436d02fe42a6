// Ops of transformers 5.17.0's DeepSeek-V2 and DeepSeek-V3 attention
// (graph/models/decoder_mla.cpp, docs/deepseek.md), modelled from
// transformers-5.17.0/transformers/models/deepseek_v2/modeling_deepseek_v2.py and
// .../deepseek_v3/modeling_deepseek_v3.py. Forward here, backward recipes in ops_nn.cpp's
// run_nn_backward (the nn library: OpKind::rope_complex and OpKind::copy_slices) or, for the
// interleaved RoPE, the primitive ops' own (slice, mul, sub, add, cat).
#pragma once

#include "graph/ops/ops.h"

namespace memsim::graph {

// apply_rotary_emb(xq, xk, freqs_cis) of modeling_deepseek_v2.py: xq.float().reshape(...,
// -1, 2) viewed as complex (both q and k first), then for q and for k
// `view_as_real(x_ * freqs_cis).flatten(3).type_as(x)`. elem is q/k's element size.
//  - fp32: .float() and .type_as() return their input (reshape of the rope slice is a
//    view): each complex product (x.bytes) is the result.
//  - 16-bit: the two fp32 copies (locals, dying at return), then per tensor the product
//    (a temporary of the expression, dying once its .type_as copy exists) and the copy.
// MulBackward0 saves only the table (freqs_cis needs no grad). Backward as torchtitan's
// (ops_stack.h rope_complex_pair); with q_grad_strided (fp32 only) ViewAsRealBackward0's
// grad.contiguous() copies q's grad first: it arrives as CatBackward0's narrow view of the
// query grad (k's comes contiguous from ExpandBackward0's sum).
void rope_complex_pair_hf(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& table,
                          uint64_t table_bytes, uint64_t elem, bool q_grad_strided, Tensor& q_out,
                          Tensor& k_out);

// apply_rotary_pos_emb_interleave(q, k, cos, sin) of transformers 5.17's DeepSeek-V3 (the
// even/odd form; earlier releases de-interleaved with view / transpose / reshape, a copy):
//   cos = cos[..., : d // 2].unsqueeze(1); sin likewise          (views)
//   q1, q2 = q[..., 0::2], q[..., 1::2]; k1, k2 likewise          (strided views)
//   q_embed = torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], dim=-1); k_embed likewise
// Composed of the primitive ops so that autograd runs their own nodes: per q and k four
// half-width products, a sub and an add (each product dies when its sum exists, the left
// operand first) and the cat (the list dies after it, its last item first). The products save
// only the (no-grad) table views. Backward: CatBackward0's narrows, AddBackward0's shared
// grad, SubBackward0's -grad, four half-width products, and per strided slice
// SliceBackward0's zeros of the full rope width with the grad copied in (its two uses'
// grads summed in its buffer first); the two slices' grads meet in the rope input's buffer.
// cos and sin are the (.., S, rope) tables, q (B, H, S, rope) and k (B, 1, S, rope) of the
// activation dtype. widen: 1, or under autocast 4 / low element size: the low slices times
// the fp32 tables promote, so the products, sums and cats are fp32 (widen x the slices'
// bytes) and in backward each product's node casts the slice's fp32 grad back to the low
// dtype (validate_outputs, graph/autocast.h Autocast::promoted).
void rope_interleave_pair_hf(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& cos,
                             const Tensor& sin, Tensor& q_out, Tensor& k_out, uint64_t widen = 1);

// base[..., slice].copy_(src) (expand_kv's key_states built by new_empty and two copies):
// no forward allocation; base gets a CopySlices node with edges (base's previous grad_fn,
// src). slice_bytes is the slice's size in bytes. Backward (torch/csrc/autograd/functions/
// tensor.cpp CopySlices::apply, the same in 1.13 and 2.x): `result` (base-sized, a copy
// of the grad), the slice's contiguous clone (src's grad), and, when base had a grad_fn,
// CopyBackwards' zeros_like of the slice (freed when the node returns; it is copied into
// result's slice, which goes on to base's previous node). Without one, result is freed at
// once. A src of another dtype (src.bytes != slice_bytes: DeepSeek-V3's fp32 rope key copied
// into the bf16 key under autocast) gets CopyBackwards' `grad.to(src dtype)`, a new
// src-sized tensor, after the zeros; the slice's clone then dies when CopyBackwards returns.
void copy_into_slice(Runtime& rt, Tensor& base, const Tensor& src, uint64_t slice_bytes);

}  // namespace memsim::graph
