// DecoderModel's DeepSeek-V2 router (graph/models/decoder.h; docs/deepseek.md "DeepSeek-V2"):
// DeepseekV2TopkRouter.forward for MoeRouterCode::deepseek_v2, modelled from transformers
// 5.17.0 (transformers/models/deepseek_v2/modeling_deepseek_v2.py, the copy read under
// /work/src517). The block around it is DeepseekV3MoE's (decoder_moe_deepseek.cpp: experts,
// then `hidden_states + self.shared_experts(residuals)`; the raw logits live as `_` until
// the block returns). What runs, with T tokens, E experts, K = num_experts_per_tok, G =
// n_group, TG = topk_group:
//  - router_logits = F.linear(x.type(fp32), W.type(fp32)): for a 16-bit model two fp32
//    copies, saved by the mm, dying with the expression; (T, E) fp32 logits, returned;
//  - scores = router_logits.softmax(dim=-1, dtype=fp32): (T, E) fp32, saved by
//    SoftmaxBackward0 (its result);
//  - greedy: torch.topk(scores, K, sorted=False): the values (T, K) fp32 are the weights
//    (TopkBackward0 keeps the (T, K) int64 indices, which are also returned);
//  - group_limited_greedy: scores.view(-1, G, E/G).max(dim=-1).values (T, G) (MaxBackward0
//    keeps the (T, G) int64 indices), torch.topk(group_scores, TG)[1] (the values and their
//    node die at once), zeros_like + scatter_ (T, G) fp32, unsqueeze.expand.reshape (a (T, E)
//    fp32 copy), ~mask.bool() (two (T, E) bool tensors, the first a temporary), scores
//    REBOUND to scores.masked_fill(~mask, 0.0) ((T, E) fp32; MaskedFillBackward0 keeps the
//    inverted mask, and unlike V3 this node is on the loss's path: the top-k values are the
//    weights, so the mask lives until backward), then torch.topk(scores, K);
//  - topk_weights = topk_weights * routed_scaling_factor: a new (T, K) fp32 (the top-k
//    values die at the rebinding: TopkBackward0 keeps no values);
//  - norm_topk_prob is not read by 5.17's router (config.json's value has no effect).
// At return the locals die in their order: scores (the masked copy; the softmax result
// stays saved), group_scores (and with it MaxBackward0's indices), group_idx, group_mask,
// score_mask. Routing stays the scenario's assumption (moe.routing): only the sizes of the
// routing tensors are data-independent.
#include "graph/autocast.h"
#include "graph/models/decoder.h"
#include "graph/models/deepseek_router.h"
#include "graph/ops/ops_moe.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

Tensor DecoderModel::moe_router_deepseek_v2(const LayerParams& p, const Tensor& x, Tensor& weights,
                                            Tensor& indices) {
  const MoeSpec& m = arch().moe;
  const uint64_t T = s_.rows(), E = static_cast<uint64_t>(m.experts), K = static_cast<uint64_t>(m.top_k);
  const uint64_t D = static_cast<uint64_t>(s_.d_model);
  const uint64_t G = static_cast<uint64_t>(m.n_group), TG = static_cast<uint64_t>(m.topk_group);
  // F.linear(x.type(fp32), W.type(fp32)) (graph/models/deepseek_router.h); under autocast
  // autocast's linear (bf16 logits), as DeepSeek-V3's router (decoder_moe_deepseek.cpp).
  const bool ac = autocast_on();
  Tensor logits = ac ? ac_->mm_linear(x, p.router, static_cast<int64_t>(T), static_cast<int64_t>(D),
                                      static_cast<int64_t>(E), 2.0 * static_cast<double>(T * D * E))
                     : deepseek_router_logits(rt_, x, rt_.param(p.router), T, D, E, s_.elem);
  // router_logits.softmax(dim=-1, dtype=torch.float32): bf16 logits are converted first.
  Tensor scores = ac ? ac_->fp32_softmax(logits) : softmax(rt_, logits);
  Tensor group_scores, group_idx, group_mask, score_mask;
  int32_t max_node = -1;
  if (m.group_limited) {
    {
      // .view(-1, G, E // G).max(dim=-1).values: the namedtuple dies, MaxBackward0 keeps
      // the indices.
      MaxResult mx = max_dim(rt_, scores, T * G, 4);
      group_scores = std::move(mx.values);
      mx.indices.reset();
    }
    max_node = group_scores.grad_fn;
    {
      TopkResult gt = topk(rt_, group_scores, T, TG, 4);  // torch.topk(..., sorted=False)[1]
      group_idx = std::move(gt.indices);
      drop_with_node(rt_, gt.values);
    }
    group_mask = moe_scratch(rt_, T * G * 4, OpKind::fill);    // zeros_like; scatter_ in place
    score_mask = moe_scratch(rt_, T * E * 4, OpKind::clone);   // unsqueeze.expand.reshape
    Tensor inverted;
    {
      Tensor as_bool = moe_scratch(rt_, T * E, OpKind::to_copy);  // score_mask.bool()
      inverted = moe_scratch(rt_, T * E, OpKind::compare);         // ~
    }
    // scores = scores.masked_fill(~score_mask.bool(), 0.0): the softmax result stays alive
    // (saved by SoftmaxBackward0); MaskedFillBackward0 keeps the inverted mask.
    scores = masked_fill_scalar(rt_, scores, inverted);
  }
  Tensor top_weights;
  {
    TopkResult fin = topk(rt_, scores, T, K, 4);  // torch.topk(scores, k=top_k, sorted=False)
    top_weights = std::move(fin.values);
    indices = std::move(fin.indices);
  }
  weights = mul_scalar(rt_, top_weights);  // topk_weights * self.routed_scaling_factor
  top_weights.reset();
  // return: the locals die in their order.
  scores.reset();
  group_scores.reset();
  if (max_node >= 0) rt_.release_saved(rt_.node(max_node));
  group_idx.reset();
  group_mask.reset();
  score_mask.reset();
  return logits;
}

}  // namespace memsim::graph
