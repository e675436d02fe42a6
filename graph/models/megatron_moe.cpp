// MegatronModel's Megatron-Core MoE layers (graph/models/megatron.h; docs/moe-megatron.md):
// MoELayer.forward as it runs in training for family megatron's GeLU MLPs with biases.
//
// Modelled from NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
// megatron/core/transformer/moe/: moe_layer.py (MoELayer.forward's custom_forward: shared
// experts, route, preprocess, dispatch, routed_experts_compute, combine, postprocess; the
// `moe` and `shared_experts` recompute modules), router.py (TopKRouter: gating through
// RouterGatingLinearFunction in the input dtype, moe_router_dtype unset), moe_utils.py
// (topk_routing_with_score_function, apply_router_token_dropping, permute / unpermute with
// moe_permute_fusion off), token_dispatcher.py (MoEAllGatherTokenDispatcher,
// MoEAlltoAllTokenDispatcher), experts.py (SequentialMLP), shared_experts.py
// (SharedExpertMLP: MLP.forward, its output bias dropped), and megatron/core/transformer/
// mlp.py (MLP.forward with per_token_scale, unfused bias + activation branch).
//
// What one MoE layer allocates, in order (T = this rank's tokens, E experts, K = top_k,
// El = E / EP local experts, F = expert_d_ff / ETP (this rank's share of each expert), e = 2;
// N, M: rows, graph/models/megatron_moe.h):
//  shared experts (first): fc1 [s*b, S/t] (+ bias: a second tensor, the GEMM result dies),
//    gelu, fc2 [T, h]; SharedExpertMLP.forward drops fc2's bias.
//  router: logits [T, E] (RouterGatingLinearFunction, saves its input); softmax: topk
//    [T, K] + int64 indices, softmax(dtype=fp32) (an fp32 copy, then the saved output),
//    .type_as(logits); sigmoid: logits.float(), sigmoid (saved), topk, sum, + 1e-20, div;
//    routing_probs = zeros_like(logits).scatter(1, idx, probs) [T, E]; routing_map: zeros,
//    .int(), scatter, .bool() [T, E] bool. Capacity: topk over dim 0 ([cap, E] values and
//    int64 indices), zeros_like.scatter, .bool(), logical_and (not with padding), probs *
//    map (MulBackward0 saves the map).
//  allgather (EP x ETP > 1; N = T * EP * ETP): routing_map gathered [N, E] bool, probs
//    [N, E] (autograd), hidden states into Megatron's global "mpu" buffer [N, h] (a view); local_map / local_probs
//    slices .contiguous() (no copy when El = E); permute: map.T.contiguous() [El, N],
//    argsort [El*N] int64, % N -> sorted_indices [M] int64, index_select [M, h] (saves the
//    index); local_probs.T.contiguous() [El, N], masked_select [M] (saves the mask).
//  alltoall: permute with probs: map.T.contiguous() [E, T], argsort [E*T] int64 (kept:
//    probs.T.contiguous().reshape(-1)[flat_sorted] saves a view of it), sorted_indices
//    [M_out], probs [M_out], index_select [M_out, h]; with padding the [E, cap] variant
//    (argsort per row, indices_1D, index_select of the probs). all_to_all of tokens and
//    probs (EP > 1) to [Mr, h] and [Mr]; with ETP > 1 dispatch_postprocess all-gathers both
//    over ETP to [M, h] and [M] (M = ETP * Mr; list collectives: ProcessGroupNCCL's
//    stacked [M, h] / [M] copy is a transient), then sort_chunks_by_idxs (a cat: [M, h] and
//    [M]) when El > 1.
//  experts (SequentialMLP): linear_fc1 [M, F] + bias, gelu [M, F] (saves its input),
//    * probs [M, F] (saves both), linear_fc2 [M, h], output += bias * probs ([M, h]
//    product), torch.cat of the experts' outputs [M, h] when El > 1.
//  combine: (alltoall: the reverse sort [M, h], with ETP > 1 the reduce-scatter over ETP to
//    [Mr, h] (+ its stacked [M, h] transient), all_to_all [M_out, h]) unpermute:
//    zeros [rows, h] then scatter_add_ (saves the index); allgather: reduce-scatter to
//    [T, h]. postprocess: + the shared experts' output.
//  Python lifetimes: custom_forward's locals (the preprocessed hidden states, the
//  dispatched tokens and probs, routing_map, the shared experts' output) live until the
//  layer returns; the dispatcher's attributes (allgather: local_map, local_probs, the
//  reversed mapping; alltoall: probs, routing_map, the reversed mapping) live until the
//  same layer's next forward replaces them. Without grad (recompute [moe]'s first pass,
//  forward-no-grad) routed_experts_compute's `dispatched_input` lives through the
//  unpermute, a GeLU expert's `intermediate_parallel` through its bias product, and
//  TEGroupedMLP's `fc1_output` through fc2 (docs/moe-megatron.md "Lifetimes without grad").
//
// Simplifications (docs/moe-megatron.md "Limits"): SequentialMLP's per-expert chains are
// emitted as one chain over the M local rows (the same bytes per tensor, summed over the
// experts; the split views and their SplitWithSizesBackward0 cat are not emitted); the
// router bias's grad (E elements) and the dispatcher's per-expert count tensors (E int64)
// are left out; CUDA sort scratch of argsort is not emitted.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "graph/checkpoint.h"
#include "graph/models/megatron.h"
#include "graph/models/megatron_moe.h"
#include "graph/models/megatron_swiglu_experts.h"
#include "graph/models/moe_routing.h"
#include "graph/ops/ops.h"
#include "graph/ops/ops_megatron_arch.h"
#include "graph/ops/ops_megatron_moe.h"
#include "graph/ops/ops_moe.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

int64_t megatron_moe_capacity(int64_t tokens, int64_t top_k, int64_t experts, double factor) {
  // math.ceil((num_tokens / num_experts) * capacity_factor), num_tokens = tokens * top_k.
  return static_cast<int64_t>(
      std::ceil(static_cast<double>(tokens * top_k) / static_cast<double>(experts) * factor));
}

MegatronMoeTokens megatron_moe_tokens(const MegatronMoeShape& m, int64_t tokens, int64_t moe_layer) {
  MegatronMoeTokens r;
  r.tokens = tokens;
  const std::vector<int64_t> routed = routed_tokens(m.spec, tokens, moe_layer);
  r.kept = routed;
  if (m.capacity_factor > 0) {
    r.capacity = megatron_moe_capacity(tokens, m.spec.top_k, m.spec.experts, m.capacity_factor);
    for (size_t e = 0; e < r.kept.size(); ++e)
      r.kept[e] = m.pad_to_capacity ? std::min(r.capacity, tokens) : std::min(routed[e], r.capacity);
  }
  for (int64_t k : r.kept) r.sent += k;
  const int64_t ep = m.expert_parallel, etp = m.expert_tensor;
  r.gathered = tokens * ep * etp;
  for (int64_t j = 0; j < m.local_experts(); ++j) r.received += ep * r.kept[static_cast<size_t>(j)];
  r.local = etp * r.received;
  return r;
}

namespace {
// A tensor no autograd node records (routing bookkeeping): activation-kind when it lives
// past the op that made it.
Tensor nograd(Runtime& rt, uint64_t bytes, OpKind op, bool lasting = false) {
  return rt.alloc(bytes, lasting ? TensorKind::activation : TensorKind::temporary, op);
}
}  // namespace

// The MoE layers of the whole model before local layer l (a pipeline chunk's layers start at
// the global layer_offset): the index of model.moe.routing's per-layer counts.
int64_t MegatronModel::moe_layer_index(int32_t l) const {
  int64_t k = 0;
  for (int64_t i = 0; i < l + s_.layer_offset; ++i) k += s_.moe.spec.layer_is_moe(i) ? 1 : 0;
  return k;
}

// MoELayer.__init__: router (weight, bias), experts (SequentialMLP: local_experts.j,
// each an MLP with linear_fc1 / linear_fc2), shared_experts. With ETP > 1 an expert's fc1
// keeps F1/ETP output columns and fc2 F/ETP input rows (the expert linears' explicit_expert_
// comm: divide(output_size / input_size, expt_tp size) in extensions/transformer_engine.py
// TELinear and TEGroupedLinear at d98e8a64); F below is that per-rank width.
void MegatronModel::construct_moe(int32_t l, const std::string& pre) {
  const MoeSpec& m = s_.moe.spec;
  const uint64_t h = s_.hidden, E = m.experts, F = static_cast<uint64_t>(s_.moe.expert_ffn()),
                 S = m.shared_d_ff, t = tp();
  if (moe_ids_.size() < static_cast<size_t>(s_.layers)) moe_ids_.resize(static_cast<size_t>(s_.layers));
  if (moe_state_.size() < static_cast<size_t>(s_.layers)) moe_state_.resize(static_cast<size_t>(s_.layers));
  MoeIds& id = moe_ids_[static_cast<size_t>(l)];
  rt_.ctx.module = Module::mlp;
  id.router = param(E * h, pre + "mlp.router.weight", true);
  if (s_.bias) id.router_b = param(E, pre + "mlp.router.bias", false);
  auto expert_param = [&](uint64_t elems, const std::string& name, bool decay) {
    const int32_t p = param(elems, name, decay);
    expert_.back() = true;
    return p;
  };
  const uint64_t F1 = static_cast<uint64_t>(s_.fc1_width(s_.moe.expert_ffn()));  // 2F with --swiglu
  const uint64_t S1 = static_cast<uint64_t>(s_.fc1_width(m.shared_d_ff));
  if (s_.moe.grouped_gemm) {
    // TEGroupedMLP: two GroupedLinear modules holding weight0 .. weight{El-1} each (no bias).
    for (const char* fc : {"linear_fc1", "linear_fc2"})
      for (int64_t j = 0; j < s_.moe.local_experts(); ++j)
        expert_param(std::string(fc) == "linear_fc1" ? F1 * h : h * F,
                     pre + "mlp.experts." + fc + ".weight" + std::to_string(j), true);
  }
  for (int64_t j = 0; j < (s_.moe.grouped_gemm ? 0 : s_.moe.local_experts()); ++j) {
    const std::string e = pre + "mlp.experts.local_experts." + std::to_string(j) + ".";
    expert_param(F1 * h, e + "linear_fc1.weight", true);
    if (s_.bias) expert_param(F1, e + "linear_fc1.bias", false);
    expert_param(h * F, e + "linear_fc2.weight", true);
    if (s_.bias) expert_param(h, e + "linear_fc2.bias", false);
  }
  if (S > 0) {
    id.shared_fc1 = param(S1 * h / t, pre + "mlp.shared_experts.linear_fc1.weight", true);
    if (s_.bias) param(S1 / t, pre + "mlp.shared_experts.linear_fc1.bias", false);
    id.shared_fc2 = param(h * S / t, pre + "mlp.shared_experts.linear_fc2.weight", true);
    if (s_.bias) param(h, pre + "mlp.shared_experts.linear_fc2.bias", false);
  }
}

// MLP.forward, bias and GeLU unfused (the dense MLP of a MoE model, the shared experts):
// linear_fc1 (column parallel, skip_bias_add) + bias, F.gelu, linear_fc2 (row parallel).
// fc2's bias is returned to the caller (skip_bias_add), never added here.
Tensor MegatronModel::mlp_unfused(const Tensor& ln_out, uint64_t ffn, int32_t fc1, int32_t fc2,
                                  bool fc1_bias) {
  const uint64_t h = s_.hidden, f = ffn / tp(), e = s_.elem;
  const double flops = 2 * static_cast<double>(rows()) * static_cast<double>(h) * static_cast<double>(f);
  if (s_.swiglu) {
    // --swiglu keeps bias_activation_fusion on (only the GeLU fusion refuses per-token
    // scales): fc1 [s*b, 2f/t], SwiGLUFunction (saves it), fc2.
    Tensor gated = megatron_linear(
        rt_, ln_out, {rows() * 2 * f * e, 2 * f * h * e, 0, 2 * flops, sp_gather(), 0, fc1});
    gated = fused_swiglu(rt_, gated, s_.bias && fc1_bias ? 2 * f * e : 0);
    return megatron_linear(rt_, gated, {act(), h * f * e, 0, flops, 0, sp_scatter(act()), fc2});
  }
  Tensor inter = megatron_linear(
      rt_, ln_out, {rows() * f * e, f * h * e, s_.bias && fc1_bias ? f * e : 0, flops, sp_gather(), 0, fc1});
  Tensor act_out = gelu(rt_, inter);
  inter.reset();
  return megatron_linear(rt_, act_out, {act(), h * f * e, 0, flops, 0, sp_scatter(act()), fc2});
}

Tensor MegatronModel::shared_experts(const Tensor& ln_out) {
  const MoeIds& id = moe_ids_[static_cast<size_t>(rt_.ctx.layer)];
  return mlp_unfused(ln_out, static_cast<uint64_t>(s_.moe.spec.shared_d_ff), id.shared_fc1,
                     id.shared_fc2, true);
}

// TopKRouter.forward: returns the probs [T, E] (after token dropping) and sets routing_map.
Tensor MegatronModel::moe_router(const Tensor& x, Tensor& routing_map) {
  const MegatronMoeShape& mm = s_.moe;
  const MoeSpec& m = mm.spec;
  const uint64_t T = rows_sp(), E = m.experts, K = m.top_k, h = s_.hidden, e = s_.elem;
  const MoeIds& id = moe_ids_[static_cast<size_t>(rt_.ctx.layer)];
  const double flops = 2.0 * static_cast<double>(T) * static_cast<double>(h) * static_cast<double>(E);
  // RouterGatingLinearFunction (moe_router_dtype unset: the input dtype); saves inp, weight.
  Tensor logits = megatron_linear(rt_, x, {T * E * e, E * h * e, 0, flops, 0, 0, id.router});
  // apply_z_loss (--moe-z-loss-coeff; skipped without grad: a checkpoint's first pass).
  if (mm.z_loss && rt_.grad_enabled) logits = moe_z_loss(logits);
  Tensor probs_k, indices;
  if (m.score == MoeScore::softmax) {
    // scores, top_indices = torch.topk(logits, k); probs = softmax(scores, dtype=fp32).
    TopkResult top = topk(rt_, logits, T, K, e);
    Tensor f32 = to_copy(rt_, top.values, T * K * 4);
    top.values.reset();
    Tensor sm = softmax(rt_, f32);
    f32.reset();
    probs_k = to_copy(rt_, sm, T * K * e);  // probs.type_as(logits)
    indices = std::move(top.indices);
  } else {
    // scores = sigmoid(logits.float()); topk; probs = scores / (scores.sum(-1) + 1e-20).
    Tensor f32 = to_copy(rt_, logits, T * E * 4);
    Tensor sg = sigmoid(rt_, f32);
    f32.reset();
    TopkResult top = topk(rt_, sg, T, K, 4);
    sg.reset();
    Tensor p32 = top.values;
    if (K > 1) {
      Tensor sum = sum_dim(rt_, top.values, T * 4);
      Tensor den = add_scalar(rt_, sum);
      sum.reset();
      p32 = div(rt_, top.values, den);
    }
    top.values.reset();
    probs_k = to_copy(rt_, p32, T * K * e);
    indices = std::move(top.indices);
  }
  Tensor probs = moe_scatter(rt_, probs_k, indices, T * E * e);  // routing_probs
  probs_k.reset();
  {
    // zeros_like(logits).int().scatter(1, top_indices, 1).bool()
    Tensor z = nograd(rt_, T * E * e, OpKind::fill);
    Tensor i32 = nograd(rt_, T * E * 4, OpKind::to_copy);
    z.reset();
    Tensor sc = nograd(rt_, T * E * 4, OpKind::moe_scatter);
    i32.reset();
    routing_map = nograd(rt_, T * E, OpKind::to_copy, true);
  }
  indices.reset();
  if (mm.capacity_factor > 0) {
    // apply_router_token_dropping (drop_policy "probs").
    const int64_t cap = megatron_moe_capacity(static_cast<int64_t>(T), m.top_k, m.experts, mm.capacity_factor);
    Tensor capacity_mask;
    if (static_cast<uint64_t>(cap) > T) {
      Tensor ones = nograd(rt_, T * E * e, OpKind::fill);  // ones_like(probs).bool()
      capacity_mask = nograd(rt_, T * E, OpKind::to_copy, true);
    } else {
      const uint64_t c = static_cast<uint64_t>(cap);
      // torch.topk(routing_probs, k=cap, dim=0): `_` dies at once (its node with it).
      Tensor vals = nograd(rt_, c * E * e, OpKind::topk);
      Tensor cidx = nograd(rt_, c * E * 8, OpKind::topk);
      vals.reset();
      Tensor z = nograd(rt_, T * E * e, OpKind::fill);
      Tensor sc = nograd(rt_, T * E * e, OpKind::moe_scatter);
      z.reset();
      capacity_mask = nograd(rt_, T * E, OpKind::to_copy, true);
    }
    Tensor final_map = mm.pad_to_capacity ? capacity_mask : nograd(rt_, T * E, OpKind::compare, true);
    Tensor final_probs = mul(rt_, probs, final_map, Broadcast::trailing_ones, e);  // saves the map
    probs = std::move(final_probs);
    routing_map = std::move(final_map);
  }
  // The aux_loss load-balancing loss on the logits, attached to the probs
  // (graph/models/megatron_moe_loss.cpp; training with grad enabled only).
  if (mm.aux_loss && rt_.grad_enabled) probs = moe_aux_loss(logits, probs);
  return probs;  // the logits die with the router's frame
}

// SequentialMLP over the `rows` permuted tokens of this rank's experts (one chain: see the
// file comment), each expert an MLP.forward(tokens, per_token_scale=probs).
Tensor MegatronModel::moe_experts(const Tensor& permuted, const Tensor& probs, uint64_t rows) {
  const uint64_t h = s_.hidden, F = static_cast<uint64_t>(s_.moe.expert_ffn()), e = s_.elem;
  const uint64_t El = static_cast<uint64_t>(s_.moe.local_experts());
  const double flops = 2 * static_cast<double>(rows) * static_cast<double>(h) * static_cast<double>(F);
  if (s_.swiglu) {
    // fc1 [M, 2F], weighted_bias_swiglu_impl(fc1, None, probs) (WeightedSwiGLUFunction saves
    // both; no bias: the scenario refuses one), fc2 [M, h].
    // TEGroupedMLP (--moe-grouped-gemm): each fc is one TE GroupedLinear, whose forward
    // saves the split views of its input and writes one [M, out] output (no per-expert
    // outputs, no torch.cat); its backward's dgrad is one [M, in] tensor and, under
    // Megatron's DDP (grad_added_to_main_grad), each expert's wgrad is get_dummy_wgrad's
    // cached tensor, which AccumulateGrad clones (one expert weight at a time, freed by the
    // DDP hook). The weight bytes passed per GEMM are one expert's for that reason.
    const bool grouped = s_.moe.grouped_gemm;
    if (grouped) use_te_grouped_buffers();
    const uint64_t w1 = (grouped ? 1 : El) * 2 * F * h * e, w2 = (grouped ? 1 : El) * h * F * e;
    // --recompute-modules moe_act (TEGroupedMLP only): CheckpointWithoutOutput around the
    // weighted SwiGLU (graph/models/megatron_swiglu_experts.h).
    Tensor out = swiglu_experts(rt_, permuted, probs,
                                {rows, h, F, e, w1, w2, grouped && s_.moe.recompute_moe_act, grouped});
    if (El > 1 && !grouped) out = clone(rt_, out);  // SequentialMLP: torch.cat(output_local_list)
    return out;
  }
  Tensor inter = megatron_linear(rt_, permuted,
                                 {rows * F * e, El * F * h * e, s_.bias ? El * F * e : 0, flops, 0, 0, -1});
  Tensor a = gelu(rt_, inter);
  inter.reset();
  // intermediate * per_token_scale.unsqueeze(-1), .to(original dtype) (the same dtype)
  Tensor scaled = mul(rt_, a, probs, Broadcast::trailing_ones, e);
  a.reset();
  Tensor out = megatron_linear(rt_, scaled, {rows * h * e, El * h * F * e, 0, flops, 0, 0, -1});
  if (s_.bias) {
    // output += output_bias.unsqueeze(0) * per_token_scale.unsqueeze(-1)
    Tensor bs = expert_bias_scale(rt_, probs, rows * h * e, El * h * e);
    out = add_(rt_, out, bs);
  }
  // MLP.forward's `intermediate_parallel` (fc2's input, which fc2 saves with grad) is a local
  // until forward returns, i.e. through the bias product above (matters without grad).
  scaled.reset();
  if (El > 1) out = clone(rt_, out);  // torch.cat(output_local_list, dim=0)
  return out;
}

// TEGroupedMLP's buffers that live for the process (Transformer Engine d0067d0d):
// cpp_extensions/gemm.py get_cublas_workspace(grouped_gemm=True), lru_cached, one
// get_cublas_workspace_size_bytes() tensor per compute stream (common/util/multi_stream.cpp:
// 4); module/base.py get_dummy_wgrad, cached per (shape, dtype): [2F, h] for fc1, [h, F] for
// fc2 (F = this rank's expert_d_ff / ETP). TE allocates the workspaces at the first grouped GEMM and the dummies at the first
// backward; memsim allocates both at the first forward (the same from the second step on,
// which is the step memsim reports with step.warmup_steps >= 1). The chunks of an interleaved
// stage share one set (share_te_buffers): the first chunk to run a grouped GEMM allocates it.
void MegatronModel::use_te_grouped_buffers() {
  std::vector<Tensor>& buffers = te_buffers();  // this model's, or the process's (shared)
  if (!buffers.empty()) return;
  const int32_t layer = rt_.ctx.layer;
  const uint32_t region = rt_.ctx.region;
  rt_.ctx.layer = -1;
  rt_.ctx.region = 0;
  const uint64_t h = s_.hidden, F = static_cast<uint64_t>(s_.moe.expert_ffn()), e = s_.elem;
  for (int i = 0; i < 4; ++i) {
    buffers.push_back(rt_.alloc(s_.moe.te_workspace, TensorKind::other, OpKind::other));
    rt_.program().tensors[buffers.back().storage].name =
        rt_.program().intern("TE grouped GEMM cuBLAS workspace");
  }
  for (uint64_t bytes : {2 * F * h * e, h * F * e}) {
    buffers.push_back(rt_.alloc(bytes, TensorKind::other, OpKind::other));
    rt_.program().tensors[buffers.back().storage].name = rt_.program().intern("TE dummy wgrad");
  }
  rt_.ctx.layer = layer;
  rt_.ctx.region = region;
}

Tensor MegatronModel::moe(const Tensor& ln_out) {
  // --recompute-modules moe: tensor_parallel.checkpoint(custom_forward, False, hidden_states)
  // (reentrant; not nested in another checkpointed region).
  if (s_.moe.recompute_moe && rt_.checkpoint != nullptr && rt_.grad_enabled && rt_.ctx.region == 0)
    return rt_.checkpoint->run({ln_out}, [this](const Inputs& in) { return moe_body(in[0]); });
  return moe_body(ln_out);
}

Tensor MegatronModel::moe_body(const Tensor& x) {
  const MegatronMoeShape& mm = s_.moe;
  const uint64_t T = rows_sp(), E = mm.spec.experts, h = s_.hidden, e = s_.elem;
  const uint64_t El = static_cast<uint64_t>(mm.local_experts());
  const int64_t ep = mm.expert_parallel, etp = mm.expert_tensor;
  const MegatronMoeTokens tok = megatron_moe_tokens(mm, static_cast<int64_t>(T), moe_layer_index(rt_.ctx.layer));
  MoeState& state = moe_state_[static_cast<size_t>(rt_.ctx.layer)];
  rt_.ctx.module = Module::mlp;
  // shared_experts_compute (before the router; --recompute-modules shared_experts checkpoints it).
  Tensor shared_out;
  if (mm.spec.shared_d_ff > 0) {
    if (mm.recompute_shared && rt_.checkpoint != nullptr && rt_.grad_enabled && rt_.ctx.region == 0)
      shared_out = rt_.checkpoint->run({x}, [this](const Inputs& in) { return shared_experts(in[0]); });
    else
      shared_out = shared_experts(x);
  }
  Tensor routing_map;
  Tensor probs = moe_router(x, routing_map);
  Tensor hidden_states = x;  // hidden_states.view(-1, h) (preprocess)
  Tensor dispatched, output;
  const uint64_t M = static_cast<uint64_t>(tok.local);
  if (mm.dispatcher == MegatronDispatcher::allgather) {
    const uint64_t N = static_cast<uint64_t>(tok.gathered);
    Tensor map = routing_map;
    if (ep * etp > 1) {  // token_dispatch: all-gathers over the ETP x EP group (tp_ep_group)
      map = nograd(rt_, N * E, OpKind::seq_gather, true);
      probs = seq_gather(rt_, probs, N * E * e);
      dispatched = seq_gather(rt_, x, N * h * e, &global_buffer());
    } else {
      dispatched = x;
    }
    // dispatch_postprocess: this rank's experts' columns, .contiguous() (a copy unless El = E).
    Tensor local_map = El == E ? map : nograd(rt_, N * El, OpKind::clone, true);
    Tensor local_probs = El == E ? probs : clone(rt_, slice_seq(rt_, probs, N * El * e));
    map.reset();
    Tensor sorted;
    {
      // permute: routing_map.bool().T.contiguous(), argsort, % num_tokens.
      Tensor mt = nograd(rt_, El * N, OpKind::clone);
      Tensor flat = nograd(rt_, El * N * 8, OpKind::sort);
      sorted = nograd(rt_, M * 8, OpKind::other, true);
    }
    Tensor permuted = index_select_rows(rt_, dispatched, sorted, M * h * e);
    // local_probs.T.contiguous().masked_select(local_map.T.contiguous())
    Tensor probs_m;
    {
      Tensor pt = clone(rt_, local_probs);
      Tensor mask = nograd(rt_, El * N, OpKind::clone, true);
      probs_m = masked_select(rt_, pt, mask, M * e);
    }
    local_probs.reset();
    state = MoeState{local_map, probs_m, sorted};  // the dispatcher's attributes
    Tensor expert_out = moe_experts(permuted, probs_m, M);
    // combine_preprocess: unpermute (no probs) into zeros [N, h].
    Tensor tokens = rt_.alloc(N * h * e, TensorKind::activation, OpKind::fill);
    scatter_add_rows(rt_, tokens, sorted, expert_out);
    // routed_experts_compute's locals `dispatched_input` (the permuted rows, which fc1 saves
    // with grad) and `expert_output` live until it returns after combine_preprocess: without
    // grad the permuted [M, h] is still allocated through the unpermute's zeros [N, h].
    permuted.reset();
    probs_m.reset();
    expert_out.reset();
    sorted.reset();
    local_map.reset();
    output = ep * etp > 1 ? seq_reduce_scatter(rt_, tokens, T * h * e) : tokens;  // token_combine
  } else {
    const uint64_t Mo = static_cast<uint64_t>(tok.sent);
    const bool pad = mm.pad_to_capacity;
    const uint64_t cap = static_cast<uint64_t>(std::min<int64_t>(tok.capacity, tok.tokens));
    Tensor sorted, permuted_probs;
    {
      // permute(hidden, routing_map, probs, num_out_tokens, drop_and_pad)
      Tensor pt;
      if (!pad) {
        Tensor mt = nograd(rt_, E * T, OpKind::clone);
        Tensor flat = nograd(rt_, E * T * 8, OpKind::sort, true);  // saved (a view) below
        sorted = nograd(rt_, Mo * 8, OpKind::other, true);
        mt.reset();
        pt = clone(rt_, probs);  // probs.T.contiguous()
        permuted_probs = index_rows(rt_, pt, flat, Mo * 8, Mo * e);  // [flat_sorted]
      } else {
        Tensor mt = nograd(rt_, E * T, OpKind::to_copy);
        Tensor srt = nograd(rt_, E * T * 8, OpKind::sort);
        sorted = nograd(rt_, E * cap * 8, OpKind::other, true);
        srt.reset();
        mt.reset();
        pt = clone(rt_, probs);
        Tensor idx1;
        {
          Tensor ar = nograd(rt_, E * 8, OpKind::arange);
          Tensor d0 = nograd(rt_, E * 8, OpKind::mul);  // indices_dim0 * num_tokens
          idx1 = nograd(rt_, E * cap * 8, OpKind::add, true);
        }
        permuted_probs = index_select_rows(rt_, pt, idx1, E * cap * e);
      }
    }
    hidden_states = index_select_rows(rt_, x, sorted, Mo * h * e);  // custom_forward's name
    state = MoeState{probs, routing_map, sorted};                     // the dispatcher's attributes
    // token_dispatch: all_to_all over EP (the identity for one rank).
    const uint64_t Mr = static_cast<uint64_t>(tok.received);  // rows after the EP all-to-all
    Tensor global_probs = permuted_probs;
    if (ep > 1) {
      dispatched = all_to_all(rt_, hidden_states, Mr * h * e);
      global_probs = all_to_all(rt_, permuted_probs, Mr * e);
    } else {
      dispatched = hidden_states;
    }
    probs = global_probs;  // custom_forward rebinds probs
    permuted_probs.reset();
    global_probs.reset();
    Tensor expert_out;
    {
      // routed_experts_compute: dispatch_postprocess all-gathers tokens and probs over ETP
      // (output_splits_tp: list collectives, ProcessGroupNCCL's stacked copy; none with
      // padding, whose splits are None), then sorts the chunks by local expert; the gathered
      // tensors die when sort_chunks_by_idxs' results replace them.
      const uint64_t flat = pad ? 0 : 1;
      Tensor gathered = etp > 1 ? seq_gather(rt_, dispatched, M * h * e, nullptr, flat * M * h * e) : dispatched;
      Tensor gathered_probs = etp > 1 ? seq_gather(rt_, probs, M * e, nullptr, flat * M * e) : probs;
      Tensor tokens_in = El > 1 ? clone(rt_, gathered) : gathered;
      Tensor probs_in = El > 1 ? clone(rt_, gathered_probs) : gathered_probs;
      gathered.reset();
      gathered_probs.reset();
      Tensor out = moe_experts(tokens_in, probs_in, M);
      // combine_preprocess: sort back (El > 1), then reduce-scatter over ETP to the rows this
      // rank received; the experts' output lives until routed_experts_compute returns.
      Tensor unsorted = El > 1 ? clone(rt_, out) : out;
      expert_out = etp > 1 ? seq_reduce_scatter(rt_, unsorted, Mr * h * e, flat * M * h * e) : unsorted;
    }
    Tensor back = ep > 1 ? all_to_all(rt_, expert_out, Mo * h * e) : expert_out;  // token_combine
    expert_out.reset();
    // combine_postprocess: unpermute (no probs) into zeros [T, h].
    output = rt_.alloc(T * h * e, TensorKind::activation, OpKind::fill);
    scatter_add_rows(rt_, output, sorted, back);
    back.reset();
    sorted.reset();
  }
  if (shared_out.defined()) output = add(rt_, output, shared_out);  // postprocess
  // custom_forward returns: probs, routing_map, hidden_states, dispatched, shared_out die.
  return output;
}

}  // namespace memsim::graph
