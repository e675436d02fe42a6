// bitsandbytes' 4-bit linear (QLoRA's frozen NF4 base weights) as an op.
//
// Contract: matmul_4bit(x, w) is bnb.matmul_4bit -> MatMul4Bit.apply (bitsandbytes
// 0.41-0.43, autograd/_functions.py) for a Linear4bit without bias, compute dtype = x's:
//   forward:  F.dequantize_4bit(B, quant_state): the double-quantised absmax is first
//             dequantised into an fp32 (blocks) temporary, then the bf16 weight is
//             written into a new (out, in) tensor; the absmax temporary dies; linear(x,
//             W.t()) allocates the output; the dequantised weight dies.
//             Saves nothing that holds memory (ctx.tensors = (None, B): B is the frozen
//             packed weight, kept by the module anyway). x is not saved: B has no grad.
//   backward: grad_A = matmul(grad_output, dequantize_4bit(B).t()): the same two
//             temporaries, then grad_A, then the dequantised weight dies.
// A node is recorded only when x requires grad (B never does).
#pragma once

#include <cstdint>

#include "graph/runtime.h"

namespace memsim::graph {

struct Nf4Sizes {
  uint64_t absmax_fp32 = 0;   // blocks of 64 values, fp32 (the dequantised absmax)
  uint64_t weight = 0;        // the dequantised (out, in) weight, compute dtype
};

Tensor matmul_4bit(Runtime& rt, const Tensor& x, const Tensor& w_packed, const Nf4Sizes& deq,
                   uint64_t out_bytes, double flops);

// Backward of OpKind::matmul_4bit; false for any other kind.
bool run_lora_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

}  // namespace memsim::graph
