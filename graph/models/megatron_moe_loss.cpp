// MegatronModel's router losses (graph/models/megatron.h; docs/moe-megatron.md "Router
// losses"): TopKRouter.apply_z_loss and the aux_loss load-balancing loss, as they run in
// training (self.training and torch.is_grad_enabled(): not in the first pass of a
// checkpointed MoE layer, which runs under no_grad, but in its recompute).
//
// Modelled from NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
// megatron/core/transformer/moe/router.py (TopKRouter.routing: apply_z_loss on the logits
// first; after topk routing and token dropping, compute_routing_scores_for_aux_loss and
// _apply_aux_loss -> attach_and_log_load_balancing_loss -> MoEAuxLossAutoScaler.apply(probs,
// aux_loss)) and moe_utils.py (compute_routing_scores_for_aux_loss with moe_router_fusion
// off: softmax(logits, dtype=fp32) or sigmoid(logits.float()) / (sum + 1e-20), topk,
// zeros_like(logits).int().scatter(1, idx, 1).bool(); get_tokens_per_expert_and_token_count:
// routing_map.sum(dim=0), all-reduced in place; switch_load_balancing_loss_func; z_loss_func).
//
// What stays alive: the z-loss's logsumexp saves the [T, E] logits and its [T] result
// (LogsumexpBackward0), torch.square saves the [T] logsumexp; the aux loss keeps the fp32
// [T, E] scores (SoftmaxBackward0 saves its result; the sigmoid path keeps the sigmoid
// output and the [T] denominator for DivBackward0) and the [E] int64 tokens per expert;
// each MoEAuxLossAutoScaler saves its scalar loss. The aux loss's own routing map and topk
// outputs die when routing returns. Left out (a few bytes): the metrics tracker's logged
// copies of the losses and its per-layer buffer.
#include "graph/models/megatron.h"
#include "graph/models/moe_routing.h"
#include "graph/ops/ops.h"
#include "graph/ops/ops_megatron_loss.h"
#include "graph/ops/ops_moe.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

namespace {
Tensor nograd(Runtime& rt, uint64_t bytes, OpKind op) { return rt.alloc(bytes, TensorKind::temporary, op); }
}  // namespace

Tensor MegatronModel::moe_z_loss(const Tensor& logits) {
  const uint64_t T = rows_sp(), e = s_.elem;
  Tensor z;
  {
    // z_loss_func: logsum = torch.logsumexp(logits, -1); torch.square; torch.mean * coeff.
    Tensor logsum = logsumexp_rows(rt_, logits, T, e);
    Tensor squared = pow2(rt_, logsum);
    Tensor mean = mean_all(rt_, squared, e);
    z = mul_scalar(rt_, mean);
  }  // z_loss_func's locals die when it returns
  return aux_loss_scaler(rt_, logits, z);  // logits = MoEAuxLossAutoScaler.apply(logits, z_loss)
}

Tensor MegatronModel::moe_aux_loss(const Tensor& logits, const Tensor& probs) {
  const MoeSpec& m = s_.moe.spec;
  const uint64_t T = rows_sp(), E = m.experts, K = m.top_k, e = s_.elem;
  // compute_routing_scores_for_aux_loss (unfused).
  Tensor scores;
  if (m.score == MoeScore::softmax) {
    Tensor f32 = to_copy(rt_, logits, T * E * 4);  // softmax(..., dtype=fp32) on bf16: a copy
    scores = softmax(rt_, f32);
  } else {
    Tensor f32 = to_copy(rt_, logits, T * E * 4);
    Tensor sg = sigmoid(rt_, f32);
    f32.reset();
    Tensor sum = sum_dim(rt_, sg, T * 4);
    Tensor den = add_scalar(rt_, sum);
    sum.reset();
    scores = div(rt_, sg, den);
  }
  Tensor routing_map;
  {
    // `_, top_indices = torch.topk(scores, k)`: both alive until return. The `_` values'
    // TopkBackward0 node (saving the indices) dies with them, unreachable from any loss:
    // recorded without grad so that no saved index outlives the call.
    const bool grad = rt_.grad_enabled;
    rt_.grad_enabled = false;
    TopkResult top = topk(rt_, scores, T, K, 4);
    rt_.grad_enabled = grad;
    Tensor z = nograd(rt_, T * E * e, OpKind::fill);  // zeros_like(logits)
    Tensor i32 = nograd(rt_, T * E * 4, OpKind::to_copy);
    z.reset();
    Tensor sc = nograd(rt_, T * E * 4, OpKind::moe_scatter);
    i32.reset();
    routing_map = nograd(rt_, T * E, OpKind::to_copy);  // .bool()
  }
  // _apply_aux_loss: tokens per expert (routing_map.sum(dim=0), int64, all-reduced in place).
  Tensor tokens_per_expert = rt_.alloc(E * 8, TensorKind::activation, OpKind::sum_dim);  // saved below
  Tensor loss = switch_aux_loss(rt_, scores, tokens_per_expert, E);
  return aux_loss_scaler(rt_, probs, loss);  // the aux map and scores' handles die here
}

}  // namespace memsim::graph
