// DecoderModel's mixture-of-experts layers (graph/models/decoder.h; docs/moe.md): the sparse
// MoE block that replaces a layer's MLP when DecoderArch::moe says the layer is sparse.
//
// Modelled from transformers 5.17.0 as installed on the GPU machine (2026-11-27; read there,
// not committed): integrations/moe.py and models/{qwen3_moe,qwen2_moe,mixtral,olmoe}/
// modeling_*.py (docs/moe.md "What transformers 5.17 changed" lists what differs from the
// earlier v5 code this file was first written from):
//  - the block (Qwen3MoeSparseMoeBlock / OlmoeSparseMoeBlock / MixtralSparseMoeBlock):
//    x.view(-1, D); `_, routing_weights, selected_experts = self.gate(x)` (all three locals
//    live until the block returns); experts(x, selected_experts, routing_weights);
//    Qwen2MoeSparseMoeBlock first runs its shared expert, then scales it by
//    sigmoid(shared_expert_gate(x)) and adds it out of place;
//  - the router (MoeRouterCode): F.linear to (T, E) in the model dtype (returned: the
//    block's `_`), softmax in fp32 (a (T, E) fp32 copy first for 16-bit logits), topk, the
//    in-place renormalisation, and for the Qwen-style routers .to(router_logits.dtype);
//  - the eager experts (Qwen3MoeExperts.forward): zeros_like(x); under no_grad one_hot
//    (T, K, E) int64 (alive until forward returns), its sum over (K, T), greater, nonzero;
//    then for every expert that got tokens, in order: `expert_idx == num_experts` (a 1-byte
//    bool), torch.where(expert_mask[e]) (nonzero: (n, 2) int64, whose two column views are
//    top_k_pos and token_idx), hidden_states[token_idx] (n, D), F.linear with the selected
//    gate_up_proj[e] (a view; SelectBackward0 hands back a zeros of the whole 3-D weight),
//    chunk, act(gate) * up, F.linear with down_proj[e], * top_k_weights[token_idx,
//    top_k_pos, None] ((n, 1) in the weights' dtype: the product is fp32 only for Mixtral's
//    fp32 weights in a 16-bit model), .to(dtype), index_add_. Every
//    size is n, the tokens routed to that expert (graph/models/moe_routing.h). The loop's
//    last locals live until forward returns.
// And batched_mm_experts_forward / grouped_mm_experts_forward (experts_implementation, below).
// The auxiliary load-balancing loss (output_router_logits): moe_aux_loss below. LoRA
// (get_peft_model freezes the router and the 3-D experts; adapters only on nn.Linear
// modules: attention and the shared expert) and autocast (the eager experts:
// expert_linear_autocast; batched_mm and grouped_mm: their own comments) compose with the block: docs/moe.md "Composing". LoRA on the
// experts themselves (PEFT's target_parameters, lora.target_parameters): each of the three
// experts forwards runs under the ParamWrappers of graph/models/moe_param_lora.h (their deltas
// first, the merged weights read through them, the wrappers' exits after the frame's locals die).
// QLoRA (lora.base_dtype nf4): the shared expert and its gate go through add_proj, so they are
// bitsandbytes Linear4bit; the router and the 3-D experts are plain parameters in the model
// dtype, as transformers 5.x's replace_with_bnb_linear (nn.Linear modules only) leaves them
// (docs/moe.md "QLoRA on a mixture-of-experts model").
#include <algorithm>
#include <string>

#include "graph/autocast.h"
#include "graph/models/decoder.h"
#include "graph/models/moe_param_lora.h"
#include "graph/models/moe_routing.h"
#include "graph/ops/ops_moe.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

// ParamWrapper.update_layer per targeted 3-D parameter (graph/models/moe_param_lora.h): the
// inner wrapper (gate_up_proj when both are targeted) is mlp.experts.base_layer.
void DecoderModel::add_experts_adapters(LayerParams& p, const std::string& pre) {
  if (p.experts_gate_up < 0) return;  // not a MoE layer's block (every MoE row sets both)
  const MoeSpec& m = arch().moe;
  const uint64_t E = static_cast<uint64_t>(m.experts), D = static_cast<uint64_t>(s_.d_model);
  const uint64_t F = static_cast<uint64_t>(m.expert_d_ff), r = static_cast<uint64_t>(s_.lora.rank);
  const bool gu = lora_.targets(kExpertsGateUp), dn = lora_.targets(kExpertsDown);
  rt_.ctx.module = Module::mlp;
  if (gu)
    p.experts_ad[0] = add_experts_adapter(rt_, E, 2 * F, D, r, s_.lora.adapter_elem,
                                          pre + (dn ? "mlp.experts.base_layer" : "mlp.experts"));
  if (dn) p.experts_ad[1] = add_experts_adapter(rt_, E, D, F, r, s_.lora.adapter_elem, pre + "mlp.experts");
}

int64_t DecoderModel::moe_layer_index(int32_t l) const {
  int64_t k = 0;
  for (int32_t i = 0; i < l; ++i) k += arch().moe.layer_is_moe(i) ? 1 : 0;
  return k;
}

namespace {

// The ParamWrapper target of slot 0 (gate_up_proj (E, 2F, D)) or 1 (down_proj (E, D, F)) of a
// layer's experts (an undefined adapter: not targeted), for the three experts forwards.
ExpertsParamLora::Target experts_target(const LoraAdapter (&ad)[2], int32_t gate_up, int32_t down, uint64_t D,
                                        uint64_t F, int slot) {
  if (slot == 0) return {ad[0], gate_up, 2 * F, D};
  return {ad[1], down, D, F};
}

}  // namespace

// Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock registration (v5): gate, experts, then the
// shared expert and its gate.
void DecoderModel::construct_moe(LayerParams& p, const std::string& pre) {
  const MoeSpec& m = arch().moe;
  if (m.code == MoeRouterCode::deepseek_v3 || m.code == MoeRouterCode::deepseek_v2)
    return construct_moe_deepseek(p, pre);  // decoder_moe_deepseek.cpp
  const uint64_t e = s_.elem, D = static_cast<uint64_t>(s_.d_model);
  const uint64_t E = static_cast<uint64_t>(m.experts), F = static_cast<uint64_t>(m.expert_d_ff);
  p.moe = true;
  p.router = rt_.add_parameter(E * D * e, param_name(pre, "mlp.gate", ".weight"));
  rt_.parameters()[p.router].rows = E;
  p.experts_gate_up = rt_.add_parameter(E * 2 * F * D * e, param_name(pre, "mlp.experts", ".gate_up_proj"));
  p.experts_down = rt_.add_parameter(E * D * F * e, param_name(pre, "mlp.experts", ".down_proj"));
  // shape[0] is the expert dimension: FSDP2's per-parameter sharding chunks the 3-D weights
  // by whole experts (torch.chunk on dim 0), ceil(E / world) of them on rank 0.
  rt_.parameters()[p.experts_gate_up].rows = E;
  rt_.parameters()[p.experts_down].rows = E;
  if (m.shared_d_ff > 0) {
    const uint64_t S = static_cast<uint64_t>(m.shared_d_ff);
    // PEFT's target_modules gate_proj / up_proj / down_proj match these by suffix (the
    // routed experts are 3-D parameters, never wrapped): the LoRA slots of a dense MLP.
    p.gate = add_proj(S, D, pre, "mlp.shared_expert.gate_proj", false, kGateProj);
    p.up = add_proj(S, D, pre, "mlp.shared_expert.up_proj", false, kUpProj);
    p.down = add_proj(D, S, pre, "mlp.shared_expert.down_proj", false, kDownProj);
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
                      : mm_linear(rt_, x, rt_.param(p.router), T * E * s_.elem, flops, LinearInput::flat);
  const uint64_t le = logits.bytes / (T * E);  // the logits' element size
  // softmax(logits, dtype=float) / softmax(logits.float()): a 16-bit input is copied to fp32
  // first (the copy dies with the expression); sigmoid likewise.
  Tensor probs;
  {
    Tensor f32 = le == 4 ? logits : to_copy(rt_, logits, T * E * 4);
    probs = m.score == MoeScore::softmax ? softmax(rt_, f32) : sigmoid(rt_, f32);
  }
  // transformers 5.17: both router codes return the raw logits (the block's `_`, alive until
  // it returns); router_probs is a local the softmax's backward keeps anyway.
  Tensor returned = logits;
  TopkResult top = topk(rt_, probs, T, K, 4);
  probs.reset();
  if (m.norm_topk || m.code == MoeRouterCode::mixtral) {
    Tensor sum = sum_dim(rt_, top.values, T * 4);  // sum(dim=-1, keepdim=True)
    div_inplace(rt_, top.values, sum);
  }
  // Qwen-style: router_top_value.to(router_logits.dtype): a (T, K) copy in the model dtype for
  // 16-bit logits (the fp32 values die: DivBackward0 saved its clone); Mixtral keeps fp32.
  if (m.code == MoeRouterCode::qwen && le != 4) {
    Tensor cast = to_copy(rt_, top.values, T * K * le);
    top.values = std::move(cast);
  }
  weights = std::move(top.values);
  indices = std::move(top.indices);
  return returned;
}

// F.linear(a, W[expert]) in the eager loop under autocast (linear is on CUDA's and CPU's
// lower-precision lists): the wrapper casts right to left, the weight first. W[expert] is a
// select view of the 3-D fp32 parameter, not a leaf, so cached_cast never caches it: every
// expert that gets tokens makes its own low-precision copy of its weight slice, which mm
// saves for the input's grad (so each MoE layer keeps a low copy of every hit expert's
// weights until backward). Then a's copy unless it is already low (the gathered fp32 hidden
// states are cast, the bf16 act*up product is not). In backward the slice's low grad goes
// up to fp32 in ToCopyBackward0 before SelectBackward0's zeros of the whole fp32 weight.
Tensor DecoderModel::expert_linear_autocast(const Tensor& a, const Tensor& w_view, uint64_t rows,
                                            uint64_t d_in, uint64_t d_out, double flops) {
  const uint64_t low = ac_->low_elem();
  Tensor wc = ac_->cast(w_view, d_out * d_in * low);
  Tensor ac = a.bytes == rows * d_in * low ? a : ac_->cast(a, rows * d_in * low);
  return mm_linear(rt_, ac, wc, rows * d_out * low, flops);
}

Tensor DecoderModel::moe_experts_eager(const LayerParams& p, const Tensor& x, const Tensor& indices,
                                       const Tensor& weights, const std::vector<int64_t>& counts) {
  (void)indices;  // read by one_hot, which needs no grad: only its size matters
  const MoeSpec& m = arch().moe;
  const uint64_t e = act_elem(), T = s_.rows(), D = static_cast<uint64_t>(s_.d_model);
  const uint64_t E = static_cast<uint64_t>(m.experts), K = static_cast<uint64_t>(m.top_k);
  const uint64_t F = static_cast<uint64_t>(m.expert_d_ff);
  const uint64_t we = weights.bytes / (T * K), pe = std::max(e, we);  // weight / product element
  // x's element size: the model dtype, or fp32 under autocast over fp32 weights (the norm's
  // output); e is what the linears produce (the low dtype under autocast).
  const uint64_t xe = x.bytes / (T * D);
  // lora.target_parameters: the ParamWrappers around this forward (moe_param_lora.h).
  ExpertsParamLora wrap(rt_, E, static_cast<uint64_t>(s_.lora.rank), s_.lora.adapter_elem, s_.elem,
                        experts_target(p.experts_ad, p.experts_gate_up, p.experts_down, D, F, 0),
                        experts_target(p.experts_ad, p.experts_gate_up, p.experts_down, D, F, 1),
                        autocast_on() ? ac_ : nullptr);
  wrap.enter();
  Tensor final_hidden = rt_.alloc(T * D * xe, TensorKind::activation, OpKind::fill);  // zeros_like
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
    current_state = index_rows(rt_, x, positions, n * 8, n * D * xe);
    const double f_up = 2.0 * static_cast<double>(n) * static_cast<double>(D) * 2.0 * static_cast<double>(F);
    Tensor gate_up;
    {
      Tensor w = select_dim(rt_, wrap.weight(0), 2 * F * D * s_.elem);
      gate_up = autocast ? expert_linear_autocast(current_state, w, n, D, 2 * F, f_up)
                         : mm_linear(rt_, current_state, w, n * 2 * F * e, f_up);
    }
    {
      Chunk2 halves(rt_, gate_up);
      gate_up.reset();
      gate = halves.piece(rt_, 0);
      up = halves.piece(rt_, 1);
    }
    current = mul(rt_, activation(gate), up);
    {
      Tensor w = select_dim(rt_, wrap.weight(1), D * F * s_.elem);
      current = autocast ? expert_linear_autocast(current, w, n, F, D, f_up / 2.0)
                         : mm_linear(rt_, current, w, n * D * e, f_up / 2.0);
    }
    {
      // top_k_weights[token_idx, top_k_pos, None]: (n, 1) in the router's weight dtype (fp32
      // for Mixtral, the model dtype for the Qwen-style routers); the product is promoted.
      Tensor wsel = index_rows(rt_, weights, positions, n * 8, n * we);
      current = mul_column(rt_, current, wsel, n * D * pe);
    }
    // .to(final_hidden_states.dtype): a copy when the product's dtype is not x's (Mixtral's
    // fp32 product in a 16-bit model; under autocast the bf16 product of a Qwen-style router
    // going up to the fp32 x).
    Tensor source = pe == xe ? current : to_copy(rt_, current, n * D * xe);
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
  wrap.exit();
  return final_hidden;
}

// batched_mm_experts_forward (transformers 5.17.0 integrations/moe.py:112-176), S = T*K samples:
// hidden_states.repeat_interleave(K, dim=0) (torch's Repeat.cpp for an int repeats:
// unsqueeze, expand, a contiguous clone (S, D), flatten; backward the expand's sum to (T, D));
// expert_ids.clamp(0, E-1) (a new S int64, out of place); gate_up_proj[expert_ids] and
// down_proj[expert_ids]: every sample's own copy of its expert's weights, (S, 2F, D) and
// (S, D, F), saved by the two bmm's (IndexBackward0 hands back a zeros of the whole 3-D weight,
// accumulated with index_put_); bmm, _apply_gate (chunk, act * up), bmm; * sample_weights (a
// view of the router's top-k weights, which the product saves; fp32 weights promote it);
// .view(T, K, D).sum(dim=1) (no index_add_: the sum's grad is an expand the view's backward
// reshapes with a copy); .to(dtype). The frame's locals die at return, in order.
// Under autocast (docs/moe.md "batched_mm and grouped_mm under autocast"): bmm is on CUDA's
// lower-precision list (aten/src/ATen/autocast_mode.h AT_FORALL_LOWER_PRECISION_FP), so each
// bmm casts its fp32 operands, right to left as the wrapper evaluates them: the fp32 repeated
// states (S, D) to bf16, then the fp32 gathered weight copy (a non-leaf: never cached) to its
// own bf16 copy, both saved by the bmm; the fp32 gathers live on as the frame's locals (the
// gate_up one until `selected_weights` is rebound). The down bmm's input is already bf16.
// The product is bf16 (Qwen-style bf16 top-k weights) or fp32 (Mixtral's), and sum is CUDA's
// fp32_set_opt_dtype: an fp32 (T, D) straight from a bf16 input (no input copy on CUDA:
// make_reduction_from_out_ty), so `.to(hidden_states.dtype)` (fp32) copies nothing. Backward:
// each bmm's bf16 grads go up to fp32 in their ToCopyBackward0 (the (S, 2F, D) and (S, D, F)
// weight grads before IndexBackward0's fp32 zeros of the 3-D weight).
Tensor DecoderModel::moe_experts_batched(const LayerParams& p, const Tensor& x, const Tensor& indices,
                                         const Tensor& weights) {
  (void)indices;  // read by clamp, which needs no grad: only its size matters
  const MoeSpec& m = arch().moe;
  const uint64_t e = act_elem(), T = s_.rows(), D = static_cast<uint64_t>(s_.d_model);
  const uint64_t K = static_cast<uint64_t>(m.top_k), F = static_cast<uint64_t>(m.expert_d_ff);
  const uint64_t S = T * K, we = weights.bytes / S, pe = std::max(e, we);
  const bool ac = autocast_on();
  const uint64_t xe = x.bytes / (T * D);                     // hidden_states' element size
  const uint64_t low = ac ? ac_->low_elem() : e;              // what the bmm's produce
  // lora.target_parameters: the ParamWrappers around this forward (moe_param_lora.h); the
  // gathers read the merged weights, which the cache keeps until the wrappers' exits
  // (IndexBackward0 saves only the indices), while the bmm's save the gathered copies.
  ExpertsParamLora wrap(rt_, static_cast<uint64_t>(m.experts), static_cast<uint64_t>(s_.lora.rank),
                        s_.lora.adapter_elem, s_.elem,
                        experts_target(p.experts_ad, p.experts_gate_up, p.experts_down, D, F, 0),
                        experts_target(p.experts_ad, p.experts_gate_up, p.experts_down, D, F, 1),
                        ac ? ac_ : nullptr);
  wrap.enter();
  Tensor current = expand_clone(rt_, x, K);                        // selected_hidden_states
  Tensor expert_ids = moe_scratch(rt_, S * 8, OpKind::moe_index);  // clamp (out of place)
  Tensor sel_gate_up = index_rows(rt_, wrap.weight(0), expert_ids, S * 8, S * 2 * F * D * s_.elem);
  const double f_up = 2.0 * static_cast<double>(S) * static_cast<double>(D) * 2.0 * static_cast<double>(F);
  Tensor proj;
  {
    Tensor gate_up;
    if (ac) {  // bmm(selected_weights, current.unsqueeze(-1)): current's cast, then the weights'
      Tensor b = current.bytes == S * D * low ? current : ac_->cast(current, S * D * low);
      Tensor a = ac_->cast(sel_gate_up, S * 2 * F * D * low);
      gate_up = bmm(rt_, a, b, S * 2 * F * low, f_up);
    } else {
      gate_up = bmm(rt_, sel_gate_up, current, S * 2 * F * e, f_up);
    }
    Chunk2 halves(rt_, gate_up);
    gate_up.reset();
    Tensor gate = halves.piece(rt_, 0), up = halves.piece(rt_, 1);
    proj = mul(rt_, activation(gate), up);  // _apply_gate's locals die with it
  }
  // selected_weights is rebound (the gate_up copy lives on in its bmm's saved tensors)
  Tensor sel_down = index_rows(rt_, wrap.weight(1), expert_ids, S * 8, S * D * F * s_.elem);
  sel_gate_up.reset();
  if (ac) {  // proj is already low: only the gathered weights are cast
    Tensor a = ac_->cast(sel_down, S * D * F * low);
    proj = bmm(rt_, a, proj, S * D * low, f_up / 2.0);
  } else {
    proj = bmm(rt_, sel_down, proj, S * D * e, f_up / 2.0);
  }
  const uint64_t we_prod = std::max(low, we);  // the product's element size
  Tensor weighted = we_prod == low ? mul(rt_, proj, weights) : mul_column(rt_, proj, weights, S * D * we_prod);
  // view(T,K,D).sum(1): under autocast CUDA's sum gives fp32 for a bf16 input.
  const uint64_t se = ac ? 4 : pe;
  Tensor final_hidden = sum_dim(rt_, view(rt_, weighted, true), T * D * se);
  Tensor out;
  if (ac)
    out = se == xe ? final_hidden : to_copy(rt_, final_hidden, T * D * xe);  // .to(hidden_states.dtype)
  else
    out = pe == e ? final_hidden : to_copy(rt_, final_hidden, T * D * e);  // .to(dtype)
  // The frame's locals die in order: selected_hidden_states, expert_ids, selected_weights,
  // proj_out, weighted_out, final_hidden_states.
  current.reset();
  expert_ids.reset();
  sel_down.reset();
  proj.reset();
  weighted.reset();
  final_hidden.reset();
  wrap.exit();
  return out;
}

// grouped_mm_experts_forward (transformers 5.17.0 integrations/moe.py:377-481), S = T*K
// samples, checked against the H200 trace of moe_tf_qwen3_moe_bf16_balanced_grouped_mm
// (tests/data/gpu/moe/moe_snapshots.tar.xz, layer 0's experts): torch.sort(expert_ids)
// (values expert_ids_g and perm, S int64 each; the stable CUDA sort's S int64 iota dies with
// it); hidden_states[perm // K] (the quotient S int64, saved by the gather) (S, D);
// sample_weights[perm] (S, in the weights' dtype); expert_ids_g.int() (S int32, CUDA's histc
// input), histc (E), cumsum(dtype=int32) (E, the offsets both _grouped_mm keep);
// sentinel_mask = (expert_ids_g >= E) (S bool, saved by the three masked_fills);
// clamp_ (in place); masked_fill_ of the gathered states (in place); _grouped_mm (S, 2F), then
// an out-of-place masked_fill (the mm output freed at once: _grouped_mm saves its inputs, not
// its output); _apply_gate; _grouped_mm (S, D) and its masked copy; * sample_weights_g
// (saves both); inv_perm = empty_like(perm) and inv_perm[perm] = arange(S) (the arange dies);
// weighted_out[inv_perm] (the product freed, rebound); .view(T, K, D).sum(dim=1) (no
// index_add_); .to(dtype). The frame's locals die at return in order. Not modelled: the
// sub-MiB CUB scratch of the sort, cumsum and the grouped GEMM (small pool).
// Under autocast (docs/moe.md "batched_mm and grouped_mm under autocast"): torch._grouped_mm
// is on no autocast list (aten/src/ATen/autocast_mode.h; pytorch/pytorch#174763: not
// registered for autocast), and transformers hands it `input.to(weight.dtype)`
// (huggingface/transformers#43839, the fix of #43828), so over fp32 weights the whole
// function runs in fp32: the gathered states (the norm's fp32 output), both _grouped_mm
// (aten/src/ATen/native/GroupedMMUtils.h _grouped_mm_fallback for non-bf16 operands: the
// offsets copied to the host, one mm_out per group into row slices of the output: no further
// device allocation), the gate, the masked copies;
// no cast, no weight-cast cache entry. The Qwen-style bf16 top-k weights promote the
// product to fp32 (their grad is cast back); the sum is fp32 and `.to(dtype)` copies nothing.
// Blind: the measured run (tools/gpu/measure_moe_autocast.py *_grouped_mm) records the
// installed moe.py and whether autocast has a kernel for aten::_grouped_mm.
Tensor DecoderModel::moe_experts_grouped(const LayerParams& p, const Tensor& x, const Tensor& indices,
                                         const Tensor& weights) {
  (void)indices;  // read by sort, which needs no grad: only its size matters
  const MoeSpec& m = arch().moe;
  const uint64_t T = s_.rows(), D = static_cast<uint64_t>(s_.d_model);
  // e: the element size the experts compute in: the model's, or under autocast hidden_states'
  // (fp32 over fp32 weights: nothing here is autocast's).
  const uint64_t e = autocast_on() ? x.bytes / (T * D) : act_elem();
  const uint64_t E = static_cast<uint64_t>(m.experts), K = static_cast<uint64_t>(m.top_k);
  const uint64_t F = static_cast<uint64_t>(m.expert_d_ff);
  const uint64_t S = T * K, we = weights.bytes / S, pe = std::max(e, we);
  // lora.target_parameters: the ParamWrappers around this forward (moe_param_lora.h). Each
  // _grouped_mm takes the merged weight (through a transpose view) and saves it as mat2 when
  // its input requires grad, so the merged weights then live until that layer's backward;
  // grad_mat2 comes back in mat2's layout (derivatives.yaml _grouped_mm_mat2_backward gets
  // mat2's strides), a contiguous (E, out, in) grad of the merged weight after the view.
  ExpertsParamLora wrap(rt_, E, static_cast<uint64_t>(s_.lora.rank), s_.lora.adapter_elem, s_.elem,
                        experts_target(p.experts_ad, p.experts_gate_up, p.experts_down, D, F, 0),
                        experts_target(p.experts_ad, p.experts_gate_up, p.experts_down, D, F, 1),
                        autocast_on() ? ac_ : nullptr);
  wrap.enter();
  Tensor expert_ids_g, perm;
  {  // int64 indices: no grad
    expert_ids_g = moe_scratch(rt_, S * 8, OpKind::sort);
    perm = rt_.alloc(S * 8, TensorKind::activation, OpKind::sort);
    moe_scratch(rt_, S * 8, OpKind::sort).reset();  // the iota the stable sort permutes
  }
  Tensor current_g;
  {
    Tensor quotient = rt_.alloc(S * 8, TensorKind::activation, OpKind::moe_index);  // perm // K
    current_g = index_rows(rt_, x, quotient, S * 8, S * D * e);
  }
  Tensor weights_g = index_rows(rt_, weights, perm, S * 8, S * we);
  Tensor histc_input = moe_scratch(rt_, S * 4, OpKind::to_copy);  // expert_ids_g.int()
  Tensor counts = moe_scratch(rt_, E * 4, OpKind::sort);          // histc
  Tensor offsets = rt_.alloc(E * 4, TensorKind::activation, OpKind::sort);  // cumsum(dtype=int32)
  Tensor mask = rt_.alloc(S, TensorKind::activation, OpKind::compare);     // sentinel_mask
  current_g = masked_fill(rt_, current_g, mask, true);
  const double f_up = 2.0 * static_cast<double>(S) * static_cast<double>(D) * 2.0 * static_cast<double>(F);
  Tensor proj;
  {
    // `selected_weights = self.gate_up_proj` (the first read makes the merged weight)
    Tensor gate_up = grouped_mm(rt_, current_g, wrap.weight(0), offsets, S * 2 * F * e, f_up);
    gate_up = masked_fill(rt_, gate_up, mask, false);
    Chunk2 halves(rt_, gate_up);
    gate_up.reset();
    Tensor gate = halves.piece(rt_, 0), up = halves.piece(rt_, 1);
    proj = mul(rt_, activation(gate), up);  // _apply_gate's locals die with it
  }
  proj = grouped_mm(rt_, proj, wrap.weight(1), offsets, S * D * e, f_up / 2.0);
  proj = masked_fill(rt_, proj, mask, false);
  // (under autocast the fp32 product of Qwen-style bf16 weights: a mixed-dtype column product)
  Tensor weighted = pe == e && we == e ? mul(rt_, proj, weights_g) : mul_column(rt_, proj, weights_g, S * D * pe);
  Tensor inv_perm = rt_.alloc(S * 8, TensorKind::activation, OpKind::sort);  // empty_like(perm)
  moe_scratch(rt_, S * 8, OpKind::arange).reset();  // inv_perm[perm] = arange(S): index_put_
  weighted = index_rows(rt_, weighted, inv_perm, S * 8, S * D * pe);
  Tensor final_hidden = sum_dim(rt_, view(rt_, weighted, true), T * D * pe);  // view(T,K,D).sum(1)
  Tensor out = pe == e ? final_hidden : to_copy(rt_, final_hidden, T * D * e);  // .to(dtype)
  // The frame's locals die in order: expert_ids_g, perm, selected_hidden_states_g,
  // sample_weights_g, histc_input, tokens_per_expert, offsets, sentinel_mask, proj_out,
  // weighted_out, inv_perm, final_hidden_states.
  expert_ids_g.reset();
  perm.reset();
  current_g.reset();
  weights_g.reset();
  histc_input.reset();
  counts.reset();
  offsets.reset();
  mask.reset();
  proj.reset();
  weighted.reset();
  inv_perm.reset();
  final_hidden.reset();
  wrap.exit();
  return out;
}

// load_balancing_loss_func (transformers 5.17.0 models/qwen3_moe/modeling_qwen3_moe.py:514-580,
// the same in the other three; attention_mask None) over the router outputs the model recorded
// (output_router_logits: every router's raw logits, in the model dtype), then
// `loss += router_aux_loss_coef * aux_loss` in the CausalLM forward. 5.17 accumulates layer by
// layer (no torch.cat, no one_hot): zeros(E) fp32 twice; per layer softmax (saved), topk
// (`_` and selected_experts rebound by the next layer), bincount (E int64, after CUDA's min()
// and max() checks: two 0-d temporaries) .float() and an out-of-place add; .float() of the
// probabilities (a (T, E) fp32 copy for 16-bit ones), sum(dim=0), an out-of-place add (with
// grad); then the two divisions by the row count (a Python float), the product (MulBackward0
// saves tokens_per_expert), the sum and `* num_experts`. Under autocast the softmax gets
// dtype=float32 (CPU fixtures autocast_*_aux_*, with CUDA's rule applied by the stand-in).
Tensor DecoderModel::moe_aux_loss(const Tensor& loss) {
  if (router_logits_.empty()) return loss;
  const MoeSpec& m = arch().moe;
  const uint64_t E = static_cast<uint64_t>(m.experts), K = static_cast<uint64_t>(m.top_k);
  const uint64_t T = s_.rows();
  Tensor aux;
  {
    // The function's locals, in the order Python assigns them (and clears them at return).
    Tensor tokens_sum = new_tensor(rt_, E * 4, OpKind::zeros);  // tokens_per_expert_sum
    Tensor prob_sum = new_tensor(rt_, E * 4, OpKind::zeros);    // router_prob_sum
    Tensor weights, unused, selected;
    for (const Tensor& layer_gate : router_logits_) {
      // Under autocast the logits are low precision (the router linear is autocast's) and
      // softmax is CUDA's fp32_set_opt_dtype: an fp32 copy of them, fp32 probabilities
      // (saved), so the topk values are fp32 and `.float()` copies nothing.
      const bool up = autocast_on() && layer_gate.bytes / (T * E) < 4;
      const uint64_t w = up ? 4 : layer_gate.bytes / (T * E);  // the probabilities' element size
      weights = up ? ac_->fp32_softmax(layer_gate)  // routing_weights: saved by SoftmaxBackward0
                   : softmax(rt_, layer_gate);
      {
        TopkResult top = topk(rt_, weights, T, K, w);
        // `_, selected_experts = ...`: the previous `_` dies, and with it its TopkBackward0
        // (never reached by backward) and the indices it saved, then the previous indices.
        if (unused.grad_fn >= 0) rt_.release_saved(rt_.node(unused.grad_fn));
        unused = std::move(top.values);
        selected = std::move(top.indices);
      }
      {
        moe_scratch(rt_, 8, OpKind::reduce_max).reset();  // self.min() (CUDA's check)
        moe_scratch(rt_, 8, OpKind::reduce_max).reset();  // self.max()
        Tensor counts = moe_scratch(rt_, E * 8, OpKind::sort);  // bincount (a histogram, as histc)
        Tensor f = to_copy(rt_, counts, E * 4);  // .float()
        counts.reset();
        tokens_sum = add(rt_, tokens_sum, f);
      }
      {
        Tensor f = w == 4 ? weights : to_copy(rt_, weights, T * E * 4);  // routing_weights.float()
        Tensor col = sum_dim(rt_, f, E * 4);                               // .sum(dim=0)
        f.reset();
        prob_sum = add(rt_, prob_sum, col);
      }
    }
    Tensor tokens = div_scalar(rt_, tokens_sum);  // tokens_per_expert_sum / total_rows
    Tensor prob = div_scalar(rt_, prob_sum);      // router_prob_sum / total_rows
    Tensor overall;
    {
      // tokens_per_expert * router_prob_per_expert.unsqueeze(0): (1, E) fp32; MulBackward0
      // saves tokens_per_expert (router_prob's grad needs it).
      Tensor prod = mul(rt_, tokens, prob);
      overall = sum_dim(rt_, prod, 4);  // torch.sum: a 0-d tensor
    }
    aux = mul_scalar(rt_, overall);  // return overall_loss * num_experts
    // Return: the frame's locals die in order (tokens_per_expert_sum, router_prob_sum,
    // routing_weights, `_` with its TopkBackward0, selected_experts, tokens_per_expert,
    // router_prob_per_expert, overall_loss).
    tokens_sum.reset();
    prob_sum.reset();
    weights.reset();
    if (unused.grad_fn >= 0) rt_.release_saved(rt_.node(unused.grad_fn));
    unused.reset();
    selected.reset();
    tokens.reset();
    prob.reset();
    overall.reset();
  }
  router_logits_.clear();  // the model output holding them dies with the loss (HF Trainer)
  Tensor scaled = mul_scalar(rt_, aux);  // router_aux_loss_coef * aux_loss
  aux.reset();
  Tensor out = loss;
  out = add_(rt_, out, scaled);  // loss += ... (the returned handle carries AddBackward0)
  return out;
}

Tensor DecoderModel::moe_block(int32_t l, const LayerParams& p, const Tensor& x) {
  if (arch().moe.code == MoeRouterCode::deepseek_v3 || arch().moe.code == MoeRouterCode::deepseek_v2)
    return moe_block_deepseek(l, p, x);
  ModuleScope module_scope(rt_, Module::mlp);
  // The block works on hidden_states.view(-1, D), a 2-D tensor of its own: the router's,
  // the shared expert's and the shared gate's linears hand back dense mm results for it,
  // as the experts' hidden_states[token_idx] does (IndexBackward0: a zeros + index_put_),
  // so the view's InputBuffer adds them all in place (the H200 trace of transformers
  // 5.17's Qwen2-MoE has no sum there; docs/input-buffer.md). The single grad it then hands
  // to the norm is a view, the norm's only one.
  struct Restore {
    LinearInput& v;
    LinearInput was;
    ~Restore() { v = was; }
  } restore{linear_input_, linear_input_};
  linear_input_ = LinearInput::flat;
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
    // shared = sigmoid(shared_expert_gate(x)) * shared; expert_output = expert_output + shared
    // (5.17 modeling_qwen2_moe.py:359: out of place, the experts' output dies on the rebind)
    Tensor g = project(x, p, p.shared_gate_proj);
    g = sigmoid(rt_, g);
    shared = mul(rt_, g, shared);
    g.reset();
    if (autocast_on() && shared.bytes < out.bytes) {
      // Under autocast the experts' output is fp32 (index_add_ into zeros_like(x)) and the
      // shared expert's is low: the add promotes, and in backward validate_outputs casts the
      // fp32 grad of the low input back (as the residual adds).
      Tensor sum = add(rt_, out, ac_->widen(shared));
      Autocast::promoted(rt_, sum, 1, shared);
      out = std::move(sum);
    } else {
      out = add(rt_, out, shared);
    }
  }
  // The block returns: `_`, routing_weights, selected_experts, then the shared output. The
  // OutputRecorder keeps the router's first output for the aux loss (output_router_logits),
  // only while the model's forward runs: capture_outputs sets its collector (a ContextVar)
  // around the forward and resets it after (transformers utils/output_capturing.py), so a
  // checkpointed layer re-run in backward records nothing.
  if (m.output_router_logits && !rt_.recomputing) router_logits_.push_back(router_logits);
  router_logits.reset();
  weights.reset();
  indices.reset();
  shared.reset();
  return out;
}

}  // namespace memsim::graph
