// Megatron-Core's SwiGLU MLPs and grouped-query attention (issue #15, Megatron part 2;
// graph/models/megatron.cpp, graph/models/megatron_moe.cpp; docs/moe-megatron.md) as memory
// events: each forward allocates its outputs and records a node saving what the autograd
// Function saves; run_megatron_arch_backward replays the node's backward allocations.
//
// Modelled from NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22):
//  - megatron/core/fusions/fused_bias_swiglu.py: SwiGLUFunction / BiasSwiGLUFunction
//    (save_for_backward(input[, bias]); forward swiglu(y) = silu(y1) * y2 of the two
//    halves, backward swiglu_back = cat of the two halves' grads: one input-sized tensor,
//    returned for the bias too) and WeightedSwiGLUFunction (save_for_backward(input,
//    weights); backward returns the input grad and sum(swiglu(y) * g, -1) for the
//    weights). jit_fuser is torch.compile for torch >= 2.2 (megatron/core/jit.py): one
//    output per kernel, no eager intermediates.
//  - megatron/core/transformer/mlp.py MLP.forward: with bias_activation_fusion (on by
//    default with --swiglu, megatron/training/argument_utils.py) an MLP without
//    per_token_scale calls bias_swiglu_impl, an expert (per_token_scale = its probs)
//    weighted_bias_swiglu_impl, which raises for a bias.
//  - megatron/core/transformer/attention.py SelfAttention.get_query_key_value_tensors:
//    mixed_qkv viewed [sq, b, ng, (np/ng + 2) hn], split (views) into query, key, value,
//    then query.reshape(sq, b, np, hn): for np/ng > 1 and more than one group on the rank
//    the split view cannot be reshaped in place, so the query is copied (with one group,
//    MQA or ng = t, it is a view: tests/data/megatron_gqa, torch CPU); key and value stay
//    views of mixed_qkv (keeping its storage alive). Transformer Engine's fused attention saves q, k, v, out and the
//    softmax statistics, and its backward returns dq, dk, dv, which the split's backward
//    concatenates into one mixed_qkv-sized grad.
// Sizes are bytes.
#pragma once

#include "graph/runtime.h"

namespace memsim::graph {

// Backward of a node of one of these kinds; false otherwise.
bool run_megatron_arch_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

// bias_swiglu_impl(x, bias): a new x.bytes / 2 output; saves x (the bias is a parameter:
// bias_bytes 0 = SwiGLUFunction). Backward: one x-sized grad (also the bias's, reduced to
// main_grad).
Tensor fused_swiglu(Runtime& rt, const Tensor& x, uint64_t bias_bytes);

// weighted_bias_swiglu_impl(x, None, probs.unsqueeze(-1)): a new x.bytes / 2 output; saves
// x and probs. Backward: an x-sized grad for x and a probs-sized one for the probs.
Tensor weighted_swiglu(Runtime& rt, const Tensor& x, const Tensor& probs);

// --recompute-modules moe_act (TEGroupedMLP only; NVIDIA/Megatron-LM d98e8a64
// megatron/core/transformer/moe/experts.py TEGroupedMLP.forward and
// megatron/core/tensor_parallel/random.py CheckpointWithoutOutput / ...Function):
//  - checkpointed_weighted_swiglu: CheckpointWithoutOutputFunction.apply(bias_act_func, x,
//    None, probs) runs the weighted SwiGLU under no_grad (the same new x.bytes / 2 output)
//    and save_for_backward()s its tensor inputs, x and probs (what WeightedSwiGLUFunction
//    saves, so the node is a weighted_swiglu node: its backward is the re-run's inner
//    backward, the same two grads). A third saved slot starts empty and holds the
//    recomputed output (ctx.outputs) from the recompute until this node has run.
//  - discard_moe_act(act, fc2_out), right after fc2 (a megatron_linear that saved `act` as
//    its only saved tensor): discard_output_and_register_recompute(fc2_out) resizes act's
//    storage to 0, so its bytes are freed now although fc2 saved it (act is reset), and
//    registers the recompute as a grad hook on fc2's output: a pass-through node
//    (moe_act_recompute) in front of fc2's node, so it runs right before fc2's backward,
//    as the tensor hook does. Its backward allocates the recomputed output (forward op
//    name, a recompute) and puts it in fc2's saved slot and the checkpoint's ctx.outputs
//    slot (share_storage: no copy), then hands the grad on unchanged. It dies when both
//    have run: after the weighted SwiGLU's backward. Without grad (no node) act is only
//    freed. Returns fc2's output (a view on the hook node).
Tensor checkpointed_weighted_swiglu(Runtime& rt, const Tensor& x, const Tensor& probs);
Tensor discard_moe_act(Runtime& rt, Tensor& act, const Tensor& fc2_out);

// query.reshape(...) of the split view of `mixed` (q_bytes), a new contiguous copy. Its
// grad is a view of the incoming one (no node: fused_attention_gqa's backward hands the
// whole QKV grad to `mixed`).
Tensor gqa_query_copy(Runtime& rt, const Tensor& mixed, uint64_t q_bytes);

// TE fused attention with grouped-query attention: q is the query copy, k and v views of
// `mixed`; out (out_bytes) and the fp32 logsumexp (lse_bytes) are new, plus the RNG state
// with dropout. Saves q, mixed (k, v), out, lse. Backward: dq, dk + dv (mixed - q bytes),
// the softmax statistics' grad and the fp32 dq accumulator, then the split's cat into one
// mixed-sized grad.
Tensor fused_attention_gqa(Runtime& rt, const Tensor& q, const Tensor& mixed, uint64_t out_bytes,
                           uint64_t lse_bytes, uint64_t dq_accum_bytes, bool dropout_active,
                           double flops);

}  // namespace memsim::graph
