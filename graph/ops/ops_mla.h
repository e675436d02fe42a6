// Ops of transformers 5.17.0's DeepSeek-V2 attention (graph/models/decoder_mla.cpp,
// docs/deepseek.md "DeepSeek-V2"), modelled from
// transformers-5.17.0/transformers/models/deepseek_v2/modeling_deepseek_v2.py. Forward here,
// backward recipes in ops_nn.cpp's run_nn_backward (the nn library: OpKind::rope_complex and
// OpKind::copy_slices).
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

// base[..., slice].copy_(src) (expand_kv's key_states built by new_empty and two copies):
// no forward allocation; base gets a CopySlices node with edges (base's previous grad_fn,
// src). slice_bytes is the slice's size in bytes. Backward (torch/csrc/autograd/functions/
// tensor.cpp CopySlices::apply, the same in 1.13 and 2.x): `result` (base-sized, a copy
// of the grad), the slice's contiguous clone (src's grad), and, when base had a grad_fn,
// CopyBackwards' zeros_like of the slice (freed when the node returns; it is copied into
// result's slice, which goes on to base's previous node). Without one, result is freed at
// once.
void copy_into_slice(Runtime& rt, Tensor& base, const Tensor& src, uint64_t slice_bytes);

}  // namespace memsim::graph
