// Liger-Kernel's fused linear cross entropy (LigerFusedLinearCrossEntropyFunction) as one
// autograd node: the lm_head projection and the cross entropy never materialise the full
// logits. Modelled from linkedin/Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py
// at commit 00eba634c2e9b5f05badbfb67e9b0a4caba301a2 (reduction "mean", no bias, no z-loss,
// no token scaling, ce_impl None: the Triton cross-entropy kernel), on a CUDA device of
// compute capability >= 8 (A100, H100), without torch.autocast (refused by key: the
// scenario reader, scenario/loss_impl.h).
//
// What fused_linear_cross_entropy_forward allocates, in order (inside Function.forward: grad
// mode off, so its own ops record nothing):
//   grad_input  = zeros_like(_input)                (BT, H) in the input's dtype
//   grad_weight = zeros_like(weight)                (V, H) in the weight's dtype, only when
//                                                   the weight requires grad (a frozen
//                                                   lm_head under LoRA: None)
//   loss_1d     = zeros(BT, float32)
//   target_mask = target != ignore_index (BT bool); its .sum() (an int64 0-d) dies at .item()
//   logits_storage = empty(chunk_size, V)          input dtype: _can_use_mm_out holds (CUDA,
//                                                   grad mode off inside forward, input and
//                                                   weight of one dtype, no autocast)
// with chunk_size = next_power_of_2(cdiv(BT, cdiv(V, H))) capped at BT (chunk_mem_const 1).
// Per chunk: mm(out=logits_storage[:rows]); the Triton kernel writes the loss and, in place,
// the logits' gradient; mm(out=grad_input[rows]); the weight grad: addmm(out=grad_weight)
// in place for a 16-bit weight (sm >= 8), else (fp32) the legacy
// `grad_weight += mm(grad_logits.t(), _input_chunk).float()` with its (V, H) fp32
// temporary. Then del logits_storage, loss = sum(loss_1d) (a 0-d fp32), and the frame's
// locals die in order (loss_1d, then target_mask). The node saves grad_input and
// grad_weight; backward compares grad_output with torch.tensor(1.0) (torch.equal: the 0-d
// one, eq's and all()'s 0-d bools) and hands the two saved buffers back as the grads
// (no copy: AccumulateGrad steals grad_weight).
#pragma once

#include "graph/runtime.h"

namespace memsim::graph {

struct LigerShape {
  uint64_t rows = 0;     // BT: tokens
  uint64_t hidden = 0;   // H
  uint64_t vocab = 0;    // V
  uint64_t in_elem = 2;  // the hidden states' element size
  uint64_t w_elem = 2;   // the head weight's element size
};

// Liger's chunk_size for (BT, H, V) (see above).
uint64_t liger_chunk_rows(uint64_t rows, uint64_t hidden, uint64_t vocab);

// LigerFusedLinearCrossEntropyFunction.apply(x (BT, H), w (V, H), target (BT,)): the 0-d
// loss. The weight's grad buffer exists when w requires grad.
Tensor liger_fused_linear_cross_entropy(Runtime& rt, const Tensor& x, const Tensor& w,
                                        const Tensor& target, const LigerShape& s);

// Backward of liger_flce (hook of graph/ops/ops.cpp); false for other kinds.
bool run_liger_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

}  // namespace memsim::graph
