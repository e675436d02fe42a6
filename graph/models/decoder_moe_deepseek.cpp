// DecoderModel's DeepSeek-V3 mixture-of-experts block (graph/models/decoder.h; docs/deepseek.md):
// DeepseekV3MoE as transformers 5.x writes it, for MoeRouterCode::deepseek_v3; DeepseekV2Moe
// (5.17.0, modeling_deepseek_v2.py) is the same block around its own router
// (decoder_moe_deepseek_v2.cpp) and without the bias buffer.
//
// Modelled from transformers 5.17.0 as installed on the GPU machine (pip wheel,
// transformers/models/deepseek_v3/modeling_deepseek_v3.py: DeepseekV3TopkRouter.forward,
// DeepseekV3Experts (@use_experts_implementation), DeepseekV3MoE.forward). What runs:
//  - DeepseekV3MoE.__init__ registers experts (DeepseekV3Experts: gate_up_proj (E, 2F, D),
//    down_proj (E, D, F)), gate (DeepseekV3TopkRouter: weight (E, D) and the
//    e_score_correction_bias buffer, E fp32 zeros: _keep_in_fp32_modules_strict),
//    shared_experts (DeepseekV3MLP of moe_intermediate_size x n_shared_experts: gate/up/down
//    nn.Linear);
//  - forward: `_, topk_weights, topk_indices = self.gate(hidden_states)` (the raw (T, E) fp32
//    logits live as `_` until forward returns), the experts on `hidden_states.view(-1, D)` (a
//    view with its own ViewBackward0, ops_moe.h view_with_node: the experts' grads are summed
//    in its buffer, apart from the shared experts', which take `residuals`; the router's own
//    view inside it hands its grad on as it came, the same events: not a node here): the
//    eager loop of decoder_moe.cpp with the fp32 weights (an fp32 routing product and its .to
//    copy) or experts_implementation's batched_mm / grouped_mm; then
//    `hidden_states + self.shared_experts(residuals)` out of place;
//  - the router: F.linear(x.type(fp32), W.type(fp32)) (for a 16-bit model two fp32 copies,
//    both saved by the mm), scores = router_logits.sigmoid() (router_logits is not rebound:
//    both live; scores saved by SigmoidBackward0 and GatherBackward0), scores_for_choice =
//    scores + e_score_correction_bias (T, E), `.view(-1, G, E/G).topk(2)[0].sum(-1)` (the
//    group scores; TopkBackward0 keeps the (T, G, 2) indices while they live),
//    `torch.topk(group_scores, topk_group, sorted=False)[1]` (the values and their node die at
//    once), zeros_like + scatter_ (the (T, G) group mask), `unsqueeze.expand.reshape` (a (T, E)
//    fp32 copy), `~mask.bool()` (two (T, E) bool tensors, the first a temporary),
//    scores_for_choice REBOUND to the masked_fill (-inf; MaskedFillBackward0 keeps the bool
//    mask; the scores + bias dies at the rebinding), torch.topk (T, K) whose values die at once,
//    `scores.gather(1, topk_indices)`, with norm_topk_prob `sum + 1e-20` and an in-place
//    division, and `* routed_scaling_factor` (a new (T, K)). The group-selection tensors are
//    part of the autograd graph (they require grad) but nothing of the loss reaches them: they
//    are freed when the function returns, in its locals' order.
// (memsim's first DeepSeek model followed transformers main's route_tokens_to_experts, read
// second-hand: there the scores + bias lived to the return under its own name.)
// Routing stays the scenario's assumption (moe.routing; graph/models/moe_routing.h): only
// the sizes of the routing tensors are data-independent, so the top-k indices' values are
// the assumption's.
#include <string>

#include "graph/autocast.h"
#include "graph/models/decoder.h"
#include "graph/models/deepseek_router.h"
#include "graph/models/moe_routing.h"
#include "graph/ops/ops_moe.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

void DecoderModel::construct_moe_deepseek(LayerParams& p, const std::string& pre) {
  const MoeSpec& m = arch().moe;
  const uint64_t e = s_.elem, D = static_cast<uint64_t>(s_.d_model);
  const uint64_t E = static_cast<uint64_t>(m.experts), F = static_cast<uint64_t>(m.expert_d_ff);
  p.moe = true;
  p.experts_gate_up = rt_.add_parameter(E * 2 * F * D * e, param_name(pre, "mlp.experts", ".gate_up_proj"));
  p.experts_down = rt_.add_parameter(E * D * F * e, param_name(pre, "mlp.experts", ".down_proj"));
  // shape[0] is the expert dimension: FSDP2 chunks the 3-D weights by whole experts, as for
  // the other MoE rows (decoder_moe.cpp).
  rt_.parameters()[p.experts_gate_up].rows = E;
  rt_.parameters()[p.experts_down].rows = E;
  p.router = rt_.add_parameter(E * D * e, param_name(pre, "mlp.gate", ".weight"));
  rt_.parameters()[p.router].rows = E;
  // register_buffer("e_score_correction_bias", torch.zeros(E)): fp32 (transformers keeps it
  // in fp32 for 16-bit models: _keep_in_fp32_modules_strict).
  // DeepSeek-V2's router has no such buffer.
  if (m.code == MoeRouterCode::deepseek_v3) p.score_bias = rt_.alloc(E * 4, TensorKind::other, OpKind::fill);
  if (m.shared_d_ff > 0) {
    const uint64_t S = static_cast<uint64_t>(m.shared_d_ff);
    p.gate = add_proj(S, D, pre, "mlp.shared_experts.gate_proj", false, kGateProj);
    p.up = add_proj(S, D, pre, "mlp.shared_experts.up_proj", false, kUpProj);
    p.down = add_proj(D, S, pre, "mlp.shared_experts.down_proj", false, kDownProj);
  }
}

// DeepseekV3TopkRouter.forward (transformers 5.17.0). Returns the raw
// fp32 logits (the block's `router_logits` local); fills the (T, K) fp32 weights and int64
// indices.
Tensor DecoderModel::moe_router_deepseek(const LayerParams& p, const Tensor& x, Tensor& weights,
                                         Tensor& indices) {
  const MoeSpec& m = arch().moe;
  const uint64_t T = s_.rows(), E = static_cast<uint64_t>(m.experts), K = static_cast<uint64_t>(m.top_k);
  const uint64_t D = static_cast<uint64_t>(s_.d_model);
  const uint64_t G = static_cast<uint64_t>(m.n_group), TG = static_cast<uint64_t>(m.topk_group);
  // F.linear(x.type(fp32), W.type(fp32)) (graph/models/deepseek_router.h). Under autocast
  // .type(fp32) is a no-op on the fp32 x and weight, and linear is autocast's: the cached
  // bf16 weight, x's bf16 copy, bf16 logits (docs/deepseek.md "Under autocast").
  const bool ac = autocast_on();
  Tensor logits = ac ? ac_->mm_linear(x, p.router, static_cast<int64_t>(T), static_cast<int64_t>(D),
                                      static_cast<int64_t>(E), 2.0 * static_cast<double>(T * D * E))
                     : deepseek_router_logits(rt_, x, rt_.param(p.router), T, D, E, s_.elem);
  const uint64_t le = logits.bytes / (T * E);  // the logits' (and scores', weights') element size
  // --- the routing (5.17: in the router's forward, router_logits not rebound) ---
  Tensor scores = sigmoid(rt_, logits);  // scores = router_logits.sigmoid()
  // + e_score_correction_bias (an fp32 buffer, no grad): low scores promote to fp32.
  Tensor choice;
  if (le < 4) {
    choice = add(rt_, ac_->widen(scores), p.score_bias);
    Autocast::promoted(rt_, choice, 0, scores);
  } else {
    choice = add(rt_, scores, p.score_bias);
  }
  Tensor group_scores;
  {
    // .view(-1, G, E // G).topk(2, dim=-1)[0]: the tuple dies, TopkBackward0 keeps the
    // indices; .sum(dim=-1), then the values die.
    TopkResult top2 = topk(rt_, choice, T * G, 2, 4);
    top2.indices.reset();
    group_scores = sum_dim(rt_, top2.values, T * G * 4);
  }
  const int32_t group_node = group_scores.grad_fn;  // SumBackward0 -> the top-2's TopkBackward0
  const int32_t top2_node = group_node >= 0 ? rt_.node(group_node).next[0].node : -1;
  Tensor group_idx;
  {
    TopkResult gt = topk(rt_, group_scores, T, TG, 4);  // torch.topk(..., sorted=False)[1]
    group_idx = std::move(gt.indices);
    drop_with_node(rt_, gt.values);
  }
  Tensor group_mask = moe_scratch(rt_, T * G * 4, OpKind::fill);    // zeros_like; scatter_ in place
  Tensor score_mask = moe_scratch(rt_, T * E * 4, OpKind::clone);   // unsqueeze.expand.reshape
  Tensor for_choice;
  {
    Tensor inverted;
    {
      Tensor as_bool = moe_scratch(rt_, T * E, OpKind::to_copy);  // score_mask.bool()
      inverted = moe_scratch(rt_, T * E, OpKind::compare);         // ~
    }
    for_choice = masked_fill_scalar(rt_, choice, inverted);  // MaskedFillBackward0 keeps ~mask
  }
  // 5.17 rebinds scores_for_choice to the masked_fill: the (T, E) scores + bias dies here
  // (nothing saved it: AddBackward0 and the group top-2's TopkBackward0 keep no input).
  choice.reset();
  {
    TopkResult fin = topk(rt_, for_choice, T, K, 4);  // torch.topk(..., sorted=False)[1]
    indices = std::move(fin.indices);
    drop_with_node(rt_, fin.values);
  }
  Tensor w = gather(rt_, scores, indices, T * K * le);  // scores.gather(1, topk_indices)
  Tensor denominator;
  if (m.norm_topk) {
    {
      // topk_weights.sum(dim=-1, keepdim=True): under autocast sum is CUDA's
      // fp32_set_opt_dtype, so the bf16 weights sum into an fp32 (T, 1) (no input copy on
      // CUDA), and the division's denominator is fp32.
      Tensor sum = sum_dim(rt_, w, T * (ac ? 4 : le));
      denominator = add_scalar(rt_, sum);   // + 1e-20
    }
    div_inplace(rt_, w, denominator);       // topk_weights /= denominator
  }
  weights = mul_scalar(rt_, w);  // topk_weights * self.routed_scaling_factor
  w.reset();
  // The function returns: its locals die in their order (router_logits is returned; scores,
  // kept by SigmoidBackward0 and GatherBackward0; scores_for_choice (the masked one), and with
  // it the inverted mask; group_scores, and with it the top-2's saved indices; group_idx;
  // group_mask; score_mask; denominator, kept by the division).
  scores.reset();
  drop_with_node(rt_, for_choice);
  group_scores.reset();
  if (top2_node >= 0) rt_.release_saved(rt_.node(top2_node));
  group_idx.reset();
  group_mask.reset();
  score_mask.reset();
  denominator.reset();
  return logits;
}

Tensor DecoderModel::moe_block_deepseek(int32_t l, const LayerParams& p, const Tensor& x) {
  ModuleScope module_scope(rt_, Module::mlp);
  const MoeSpec& m = arch().moe;
  const std::vector<int64_t> counts = routed_tokens(m, static_cast<int64_t>(s_.rows()), moe_layer_index(l));
  Tensor weights, indices;
  Tensor router_logits = m.code == MoeRouterCode::deepseek_v2 ? moe_router_deepseek_v2(p, x, weights, indices)
                                                               : moe_router_deepseek(p, x, weights, indices);
  Tensor out;
  {
    // hidden_states = hidden_states.view(-1, D): the experts' input has its own
    // ViewBackward0 (the shared experts take `residuals`, the router views x inside itself),
    // so the experts' grads are summed apart from the shared experts' and added to x's
    // buffer once (the H200 trace of moe_tf_deepseek_v3_bf16_*: the first expert's
    // IndexBackward0 grad lives until the last expert's is added into it).
    const Tensor xv = view_with_node(rt_, x);
    switch (m.impl) {
      case ExpertsImpl::eager: out = moe_experts_eager(p, xv, indices, weights, counts); break;
      case ExpertsImpl::batched_mm: out = moe_experts_batched(p, xv, indices, weights); break;
      case ExpertsImpl::grouped_mm: out = moe_experts_grouped(p, xv, indices, weights); break;
    }
  }
  if (m.shared_d_ff > 0) {
    // hidden_states + self.shared_experts(residuals): DeepseekV3MLP on every token, added out
    // of place; the shared output dies with the add, the experts' output when the name is
    // rebound.
    Tensor shared;
    {
      Tensor h;
      {
        Tensor a = activation(project(x, p, p.gate));
        Tensor u = project(x, p, p.up);
        h = mul(rt_, a, u);
      }
      shared = project(h, p, p.down);
    }
    // Under autocast the experts' output is fp32 (index_add_ into zeros_like(x)) and the
    // shared experts' low: the add promotes; validate_outputs casts the low input's grad.
    Tensor sum;
    if (autocast_on() && shared.bytes < out.bytes) {
      sum = add(rt_, out, ac_->widen(shared));
      Autocast::promoted(rt_, sum, 1, shared);
    } else {
      sum = add(rt_, out, shared);
    }
    shared.reset();
    out = std::move(sum);
  }
  // forward returns: residuals, router_logits (the raw fp32 logits: freed here), topk_indices
  // and topk_weights (kept by the gather and the experts' products).
  router_logits.reset();
  indices.reset();
  weights.reset();
  return out;
}

}  // namespace memsim::graph
