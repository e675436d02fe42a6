// Ops that other training stacks' model code uses where transformers' does not
// (graph/models/decoder_impl.cpp, docs/implementations.md). Forward here, backward recipes in
// ops_nn.cpp's run_nn_backward (the nn library).
#pragma once

#include "graph/ops/ops.h"

namespace memsim::graph {

// nn.RMSNorm / F.rms_norm on CUDA with a weight of the input's dtype, PyTorch >= 2.9
// (aten/src/ATen/native/layer_norm.cpp rms_norm_symint -> at::_fused_rms_norm, one kernel):
// the output (x.bytes) and the fp32 rstd (rows x 4) are allocated; the node saves the
// input, rstd and the weight. Backward (_fused_rms_norm_backward): grad_input (x.bytes) and
// grad_weight (w.bytes). (PyTorch 2.4-2.8 ran the composite rms_norm instead: pow, mean,
// add_, rsqrt, mul, type_as, mul, with their saves; not modelled.)
Tensor fused_rms_norm(Runtime& rt, const Tensor& x, const Tensor& w, uint64_t rows);

// torchtitan's apply_rotary_emb(xq, xk, freqs_cis) (torchtitan/models/llama3/model/model.py
// at 5077be6e): xq.float().reshape(..., -1, 2) viewed as complex, times freqs_cis[0:S]
// (complex64, a buffer), view_as_real, flatten, .type_as(xq). elem is q/k's element size.
//  - fp32 (elem 4): .float() and .type_as() return their input; the complex product
//    (x.bytes) is the result.
//  - 16-bit: xq_/xk_ (fp32 copies), the two products (fp32), then the two .type_as copies;
//    the four fp32 tensors are locals and die when the function returns.
// MulBackward0 saves only the table (freqs_cis needs no grad, so the complex q is not
// saved). Backward of each: [16-bit: the grad to fp32], the conjugated table materialised
// (table_bytes, the conjugate fallback of mul), grad x conj, [16-bit: back to elem].
void rope_complex_pair(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& table,
                       uint64_t table_bytes, uint64_t elem, Tensor& q_out, Tensor& k_out);

// torchtune's RotaryPositionalEmbeddings.forward(x) (torchtune/modules/position_embeddings.py,
// v0.6.1) on x (B,S,h,hd) of element size elem, with its (max_seq_len, hd/2, 2) fp32 `cache`:
//   xshaped = x.float().reshape(..., -1, 2)        (a copy for 16-bit x; a local)
//   x_out = stack([x0*c0 - x1*s, x1*c0 + x0*s], -1) (four (.., hd/2) fp32 products, a sub
//                                                    and an add, each dying at its consumer;
//                                                    the stack (x in fp32) is a local)
//   return x_out.flatten(3).type_as(x)             (a copy for 16-bit x)
// Every MulBackward0 saves a slice of the cache only (the cache needs no grad). Backward
// (PyTorch 2.x): [16-bit: the grad to fp32], then per product: [the sub's -grad], grad x
// cache slice (half), select_backward = zeros(xshaped) + copy (the fp32 size); the four
// accumulate into the first in place (a solely owned buffer); [16-bit: back to elem].
Tensor rope_pairs(Runtime& rt, const Tensor& x, const Tensor& cache, uint64_t elem);

}  // namespace memsim::graph
