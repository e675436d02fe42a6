// The ops of Megatron-Core's MoE layer (graph/models/megatron_moe.cpp; docs/moe-megatron.md)
// that no other op library has with the same memory behaviour, as memory events: each
// forward allocates its outputs and records a node saving what the autograd Function (or
// derivatives.yaml for the aten ops) saves; run_megatron_moe_backward replays the node's
// backward allocations.
//
// Modelled from NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22):
// megatron/core/transformer/moe/moe_utils.py (permute / unpermute unfused, topk routing),
// megatron/core/tensor_parallel/mappings.py (the sequence-parallel gather / reduce-scatter
// and all_to_all autograd Functions), and torch's derivatives.yaml for index_select,
// scatter, scatter_add_ and masked_select. Sizes are bytes.
#pragma once

#include "graph/runtime.h"

namespace memsim::graph {

// Backward of a node of one of these kinds (called from run_fused_backward); false otherwise.
bool run_megatron_moe_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

// torch.zeros_like(logits).scatter(1, top_indices, probs): a zeros of out_bytes (no grad,
// dies at once) and the out_bytes result. ScatterBackward0 saves the index; backward
// gives src the grad gathered back (src-sized, new).
Tensor moe_scatter(Runtime& rt, const Tensor& src, const Tensor& index, uint64_t out_bytes);

// gather_from_sequence_parallel_region(x, group of G ranks): the all-gathered x (x.bytes *
// G) as a new tensor, or, with `into` (use_global_buffer=True), as a view of Megatron's
// global memory buffer (global_buffer_get: `into` is the process's buffer slot, which grows
// to out_bytes if smaller). Saves nothing. Backward (tensor_parallel_output_grad): the grad
// reduce-scattered into a new x-sized tensor; with `into`, ctx.use_global_buffer makes
// _reduce_scatter_along_first_dim take its output from the same buffer too
// (mappings.py _GatherFromSequenceParallelRegion.backward at d98e8a64): no allocation, the
// grad is an x-sized view of the buffer's current tensor (so InputBuffer never adds into it
// in place: the dict shares its storage). The node keeps the slot's address for that
// (megatron_global_buffer.h's contract: the slot outlives the graph).
// nccl_flat > 0: the gather and its backward pass output_split_sizes (the alltoall
// dispatcher's ETP gather), so mappings.py calls torch.distributed.all_gather /
// reduce_scatter with tensor lists; with equal splits ProcessGroupNCCL stacks the list into
// one newLikeFlat tensor of nccl_flat bytes (the whole gathered size) after the output is
// allocated, freed when the collective's Work is dropped: a transient in both directions.
Tensor seq_gather(Runtime& rt, const Tensor& x, uint64_t out_bytes, Tensor* into = nullptr,
                  uint64_t nccl_flat = 0);

// reduce_scatter_to_sequence_parallel_region: this rank's out_bytes part, new. Saves
// nothing. Backward all-gathers the grad into a new x-sized tensor. nccl_flat as for
// seq_gather (the alltoall dispatcher's ETP reduce-scatter with input_split_sizes).
Tensor seq_reduce_scatter(Runtime& rt, const Tensor& x, uint64_t out_bytes, uint64_t nccl_flat = 0);

// all_to_all(ep_group, x, output_splits, input_splits): out_bytes, new. Saves nothing.
// Backward: the reverse all-to-all into a new x-sized tensor.
Tensor all_to_all(Runtime& rt, const Tensor& x, uint64_t out_bytes);

// x.index_select(0, index): out_bytes, new. IndexSelectBackward0 saves the index (x's
// sizes only); backward index_select_backward = zeros(x).index_add_(0, index, grad): one
// new x-sized tensor (atomics, no sort).
Tensor index_select_rows(Runtime& rt, const Tensor& x, const Tensor& index, uint64_t out_bytes);

// x.masked_select(mask): out_bytes, new. MaskedSelectBackward0 saves the mask; backward
// masked_select_backward = zeros_like(x).masked_scatter_(mask, grad): one new x-sized tensor.
Tensor masked_select(Runtime& rt, const Tensor& x, const Tensor& mask, uint64_t out_bytes);

// self.scatter_add_(0, index.expand(-1, h), src) in place (unpermute's output_tokens).
// ScatterAddBackward0 saves the index only; backward passes self's grad through and gives
// src grad.gather(0, index) (src-sized, new).
void scatter_add_rows(Runtime& rt, Tensor& self, const Tensor& index, const Tensor& src);

// output_bias.unsqueeze(0) * per_token_scale.unsqueeze(-1) (MLP.forward of an expert with
// a bias): a new out_bytes [n, h] product of the bias parameter (bias_bytes, its grad to
// main_grad) and the [n, 1] probabilities, which it saves. Backward: the bias's grad
// (grad * probs, out-sized, summed to bias_bytes and handed to main_grad) then the
// probabilities' (grad * bias, out-sized, summed to probs-sized).
Tensor expert_bias_scale(Runtime& rt, const Tensor& probs, uint64_t out_bytes, uint64_t bias_bytes);

}  // namespace memsim::graph
