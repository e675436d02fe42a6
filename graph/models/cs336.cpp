#include "graph/models/cs336.h"

#include <string>

#include "graph/autocast.h"
#include "graph/checkpoint.h"
#include "graph/numeric/numeric.h"
#include "graph/ops/op_helpers.h"

namespace memsim::graph {

int64_t cs336_parameter_count(const Cs336Shape& s) {
  const int64_t D = s.d_model, F = s.d_ff, V = s.vocab;
  return 2 * V * D + s.layers * (4 * D * D + 3 * D * F + 2 * D) + D;
}

void Cs336Model::construct() {
  const uint64_t e = s_.elem;
  const int64_t D = s_.d_model, F = s_.d_ff;
  rt_.ctx.module = Module::embedding;
  embedding_ = rt_.add_parameter(s_.vocab * D * e, "token_embeddings.weight");
  // One RotaryEmbedding buffer (2, ctx, h/2) fp32, shared by every layer (§1).
  const uint64_t h = static_cast<uint64_t>(D / s_.heads);
  rope_buffer_ = rt_.alloc(4 * 2 * s_.context_length * (h / 2), TensorKind::other, OpKind::fill);
  if (rt_.numeric != nullptr) rt_.numeric->init_rope_buffer(rope_buffer_);
  layers_.resize(s_.layers);
  for (int32_t l = 0; l < s_.layers; ++l) {
    rt_.ctx.layer = l;
    LayerParams& p = layers_[l];
    const std::string pre = "layers." + std::to_string(l) + ".";
    rt_.ctx.module = Module::attention;
    p.q = rt_.add_parameter(D * D * e, pre + "attn.q_proj.weight");
    p.k = rt_.add_parameter(D * D * e, pre + "attn.k_proj.weight");
    p.v = rt_.add_parameter(D * D * e, pre + "attn.v_proj.weight");
    p.o = rt_.add_parameter(D * D * e, pre + "attn.output_proj.weight");
    rt_.ctx.module = Module::mlp;
    p.w1 = rt_.add_parameter(F * D * e, pre + "ffn.w1.weight");
    p.w2 = rt_.add_parameter(D * F * e, pre + "ffn.w2.weight");
    p.w3 = rt_.add_parameter(F * D * e, pre + "ffn.w3.weight");
    rt_.ctx.module = Module::norm;
    p.ln1 = rt_.add_parameter(D * e, pre + "ln1.weight");
    p.ln2 = rt_.add_parameter(D * e, pre + "ln2.weight");
  }
  rt_.ctx.layer = -1;
  rt_.ctx.module = Module::norm;
  ln_final_ = rt_.add_parameter(D * e, "ln_final.weight");
  rt_.ctx.module = Module::head;
  lm_head_ = rt_.add_parameter(s_.vocab * D * e, "lm_head.weight");
  rt_.ctx.module = Module::none;
  // Shapes (dim 0 of each matrix; the norms are vectors): FSDP2 shards on dim 0
  // (sim/parallel/fsdp2.h). Linear weights are (d_out, d_in), embeddings (vocab, D).
  auto rows = [this](int32_t id, uint64_t r) { rt_.parameters()[id].rows = r; };
  rows(embedding_, s_.vocab);
  rows(lm_head_, s_.vocab);
  for (const LayerParams& p : layers_) {
    for (int32_t id : {p.q, p.k, p.v, p.o, p.w2}) rows(id, static_cast<uint64_t>(D));
    for (int32_t id : {p.w1, p.w3}) rows(id, static_cast<uint64_t>(F));
  }
}

bool Cs336Model::autocast_on() const { return ac_ != nullptr && ac_->active(); }

Tensor Cs336Model::linear(const Tensor& x, int32_t weight, int64_t d_in, int64_t d_out) {
  const double rows = static_cast<double>(s_.batch * s_.seq);
  const double flops = 2.0 * rows * static_cast<double>(d_in) * static_cast<double>(d_out);
  if (autocast_on()) return ac_->linear(x, weight, s_.batch * s_.seq, d_in, d_out, flops);
  Tensor w = rt_.param(weight);
  return linear_einsum(rt_, x, w, s_.batch * s_.seq * d_out * s_.elem, flops);
}

// RMSNorm (§2.3): rms = rsqrt(mean(x^2) + eps); weight * (x * rms). fp32 in, no casts.
Tensor Cs336Model::rmsnorm(const Tensor& x, int32_t weight) {
  ModuleScope module_scope(rt_, Module::norm);
  const uint64_t rows = s_.batch * s_.seq * 4;
  Tensor sq = pow2(rt_, x);
  Tensor ms = mean_dim(rt_, sq, rows);
  sq.reset();
  Tensor ms_eps = add_scalar(rt_, ms);
  ms.reset();
  Tensor rms = rsqrt(rt_, ms_eps);
  ms_eps.reset();
  Tensor xn = mul(rt_, x, rms);
  Tensor w = rt_.param(weight);
  Tensor out = mul(rt_, w, xn, Broadcast::leading_dims);
  return out;
}

// nn_utils.softmax (§2.6): max.dim, subtract, exp, sum, divide.
// Under autocast x is low precision: max and sub stay low, exp (fp32 list) runs on an
// fp32 copy of the shifted scores, so E, Z and P are fp32 (cs336-model.md §5).
Tensor Cs336Model::softmax_lastdim(const Tensor& x, uint64_t rows) {
  if (s_.softmax == Cs336Softmax::exp_twice) return softmax_exp_twice(x, rows);
  const bool ac = autocast_on();
  const uint64_t elem = ac ? ac_->low_elem() : s_.elem;
  MaxResult mx = max_dim(rt_, x, rows, elem);
  mx.indices.reset();  // `torch.max(...)[0]`: the namedtuple dies (indices saved under grad)
  Tensor shifted = sub(rt_, x, mx.values);
  mx.values.reset();
  Tensor e;
  if (ac) {
    Tensor sf = ac_->to_fp32(shifted, shifted.bytes / elem * 4);
    e = exp(rt_, sf);
  } else {
    e = exp(rt_, shifted);
  }
  Tensor z = sum_dim(rt_, e, rows * (ac ? 4 : s_.elem));
  Tensor p = div(rt_, e, z);
  // The return expression's sum dies first, then the frame's locals in slot order.
  z.reset();
  shifted.reset();
  e.reset();
  return p;
}

// `max_value, _ = torch.max(x, dim, keepdim=True)` then
// `torch.exp(x - max_value) / torch.sum(torch.exp(x - max_value), dim, keepdim=True)`.
// Python evaluates the numerator's sub and exp, then the denominator's sub, exp and sum,
// then the div; each sub result dies once its exp has consumed it (under autocast the
// exp's fp32 input copy dies first). Under grad both exp outputs are saved (the first by
// DivBackward0 and its ExpBackward0, the second by its ExpBackward0), the sum by the div,
// the indices by MaxBackward0; the max values and `_` are locals until the return.
Tensor Cs336Model::softmax_exp_twice(const Tensor& x, uint64_t rows) {
  const bool ac = autocast_on();
  const uint64_t elem = ac ? ac_->low_elem() : s_.elem;
  MaxResult mx = max_dim(rt_, x, rows, elem);
  auto shifted_exp = [&]() {
    Tensor shifted = sub(rt_, x, mx.values);
    if (!ac) return exp(rt_, shifted);
    Tensor sf = ac_->to_fp32(shifted, shifted.bytes / elem * 4);
    Tensor e = exp(rt_, sf);
    sf.reset();
    return e;
  };
  Tensor num = shifted_exp();
  Tensor den = shifted_exp();
  Tensor z = sum_dim(rt_, den, rows * (ac ? 4 : s_.elem));
  den.reset();
  Tensor p = div(rt_, num, z);
  z.reset();
  num.reset();
  mx.values.reset();  // locals die at the return: max_value, then `_`
  mx.indices.reset();
  return p;
}

namespace {
// `x.masked_fill_(mask, -inf)`: no allocation, the result is x's storage with a new
// grad_fn (MaskedFillBackward0 saves the mask; its backward, grad.masked_fill(mask, 0),
// allocates one grad-sized tensor, as WhereBackward0 does, with no scalar tensor).
Tensor masked_fill_inplace(Runtime& rt, const Tensor& x, const Tensor& mask) {
  Tensor out = x;
  if (detail::wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::where_scalar, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).size[3] = 0;
    rt.save(n, mask);
    out.grad_fn = n;
    out.out_slot = 0;
  }
  return out;
}
}  // namespace

// einsum "... q d, ... k d -> ... q k": the raw attention scores.
Tensor Cs336Model::attention_scores(const Tensor& q, const Tensor& k) {
  const double B = static_cast<double>(s_.batch), H = static_cast<double>(s_.heads);
  const double S = static_cast<double>(s_.seq), hd = static_cast<double>(s_.d_model / s_.heads);
  const double flops = 2.0 * B * H * S * S * hd;
  if (!autocast_on()) {
    numeric_hint(rt_, NumericHint::transpose_b);
    return bmm(rt_, q, k, scores(), flops);
  }
  // Both einsum operands are cast (Q and K are fp32 after RoPE).
  const uint64_t elem = ac_->low_elem();
  Tensor qc = ac_->cast(q, q.bytes / 4 * elem);
  Tensor kc = ac_->cast(k, k.bytes / 4 * elem);
  Tensor out = bmm(rt_, qc, kc, scores() / s_.elem * elem, flops);
  qc.reset();  // the casts die with the einsum call, left operand first
  kc.reset();
  return out;
}

// einsum "... q k, ... k d -> ... q d" and the view back to (B,H,S,h). V is a (B,H,S,h)
// view with strides (S*D, h, D, 1): the einsum's reshape copies it.
Tensor Cs336Model::attention_output(const Tensor& weights, const Tensor& v) {
  const double B = static_cast<double>(s_.batch), H = static_cast<double>(s_.heads);
  const double S = static_cast<double>(s_.seq), hd = static_cast<double>(s_.d_model / s_.heads);
  const double flops = 2.0 * B * H * S * S * hd;
  Tensor o;
  if (autocast_on()) {
    // Autocast casts the einsum's operands before its lowering copies V: the weights are
    // fp32 and get a low-precision copy (saved); V is already low precision, its copy too.
    const uint64_t elem = ac_->low_elem();
    Tensor pc = ac_->cast(weights, weights.bytes / 4 * elem);
    Tensor vc = clone(rt_, v);
    o = bmm(rt_, pc, vc, act() / s_.elem * elem, flops);
    vc.reset();  // the lowering's copy dies inside einsum, the autocast cast after it
    pc.reset();
  } else {
    Tensor vc = clone(rt_, v);
    o = bmm(rt_, weights, vc, act(), flops);
    vc.reset();
  }
  // The einsum output view back to (B,H,S,h); its backward reshape gets a permuted grad.
  Tensor o4 = view(rt_, o, /*copy_in_backward=*/true);
  o.reset();
  return o4;
}

// The masked_fill attention (Cs336Sdpa::masked_fill). The fp32 GPU copy of the mask
// (the last argument) is only read: its bool copy below is what the op allocates.
Tensor Cs336Model::sdpa_masked_fill(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& /*mask*/) {
  const uint64_t rows = s_.batch * s_.heads * s_.seq;
  Tensor dot = attention_scores(q, k);
  // torch.sqrt(torch.tensor(d_k, device=...)): an int64 0-d tensor, dead once its fp32
  // root exists; the root is saved by DivBackward0 (other).
  Tensor root;
  {
    Tensor d_k = new_tensor(rt_, 8, OpKind::scalar_tensor, TensorKind::temporary);
    root = new_tensor(rt_, 4, OpKind::scalar_tensor, TensorKind::temporary);
  }
  Tensor scaled = div(rt_, dot, root);  // low precision under autocast (0-d fp32 other)
  root.reset();
  Tensor keep;  // ~mask.bool(): the bool copy dies once inverted; the inverse is saved
  {
    Tensor as_bool = new_tensor(rt_, s_.seq * s_.seq, OpKind::compare, TensorKind::temporary);
    keep = new_tensor(rt_, s_.seq * s_.seq, OpKind::compare);
  }
  Tensor masked = masked_fill_inplace(rt_, scaled, keep);
  keep.reset();
  Tensor p = softmax_lastdim(masked, rows);
  Tensor o4 = attention_output(p, v);
  // The locals die at the return: the raw scores, the scaled (= masked) ones, the weights.
  dot.reset();
  scaled.reset();
  masked.reset();
  p.reset();
  return o4;
}

// Staff scaled_dot_product_attention (§2.7).
Tensor Cs336Model::sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  const uint64_t rows = s_.batch * s_.heads * s_.seq;
  const uint64_t elem = autocast_on() ? ac_->low_elem() : s_.elem;
  Tensor s0 = attention_scores(q, k);
  Tensor s1 = div_scalar(rt_, s0);
  s0.reset();
  Tensor scores_masked = where_scalar(rt_, mask, s1, elem);
  s1.reset();
  Tensor p = softmax_lastdim(scores_masked, rows);
  Tensor o4 = attention_output(p, v);
  // The frame's locals die in slot order: the scores, then the softmax weights.
  scores_masked.reset();
  p.reset();
  return o4;
}

// CausalMultiHeadSelfAttention.forward (§2.8).
Tensor Cs336Model::attention(const LayerParams& p, const Tensor& x) {
  ModuleScope module_scope(rt_, Module::attention);
  const int64_t D = s_.d_model;
  Tensor q0 = linear(x, p.q, D, D);
  Tensor k0 = linear(x, p.k, D, D);
  Tensor v0 = linear(x, p.v, D, D);
  // rearrange "... seq (heads d) -> ... heads seq d": view + permute. Its backward
  // reshape receives a permuted grad and copies.
  numeric_hint(rt_, NumericHint::split_heads);
  Tensor q = view(rt_, q0, true);
  q0.reset();
  numeric_hint(rt_, NumericHint::split_heads);
  Tensor k = view(rt_, k0, true);
  k0.reset();
  numeric_hint(rt_, NumericHint::split_heads);
  Tensor v = view(rt_, v0, true);
  v0.reset();
  Tensor token_positions;
  if (s_.revision == Cs336Revision::v2025) {
    token_positions = new_tensor(rt_, s_.seq * 8, OpKind::arange);
    const uint64_t gathered = 2 * s_.seq * (D / s_.heads / 2) * 4;
    {
      Tensor cs = new_tensor(rt_, gathered, OpKind::embedding, TensorKind::temporary);
      q = autocast_on() ? rope_cs336_autocast(rt_, q, cs)
                        : rope_cs336(rt_, q, cs);  // rebinding frees the projection output
    }
    {
      Tensor cs = new_tensor(rt_, gathered, OpKind::embedding, TensorKind::temporary);
      k = autocast_on() ? rope_cs336_autocast(rt_, k, cs) : rope_cs336(rt_, k, cs);
    }
  } else if (autocast_on()) {  // bf16 Q/K times fp32 cos/sin: fp32 Q/K
    q = rope_cs336_autocast(rt_, q, rope_buffer_);
    k = rope_cs336_autocast(rt_, k, rope_buffer_);
  } else {
    q = rope_cs336(rt_, q, rope_buffer_);  // rebinding frees the projection output
    k = rope_cs336(rt_, k, rope_buffer_);
  }
  // Causal mask: arange (int64, kept as a local) and a bool (S,S), rebuilt every call.
  // masked_fill: the CPU float mask's GPU copy, made at the top of the attention function
  // (which owns it: it dies when that function returns).
  const bool masked_fill = s_.sdpa == Cs336Sdpa::masked_fill;
  Tensor positions, mask;
  if (masked_fill) {
    mask = new_tensor(rt_, s_.seq * s_.seq * 4, OpKind::compare);
  } else {
    positions = new_tensor(rt_, s_.seq * 8, OpKind::arange);
    mask = new_tensor(rt_, s_.seq * s_.seq, OpKind::compare);
  }
  // Megatron's selective recompute checkpoints exactly this call (graph/checkpoint.h).
  Tensor o4 = run_region(rt_, RegionKind::core_attention, {q, k, v, mask},
                         [this, masked_fill](const Inputs& in) {
                           return masked_fill ? sdpa_masked_fill(in[0], in[1], in[2], in[3])
                                              : sdpa(in[0], in[1], in[2], in[3]);
                         });
  if (masked_fill) mask.reset();
  // rearrange back to (B,S,D): permute + reshape that cannot be a view: clone.
  numeric_hint(rt_, NumericHint::merge_heads);
  Tensor merged = clone(rt_, o4);
  o4.reset();
  Tensor out = linear(merged, p.o, D, D);
  // The frame's locals die in slot order: the token_positions parameter (v2025), then
  // Q, K, V, the arange, the mask and the merged output.
  token_positions.reset();
  q.reset();
  k.reset();
  v.reset();
  positions.reset();
  mask.reset();
  merged.reset();
  return out;
}

// SwiGLU with a hand-written silu (§2.9).
Tensor Cs336Model::swiglu(const LayerParams& p, const Tensor& x) {
  ModuleScope module_scope(rt_, Module::mlp);
  const int64_t D = s_.d_model, F = s_.d_ff;
  if (s_.swiglu == Cs336Swiglu::projections_first) {
    Tensor a = linear(x, p.w1, D, F);
    Tensor b = linear(x, p.w3, D, F);
    Tensor sig = sigmoid(rt_, a);
    Tensor s = mul(rt_, a, sig);  // silu(a) = a * sigmoid(a)
    sig.reset();
    Tensor m = mul(rt_, s, b);
    s.reset();
    Tensor out = linear(m, p.w2, F, D);
    m.reset();
    a.reset();  // the locals a and b die at the return
    b.reset();
    return out;
  }
  Tensor a = linear(x, p.w1, D, F);
  Tensor sig = sigmoid(rt_, a);
  Tensor s = mul(rt_, a, sig);
  sig.reset();
  a.reset();
  Tensor b = linear(x, p.w3, D, F);
  Tensor m = mul(rt_, s, b);
  s.reset();
  b.reset();
  Tensor out = linear(m, p.w2, F, D);
  return out;
}

// TransformerBlock.forward (§2.10), pre-norm.
Tensor Cs336Model::block(int32_t layer, const Tensor& x) {
  LayerScope layer_scope(rt_, layer);
  // The two halves are candidate checkpoint regions (graph/checkpoint.h); the lambdas
  // capture only values, because a checkpointed half is re-run during backward.
  Tensor x_attn = run_region(rt_, RegionKind::attention, {x}, [this, layer](const Inputs& in) {
    const LayerParams& lp = layers_[layer];
    Tensor h1 = rmsnorm(in[0], lp.ln1);
    return attention(lp, h1);
  });
  // Under autocast the branch outputs are low precision: the fp32 residual promotes.
  Tensor r1 = autocast_on() ? add(rt_, x, ac_->widen(x_attn)) : add(rt_, x, x_attn);
  if (autocast_on()) Autocast::promoted(rt_, r1, 1, x_attn);
  Tensor x_ffn = run_region(rt_, RegionKind::mlp, {r1}, [this, layer](const Inputs& in) {
    const LayerParams& lp = layers_[layer];
    Tensor h2 = rmsnorm(in[0], lp.ln2);
    return swiglu(lp, h2);
  });
  Tensor out = autocast_on() ? add(rt_, r1, ac_->widen(x_ffn)) : add(rt_, r1, x_ffn);
  if (autocast_on()) Autocast::promoted(rt_, out, 1, x_ffn);
  x_attn.reset();
  r1.reset();
  x_ffn.reset();
  return out;
}

// BasicsTransformerLM.forward (§2.11).
Tensor Cs336Model::forward(const Tensor& ids) {
  rt_.ctx.module = Module::embedding;
  Tensor w = rt_.param(embedding_);
  if (s_.revision == Cs336Revision::v2025) {
    // The 2025 Embedding indexes a slice of its weight: SliceBackward0 materialises a
    // zeros(V, D) copy of the index grad at the very end of backward (sidsoc12 trace).
    w = view(rt_, w, /*copy_in_backward=*/true);
  }
  Tensor embedded = embedding(rt_, w, ids, act());
  w.reset();
  // embedded_tokens stays bound for the whole forward; the layer loop may checkpoint.
  Tensor x = run_layers(rt_, static_cast<int32_t>(s_.layers), embedded, {},
                        [this](int32_t l, const Tensor& in, const Inputs&) { return block(l, in); });
  Tensor h = rmsnorm(x, ln_final_);
  x.reset();
  rt_.ctx.module = Module::head;
  Tensor logits = linear(h, lm_head_, s_.d_model, s_.vocab);
  rt_.name(logits.storage, rt_.program().intern("logits"));  // program/tensor_names.h
  h.reset();
  embedded.reset();
  rt_.ctx.module = Module::none;
  return logits;
}

}  // namespace memsim::graph
