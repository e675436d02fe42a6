// bitsandbytes' 4-bit linear (QLoRA's frozen NF4 base weights) as an op.
//
// Contract: matmul_4bit(x, w) is bnb.matmul_4bit -> MatMul4Bit.apply (bitsandbytes
// 0.41-0.49, autograd/_functions.py; 0.49.2 f0e6ca31) for a Linear4bit without bias,
// compute dtype = x's:
//   forward:  F.dequantize_4bit(B, quant_state).to(A.dtype): the double-quantised absmax
//             is first dequantised into an fp32 (blocks) temporary, then the weight is
//             written into a new (out, in) tensor in quant_state.dtype (the load dtype);
//             the absmax temporary dies; when A's dtype differs, `.to` copies the weight
//             and the first one dies; linear(x, W.t()) allocates the output; the
//             dequantised weight dies.
//             Saves nothing that holds memory (ctx.tensors = (None, B): B is the frozen
//             packed weight, kept by the module anyway). x is not saved: B has no grad.
//   backward: grad_A = matmul(grad_output, dequantize_4bit(B).to(grad_output.dtype).t()):
//             the same temporaries, then grad_A, then the dequantised weight dies.
// A node is recorded only when x requires grad (B never does).
#pragma once

#include <cstdint>

#include "graph/runtime.h"

namespace memsim::graph {

struct Nf4Sizes {
  uint64_t absmax_fp32 = 0;   // blocks of 64 values, fp32 (the dequantised absmax)
  uint64_t weight = 0;        // the dequantised (out, in) weight, quant_state.dtype
  // `.to(A.dtype)` of that weight when the compute dtype (x's) differs from
  // quant_state.dtype (the load dtype): the copy's bytes; the dequantised weight dies as
  // `.to` returns. 0: no copy (the dtypes agree).
  uint64_t weight_cast = 0;
};

Tensor matmul_4bit(Runtime& rt, const Tensor& x, const Tensor& w_packed, const Nf4Sizes& deq,
                   uint64_t out_bytes, double flops);

// Backward of OpKind::matmul_4bit; false for any other kind.
bool run_lora_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

}  // namespace memsim::graph
