// The aten ops of transformers' mixture-of-experts code (graph/models/decoder_moe.cpp,
// docs/moe.md) with PyTorch eager semantics, like graph/ops/ops.h: each forward emits its
// allocations and records the autograd node that saves what derivatives.yaml saves;
// run_moe_backward replays the node's backward allocations.
//
// Checked on CPU against torch 1.13 (tools/fixtures/gen_moe_fixtures.py,
// tests/data/torch_cpu_moe). Where CUDA differs the CUDA behaviour is emitted and says so:
// F.one_hot on CUDA skips the min()/max() checks the CPU runs; index_put_ with
// accumulate=True (IndexBackward0) sorts its indices on CUDA (temporaries of the index's
// size, as the core op `embedding` emits; none without kernel scratch, i.e. on a CPU run).
//
// Sizes are bytes.
#pragma once

#include <vector>

#include "graph/runtime.h"

namespace memsim::graph {

// Backward of a node of one of these kinds (hook of graph::run_backward); false otherwise.
bool run_moe_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

// self[index] (aten::index with one or two int64 index tensors of index_bytes each, e.g.
// hidden_states[token_idx], top_k_weights[token_idx, top_k_pos, None]): out_bytes new.
// IndexBackward0 saves the indices (views of `index_storage`, which they keep alive).
// Backward: zeros(self) then index_put_(accumulate=True) into it.
Tensor index_rows(Runtime& rt, const Tensor& self, const Tensor& index_storage, uint64_t index_bytes,
                  uint64_t out_bytes);

// torch.topk(x, k, -1) over `rows` rows: values (rows*k*elem) and int64 indices
// (rows*k*8). TopkBackward0 saves the indices; backward value_selecting_reduction_backward:
// zeros(x) and an in-place scatter_ into it (torch 2.x; one x-sized tensor).
struct TopkResult {
  Tensor values, indices;
};
TopkResult topk(Runtime& rt, const Tensor& x, uint64_t rows, uint64_t k, uint64_t elem);

// a /= b in place, b broadcast over a's last dim (router_top_value /= sum): no new
// output, but the in-place op's derivative needs the original self, so it is cloned
// (a.bytes) and saved with b. Backward as DivBackward0: b's grad -grad*self/(b*b) (four
// a-sized temporaries, then sum_to b), then a's grad (grad / b).
void div_inplace(Runtime& rt, Tensor& a, const Tensor& b);

// a * col with col (rows, 1) broadcast and the result promoted to out_bytes (bf16 (n,D)
// times the fp32 routing weights: an fp32 (n,D) product). Saves both. Backward: col's
// grad (out-sized, summed to col), a's grad (out-sized, cast to a's dtype when promoted).
Tensor mul_column(Runtime& rt, const Tensor& a, const Tensor& col, uint64_t out_bytes);

// self.index_add_(0, index, source): in place on self (no allocation). IndexAddBackward0
// saves the index and source itself (derivatives.yaml's formula reads source.dim() and
// expand_as(source); torch 1.13 CPU keeps it, tests/data/torch_cpu_moe); backward passes self's grad through and gives source
// grad.index_select(0, index) (source-sized, new).
void index_add_(Runtime& rt, Tensor& self, const Tensor& index_storage, const Tensor& source);

// torch._grouped_mm(x, W.transpose(-2,-1), offs) on the 3-D expert weight W: out_bytes new;
// saves x, W and offs (derivatives.yaml: _grouped_mm_mat1_backward(grad, mat2, ..., offs),
// _grouped_mm_mat2_backward(grad, self, mat2's sizes and strides, ..., offs)). Backward, the
// later input's grad first as the generated code computes them: grad_W (W.bytes, the whole
// 3-D weight's grad in one tensor, in W's layout as mm_mat2_backward returns it, so
// AccumulateGrad steals it), then grad_x (x-sized). Not checked against a run: torch 1.13
// has no _grouped_mm (docs/moe.md).
Tensor grouped_mm(Runtime& rt, const Tensor& x, const Tensor& w, const Tensor& offs, uint64_t out_bytes,
                  double flops);

// x.masked_fill(mask, 0.0) (out of place: out_bytes = x.bytes, new) or x.masked_fill_(mask,
// 0.0) (in place: x's storage, a new grad_fn). MaskedFillBackward0 saves the mask; its
// backward, grad.masked_fill(mask, 0), allocates one grad-sized tensor (the core
// where_scalar node without a scalar tensor, as graph/models/cs336.cpp's masked_fill_).
Tensor masked_fill(Runtime& rt, const Tensor& x, const Tensor& mask, bool in_place);

// torch.cat(tensors, dim=0) of any number of tensors (the recorded router outputs of every
// MoE layer, load_balancing_loss_func): one new tensor of the summed bytes. CatBackward0
// saves nothing and hands each input a narrow view of the grad, so the grad's storage lives
// until the last input's consumer has used it. A Node has three edges, so the one
// CatBackward0 is a chain of cat_n nodes (two inputs and the rest of the chain each, all
// emitting views of the same grad and nothing else); the chain's tail nodes are made first
// and so run right after the head, before any node of the forward that made the inputs.
Tensor cat_n(Runtime& rt, const std::vector<Tensor>& inputs);

// x.masked_fill(mask, python scalar) (DeepSeek-V3's scores_for_choice): clone + masked_fill_,
// one new x-sized tensor, no 0-d scalar tensor (masked_fill.Scalar). MaskedFillBackward0
// saves the mask; its backward is where_scalar's (grad.masked_fill(mask, 0): new, x-sized).
Tensor masked_fill_scalar(Runtime& rt, const Tensor& x, const Tensor& mask);

// x.view(-1, D) with its own ViewBackward0 (no memory): DeepseekV3MoE / DeepseekV2Moe view
// the block's input for the experts only (the shared experts take the unviewed `residuals`),
// so the experts' grads meet in this node's buffer (the first one kept, the later ones added
// in place) and reach x's buffer as one grad, a view of that buffer, once all arrived.
Tensor view_with_node(Runtime& rt, const Tensor& x);

// The bmm that torch.einsum("o r e, e r i -> e o i", B, A) lowers to (aten's sumproduct_pair:
// permuted and reshaped views, then bmm(left (E, out, r), right (E, r, in))), as bmm above
// (OpKind::bmm: both saved; backward grad_right then grad_left) plus CUDA's copy of the
// left operand, whose strides (1, r*E, E) cuBLAS cannot take (prepare_batch_matrix_for_cublas
// clones it contiguous): `clone_bytes` allocated after the output and freed, and the same
// in backward for left^T while grad_right is computed (node.size[2]). 0: no copy (torch
// 1.13's CPU bmm, a run without kernel scratch).
Tensor einsum_bmm(Runtime& rt, const Tensor& left, const Tensor& right, uint64_t out_bytes, double flops,
                  uint64_t clone_bytes);

// A no-grad tensor made by one of the routing bookkeeping ops (one_hot, nonzero, sort,
// compare, sum): a new storage of `bytes`.
Tensor moe_scratch(Runtime& rt, uint64_t bytes, OpKind op);

}  // namespace memsim::graph
