// DecoderModel's mixture-of-experts layers (graph/models/decoder.h; docs/moe.md): the sparse
// MoE block that replaces a layer's MLP when DecoderArch::moe says the layer is sparse.
//
// Modelled from transformers v5's fused-expert code (the layout v5 introduced and 5.x
// keeps; read at huggingface/transformers main, integrations/moe.py and
// models/{qwen3_moe,qwen2_moe,mixtral,olmoe}/modeling_*.py):
//  - the block (Qwen3MoeSparseMoeBlock / OlmoeSparseMoeBlock / MixtralSparseMoeBlock):
//    x.view(-1, D); `_, routing_weights, selected_experts = self.gate(x)` (all three locals
//    live until the block returns); experts(x, selected_experts, routing_weights);
//    Qwen2MoeSparseMoeBlock first runs its shared expert, then scales it by
//    sigmoid(shared_expert_gate(x)) and adds it in place;
//  - the router (MoeRouterCode): F.linear to (T, E) in the model dtype, softmax in fp32
//    (a (T, E) fp32 copy first for 16-bit logits), topk, the in-place renormalisation;
//  - the eager experts (Qwen3MoeExperts.forward): zeros_like(x); under no_grad one_hot
//    (T, K, E) int64 (alive until forward returns), its sum over (K, T), greater, nonzero;
//    then for every expert that got tokens, in order: `expert_idx == num_experts` (a 1-byte
//    bool), torch.where(expert_mask[e]) (nonzero: (n, 2) int64, whose two column views are
//    top_k_pos and token_idx), hidden_states[token_idx] (n, D), F.linear with the selected
//    gate_up_proj[e] (a view; SelectBackward0 hands back a zeros of the whole 3-D weight),
//    chunk, act(gate) * up, F.linear with down_proj[e], * top_k_weights[token_idx,
//    top_k_pos, None] (fp32 (n, 1): the product is fp32), .to(dtype), index_add_. Every
//    size is n, the tokens routed to that expert (graph/models/moe_routing.h). The loop's
//    last locals live until forward returns.
// And batched_mm_experts_forward / grouped_mm_experts_forward (experts_implementation, below).
// The auxiliary load-balancing loss (output_router_logits): moe_aux_loss below. Not modelled
// here (refused by the scenario reader): LoRA on experts.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "graph/autocast.h"
#include "graph/models/decoder.h"
#include "graph/models/moe_routing.h"
#include "graph/ops/ops_moe.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

int64_t DecoderModel::moe_layer_index(int32_t l) const {
  int64_t k = 0;
  for (int32_t i = 0; i < l; ++i) k += arch().moe.layer_is_moe(i) ? 1 : 0;
  return k;
}

// Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock registration (v5): gate, experts, then the
// shared expert and its gate.
void DecoderModel::construct_moe(LayerParams& p, const std::string& pre) {
  const MoeSpec& m = arch().moe;
  if (m.code == MoeRouterCode::deepseek_v3) return construct_moe_deepseek(p, pre);  // decoder_moe_deepseek.cpp
  const uint64_t e = s_.elem, D = static_cast<uint64_t>(s_.d_model);
  const uint64_t E = static_cast<uint64_t>(m.experts), F = static_cast<uint64_t>(m.expert_d_ff);
  p.moe = true;
  p.router = rt_.add_parameter(E * D * e, param_name(pre, "mlp.gate", ".weight"));
  rt_.parameters()[p.router].rows = E;
  p.experts_gate_up = rt_.add_parameter(E * 2 * F * D * e, param_name(pre, "mlp.experts", ".gate_up_proj"));
  p.experts_down = rt_.add_parameter(E * D * F * e, param_name(pre, "mlp.experts", ".down_proj"));
  if (m.shared_d_ff > 0) {
    const uint64_t S = static_cast<uint64_t>(m.shared_d_ff);
    p.gate = add_proj(S, D, pre, "mlp.shared_expert.gate_proj", false, -1);
    p.up = add_proj(S, D, pre, "mlp.shared_expert.up_proj", false, -1);
    p.down = add_proj(D, S, pre, "mlp.shared_expert.down_proj", false, -1);
    p.shared_gate_proj = add_proj(1, D, pre, "mlp.shared_expert_gate", false, -1);
  }
}

Tensor DecoderModel::moe_router(const LayerParams& p, const Tensor& x, Tensor& weights,
                                Tensor& indices) {
  const MoeSpec& m = arch().moe;
  const uint64_t T = s_.rows(), E = static_cast<uint64_t>(m.experts), K = static_cast<uint64_t>(m.top_k);
  const uint64_t D = static_cast<uint64_t>(s_.d_model);
  const double flops = 2.0 * static_cast<double>(T) * static_cast<double>(D) * static_cast<double>(E);
  // router_logits = F.linear(hidden_states, self.weight)
  Tensor logits = autocast_on()
                      ? ac_->mm_linear(x, p.router, static_cast<int64_t>(T), s_.d_model, m.experts, flops)
                      : mm_linear(rt_, x, rt_.param(p.router), T * E * s_.elem, flops);
  const uint64_t le = logits.bytes / (T * E);  // the logits' element size
  // softmax(logits, dtype=float) / softmax(logits.float()): a 16-bit input is copied to fp32
  // first (the copy dies with the expression); sigmoid likewise.
  Tensor probs;
  {
    Tensor f32 = le == 4 ? logits : to_copy(rt_, logits, T * E * 4);
    probs = m.score == MoeScore::softmax ? softmax(rt_, f32) : sigmoid(rt_, f32);
  }
  Tensor returned;
  if (m.code == MoeRouterCode::qwen) {
    logits.reset();  // router_logits is rebound to the probabilities
    returned = probs;
  } else {
    returned = logits;  // Mixtral returns the raw logits; router_probs dies with the router
  }
  TopkResult top = topk(rt_, probs, T, K, 4);
  probs.reset();
  if (m.norm_topk || m.code == MoeRouterCode::mixtral) {
    Tensor sum = sum_dim(rt_, top.values, T * 4);  // sum(dim=-1, keepdim=True)
    div_inplace(rt_, top.values, sum);
  }
  weights = std::move(top.values);  // .to(router_logits.dtype): fp32 to fp32, the same tensor
  indices = std::move(top.indices);
  return returned;
}

Tensor DecoderModel::moe_experts_eager(const LayerParams& p, const Tensor& x, const Tensor& indices,
                                       const Tensor& weights, const std::vector<int64_t>& counts) {
  (void)indices;  // read by one_hot, which needs no grad: only its size matters
  const MoeSpec& m = arch().moe;
  const uint64_t e = act_elem(), T = s_.rows(), D = static_cast<uint64_t>(s_.d_model);
  const uint64_t E = static_cast<uint64_t>(m.experts), K = static_cast<uint64_t>(m.top_k);
  const uint64_t F = static_cast<uint64_t>(m.expert_d_ff);
  Tensor final_hidden = rt_.alloc(T * D * e, TensorKind::activation, OpKind::fill);  // zeros_like
  Tensor expert_mask, expert_hit;
  {
    const bool was = rt_.grad_enabled;
    rt_.grad_enabled = false;
    expert_mask = moe_scratch(rt_, T * K * E * 8, OpKind::one_hot);  // zeros + scatter_ (CUDA)
    uint64_t hit = 0;
    for (int64_t c : counts) hit += c > 0 ? 1 : 0;
    Tensor gt;
    {
      Tensor sum = moe_scratch(rt_, E * 8, OpKind::sum_dim);  // expert_mask.sum(dim=(-1, -2))
      gt = moe_scratch(rt_, E, OpKind::compare);               // torch.greater(., 0)
    }
    expert_hit = moe_scratch(rt_, hit * 8, OpKind::nonzero);
    gt.reset();
    rt_.grad_enabled = was;
  }
  // The loop's names (they outlive the loop, as Python's do).
  Tensor positions, current_state, gate, up, current;
  const bool autocast = autocast_on();
  for (int64_t ex = 0; ex < m.experts; ++ex) {
    const uint64_t n = static_cast<uint64_t>(counts[static_cast<size_t>(ex)]);
    if (n == 0) continue;  // not in expert_hit
    moe_scratch(rt_, 1, OpKind::compare).reset();  // `expert_idx == self.num_experts`, read by `if`
    positions = moe_scratch(rt_, n * 16, OpKind::nonzero);  // top_k_pos, token_idx = where(...)
    current_state = index_rows(rt_, x, positions, n * 8, n * D * e);
    const double f_up = 2.0 * static_cast<double>(n) * static_cast<double>(D) * 2.0 * static_cast<double>(F);
    Tensor gate_up;
    if (autocast) throw std::runtime_error("model.moe under precision.autocast is not modelled yet");
    {
      Tensor w = select_dim(rt_, rt_.param(p.experts_gate_up), 2 * F * D * s_.elem);
      gate_up = mm_linear(rt_, current_state, w, n * 2 * F * e, f_up);
    }
    {
      Chunk2 halves(rt_, gate_up);
      gate_up.reset();
      gate = halves.piece(rt_, 0);
      up = halves.piece(rt_, 1);
    }
    current = mul(rt_, activation(gate), up);
    {
      Tensor w = select_dim(rt_, rt_.param(p.experts_down), D * F * s_.elem);
      current = mm_linear(rt_, current, w, n * D * e, f_up / 2.0);
    }
    {
      Tensor wsel = index_rows(rt_, weights, positions, n * 8, n * 4);  // (n, 1) fp32
      current = mul_column(rt_, current, wsel, n * D * 4);
    }
    Tensor source = e == 4 ? current : to_copy(rt_, current, n * D * e);  // .to(dtype)
    index_add_(rt_, final_hidden, positions, source);
  }
  // forward returns: its locals die in the frame's order (expert_mask, expert_hit, then
  // the loop's names).
  expert_mask.reset();
  expert_hit.reset();
  positions.reset();
  current_state.reset();
  gate.reset();
  up.reset();
  current.reset();
  return final_hidden;
}

// batched_mm_experts_forward (transformers v5 integrations/moe.py), S = T*K samples:
// zeros_like(x); token_idx = arange(T).unsqueeze(1).expand(-1, K).reshape(-1) (the reshape of
// the expanded arange copies: S int64; the arange dies with the expression); x[token_idx]
// (S, D); gate_up_proj[expert_ids] and down_proj[expert_ids]: every sample's own copy of its
// expert's weights, (S, 2F, D) and (S, D, F), saved by the two bmm's (IndexBackward0 hands
// back a zeros of the whole 3-D weight, accumulated with index_put_); bmm, chunk, act * up,
// bmm; * sample_weights (a view of the router's top-k weights, which the product saves), fp32
// for fp32 weights; .to(dtype); index_add_. The locals die at return (the product last).
Tensor DecoderModel::moe_experts_batched(const LayerParams& p, const Tensor& x, const Tensor& indices,
                                         const Tensor& weights) {
  const MoeSpec& m = arch().moe;
  const uint64_t e = act_elem(), T = s_.rows(), D = static_cast<uint64_t>(s_.d_model);
  const uint64_t K = static_cast<uint64_t>(m.top_k), F = static_cast<uint64_t>(m.expert_d_ff);
  const uint64_t S = T * K, we = weights.bytes / S, pe = std::max(e, we);
  if (autocast_on()) throw std::runtime_error("model.moe under precision.autocast is not modelled yet");
  Tensor final_hidden = rt_.alloc(T * D * e, TensorKind::activation, OpKind::fill);  // zeros_like
  Tensor token_idx;
  {
    Tensor ar = moe_scratch(rt_, T * 8, OpKind::arange);
    token_idx = rt_.alloc(S * 8, TensorKind::activation, OpKind::clone);  // expand(...).reshape(-1)
  }
  Tensor current = index_rows(rt_, x, token_idx, S * 8, S * D * e);
  Tensor sel_gate_up = index_rows(rt_, rt_.param(p.experts_gate_up), indices, S * 8, S * 2 * F * D * s_.elem);
  Tensor sel_down = index_rows(rt_, rt_.param(p.experts_down), indices, S * 8, S * D * F * s_.elem);
  const double f_up = 2.0 * static_cast<double>(S) * static_cast<double>(D) * 2.0 * static_cast<double>(F);
  Tensor gate, up, hidden, out;
  {
    Tensor gate_up = bmm(rt_, sel_gate_up, current, S * 2 * F * e, f_up);
    Chunk2 halves(rt_, gate_up);
    gate_up.reset();
    gate = halves.piece(rt_, 0);
    up = halves.piece(rt_, 1);
  }
  hidden = mul(rt_, activation(gate), up);
  out = bmm(rt_, sel_down, hidden, S * D * e, f_up / 2.0);
  out = pe == e ? mul(rt_, out, weights) : mul_column(rt_, out, weights, S * D * pe);
  {
    Tensor source = pe == e ? out : to_copy(rt_, out, S * D * e);  // .to(dtype)
    index_add_(rt_, final_hidden, token_idx, source);
  }
  // The frame's locals die in order: token_idx, current, the selected weights, gate, up,
  // hidden, then the product.
  token_idx.reset();
  current.reset();
  sel_gate_up.reset();
  sel_down.reset();
  gate.reset();
  up.reset();
  hidden.reset();
  out.reset();
  return final_hidden;
}

// grouped_mm_experts_forward (transformers v5 integrations/moe.py), S = T*K samples:
// zeros_like(x); token_idx (as batched_mm); perm = argsort(expert_ids, stable=True) and
// inv_perm = argsort(perm, stable=True) (each a sort: values and indices S int64, the values
// dying at once); x[token_idx] (S, D); expert_ids[perm] (S int64); sample_weights[perm];
// current[perm] (S, D); histc(expert_ids_g.float()) (an S fp32 copy, E fp32 counts) and
// cumsum(dtype=int32) (E int32, the offsets _grouped_mm keeps); _grouped_mm on the 3-D
// weights (transposed views), chunk, act * up, _grouped_mm; * sample_weights_g (fp32 for fp32
// weights); [inv_perm] back to token order; .to(dtype); index_add_. The frame's locals die
// at return: x[token_idx] (saved by no node: _grouped_mm saves the permuted copy), the
// product before the un-permutation, expert_ids_g, the counts. Modelled from the source only
// (torch 1.13 has no _grouped_mm; CUB's sort and histogram scratch are not modelled).
Tensor DecoderModel::moe_experts_grouped(const LayerParams& p, const Tensor& x, const Tensor& indices,
                                         const Tensor& weights) {
  (void)indices;  // read by argsort and the gathers, which need no grad: only sizes matter
  const MoeSpec& m = arch().moe;
  const uint64_t e = act_elem(), T = s_.rows(), D = static_cast<uint64_t>(s_.d_model);
  const uint64_t E = static_cast<uint64_t>(m.experts), K = static_cast<uint64_t>(m.top_k);
  const uint64_t F = static_cast<uint64_t>(m.expert_d_ff);
  const uint64_t S = T * K, we = weights.bytes / S, pe = std::max(e, we);
  if (autocast_on()) throw std::runtime_error("model.moe under precision.autocast is not modelled yet");
  Tensor final_hidden = rt_.alloc(T * D * e, TensorKind::activation, OpKind::fill);  // zeros_like
  Tensor token_idx, perm, inv_perm;
  {
    Tensor ar = moe_scratch(rt_, T * 8, OpKind::arange);
    token_idx = rt_.alloc(S * 8, TensorKind::activation, OpKind::clone);
  }
  {  // int64 indices: no grad
    Tensor values = moe_scratch(rt_, S * 8, OpKind::sort);
    perm = rt_.alloc(S * 8, TensorKind::activation, OpKind::sort);
    values.reset();
    values = moe_scratch(rt_, S * 8, OpKind::sort);
    inv_perm = rt_.alloc(S * 8, TensorKind::activation, OpKind::sort);
    values.reset();
  }
  Tensor current = index_rows(rt_, x, token_idx, S * 8, S * D * e);
  Tensor expert_ids_g = moe_scratch(rt_, S * 8, OpKind::moe_index);
  Tensor weights_g = index_rows(rt_, weights, perm, S * 8, S * we);
  Tensor current_g = index_rows(rt_, current, perm, S * 8, S * D * e);
  Tensor counts, offsets;
  {
    Tensor f32 = moe_scratch(rt_, S * 4, OpKind::to_copy);  // expert_ids_g.float()
    counts = moe_scratch(rt_, E * 4, OpKind::sort);         // histc
  }
  offsets = rt_.alloc(E * 4, TensorKind::activation, OpKind::sort);  // cumsum(dtype=int32)
  const double f_up = 2.0 * static_cast<double>(S) * static_cast<double>(D) * 2.0 * static_cast<double>(F);
  Tensor gate, up, hidden, out_g, out;
  {
    Tensor gate_up = grouped_mm(rt_, current_g, rt_.param(p.experts_gate_up), offsets, S * 2 * F * e, f_up);
    Chunk2 halves(rt_, gate_up);
    gate_up.reset();
    gate = halves.piece(rt_, 0);
    up = halves.piece(rt_, 1);
  }
  hidden = mul(rt_, activation(gate), up);
  out_g = grouped_mm(rt_, hidden, rt_.param(p.experts_down), offsets, S * D * e, f_up / 2.0);
  out_g = pe == e ? mul(rt_, out_g, weights_g) : mul_column(rt_, out_g, weights_g, S * D * pe);
  out = index_rows(rt_, out_g, inv_perm, S * 8, S * D * pe);  // out_per_sample_g[inv_perm]
  {
    Tensor source = pe == e ? out : to_copy(rt_, out, S * D * e);  // .to(dtype)
    index_add_(rt_, final_hidden, token_idx, source);
  }
  // The frame's locals die in order: token_idx, perm, inv_perm, current, expert_ids_g,
  // weights_g, current_g, counts, offsets, gate, up, hidden, out_g, out.
  token_idx.reset();
  perm.reset();
  inv_perm.reset();
  current.reset();
  expert_ids_g.reset();
  weights_g.reset();
  current_g.reset();
  counts.reset();
  offsets.reset();
  gate.reset();
  up.reset();
  hidden.reset();
  out_g.reset();
  out.reset();
  return final_hidden;
}

// load_balancing_loss_func (v5 models/*/modeling_*.py, attention_mask None) over the router
// outputs the model recorded (output_router_logits), then `loss += router_aux_loss_coef *
// aux_loss` in the CausalLM forward. The recorded tensors are the qwen routers' fp32
// probabilities (alive anyway: softmax saved them) or Mixtral's raw logits.
Tensor DecoderModel::moe_aux_loss(const Tensor& loss) {
  if (router_logits_.empty()) return loss;
  const MoeSpec& m = arch().moe;
  const uint64_t E = static_cast<uint64_t>(m.experts), K = static_cast<uint64_t>(m.top_k);
  Tensor aux;
  {
    // The function's locals, in the order Python assigns them (and clears them at return).
    // concatenated_gate_logits = torch.cat(gate_logits, dim=0): (L*T, E)
    Tensor concat = cat_n(rt_, router_logits_);
    const uint64_t w = router_logits_.front().bytes / (s_.rows() * E);  // their element size
    const uint64_t LT = concat.bytes / (E * w);
    Tensor weights = softmax(rt_, concat);  // routing_weights: saved by SoftmaxBackward0
    // `_, selected_experts = torch.topk(...)`
    TopkResult top = topk(rt_, weights, LT, K, w);
    Tensor expert_mask = moe_scratch(rt_, LT * K * E * 8, OpKind::one_hot);  // int64, no grad
    Tensor tokens_per_expert;
    {
      Tensor f = to_copy(rt_, expert_mask, LT * K * E * 4);  // expert_mask.float()
      tokens_per_expert = mean_dim(rt_, f, K * E * 4);        // mean over dim 0: (K, E)
    }
    Tensor router_prob = mean_dim(rt_, weights, E * w);  // (E): MeanBackward0 keeps sizes
    Tensor overall;
    {
      // tokens_per_expert * router_prob_per_expert.unsqueeze(0): (K, E), the product in the
      // promoted dtype; MulBackward0 saves tokens_per_expert (router_prob's grad needs it).
      Tensor prod = mul(rt_, tokens_per_expert, router_prob, Broadcast::leading_dims, w);
      overall = sum_dim(rt_, prod, 4);  // torch.sum: a 0-dim tensor
    }
    aux = mul_scalar(rt_, overall);  // return overall_loss * num_experts
    // Return: `_` dies unused, and with it TopkBackward0 (never reached by backward) and
    // the indices it saved; selected_experts is the same storage, dying with it.
    concat.reset();
    weights.reset();
    if (top.values.grad_fn >= 0) rt_.release_saved(rt_.node(top.values.grad_fn));
    top.values.reset();
    top.indices.reset();
  }
  router_logits_.clear();  // the model output holding them dies with the loss (HF Trainer)
  Tensor scaled = mul_scalar(rt_, aux);  // router_aux_loss_coef * aux_loss
  aux.reset();
  Tensor out = loss;
  add_(rt_, out, scaled);  // loss += ...
  return out;
}

Tensor DecoderModel::moe_block(int32_t l, const LayerParams& p, const Tensor& x) {
  if (arch().moe.code == MoeRouterCode::deepseek_v3) return moe_block_deepseek(l, p, x);
  ModuleScope module_scope(rt_, Module::mlp);
  const MoeSpec& m = arch().moe;
  const std::vector<int64_t> counts = routed_tokens(m, static_cast<int64_t>(s_.rows()), moe_layer_index(l));
  Tensor shared;
  if (m.shared_d_ff > 0) {  // shared_expert(hidden_states) first (Qwen2-MoE): Qwen2MoeMLP
    Tensor h;
    {
      Tensor a = activation(project(x, p, p.gate));
      Tensor u = project(x, p, p.up);
      h = mul(rt_, a, u);
    }
    shared = project(h, p, p.down);
  }
  Tensor weights, indices;
  Tensor router_logits = moe_router(p, x, weights, indices);  // `_`: a local until return
  Tensor out;
  switch (m.impl) {
    case ExpertsImpl::eager: out = moe_experts_eager(p, x, indices, weights, counts); break;
    case ExpertsImpl::batched_mm: out = moe_experts_batched(p, x, indices, weights); break;
    case ExpertsImpl::grouped_mm: out = moe_experts_grouped(p, x, indices, weights); break;
  }
  if (m.shared_d_ff > 0) {
    // shared = sigmoid(shared_expert_gate(x)) * shared; expert_output += shared
    Tensor g = project(x, p, p.shared_gate_proj);
    g = sigmoid(rt_, g);
    shared = mul(rt_, g, shared);
    g.reset();
    out = add_(rt_, out, shared);
  }
  // The block returns: `_`, routing_weights, selected_experts, then the shared output. The
  // OutputRecorder keeps the router's first output for the aux loss (output_router_logits).
  if (m.output_router_logits) router_logits_.push_back(router_logits);
  router_logits.reset();
  weights.reset();
  indices.reset();
  shared.reset();
  return out;
}

}  // namespace memsim::graph
