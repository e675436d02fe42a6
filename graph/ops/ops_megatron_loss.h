// The ops of Megatron-Core's router losses (issue #15, Megatron part 2; graph/models/
// megatron_moe_loss.cpp, docs/moe-megatron.md) that no other op library has with the same
// memory behaviour. The rest of the losses (softmax / sigmoid scores, topk, the routing-map
// scatter, square, mean) are the core ops.
//
// Modelled from NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
// megatron/core/transformer/moe/moe_utils.py: z_loss_func (torch.logsumexp, torch.square,
// torch.mean), switch_load_balancing_loss_func (fused = moe_router_fusion off: probs.sum(0),
// * tokens_per_expert, torch.sum, * coefficient), MoEAuxLossAutoScaler (forward returns its
// input, save_for_backward(aux_loss); backward returns grad_output and
// torch.ones_like(aux_loss) * main_loss_backward_scale); and PyTorch's logsumexp
// (aten/src/ATen/native/ReduceOps.cpp logsumexp_out_impl: amax, masked_fill_ of the
// infinite maxes, (self - maxes).exp_(), sum, log_, add_) and derivatives.yaml
// (LogsumexpBackward0 saves self and result; grad * (self - result).exp()). Sizes are bytes.
#pragma once

#include "graph/runtime.h"

namespace memsim::graph {

bool run_megatron_loss_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

// torch.logsumexp(x, dim=-1) over `rows` rows of x (elem bytes each): a new rows * elem
// result and the temporaries of ATen's implementation; saves x and the result. Backward:
// (x - result), its exp, the product with the grad (x-sized each; the first two die).
Tensor logsumexp_rows(Runtime& rt, const Tensor& x, uint64_t rows, uint64_t elem);

// switch_load_balancing_loss_func(scores [T, E] fp32, tokens_per_expert [E] int64): the
// fp32 scalar loss (the [E] sums and products are temporaries); saves tokens_per_expert.
// Backward: the scalar's product with the coefficient, then grad * tokens_per_expert [E]
// fp32, handed to the scores as an expanded view (SumBackward1).
Tensor switch_aux_loss(Runtime& rt, const Tensor& scores, const Tensor& tokens_per_expert,
                       uint64_t experts);

// MoEAuxLossAutoScaler.apply(x, loss): x itself (a view), its node saving `loss`. Backward:
// x's grad passes through; the loss gets ones_like(loss) * scale (loss-sized, new).
Tensor aux_loss_scaler(Runtime& rt, const Tensor& x, const Tensor& loss);

}  // namespace memsim::graph
