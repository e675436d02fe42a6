#include "graph/hf_llama.h"

#include <string>

#include "graph/autocast.h"
#include "graph/checkpoint.h"
#include "graph/numeric.h"
#include "graph/ops_nn.h"

namespace memsim::graph {

void HfLlamaModel::construct() {
  const uint64_t e = s_.elem;
  const uint64_t D = s_.d_model, F = s_.d_ff, V = s_.vocab;
  const uint64_t kvD = s_.kv_heads * s_.head_dim();
  rt_.ctx.module = Module::embedding;
  embed_ = rt_.add_parameter(V * D * e, "model.embed_tokens.weight");
  rt_.parameters()[embed_].rows = V;  // shapes for Adafactor's factored state
  layers_.resize(s_.layers);
  for (int32_t l = 0; l < s_.layers; ++l) {
    rt_.ctx.layer = l;
    LayerParams& p = layers_[l];
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    rt_.ctx.module = Module::attention;
    p.q = lora_.add_base_weight(D, D, pre + "self_attn.q_proj.weight");
    p.k = lora_.add_base_weight(kvD, D, pre + "self_attn.k_proj.weight");
    p.v = lora_.add_base_weight(kvD, D, pre + "self_attn.v_proj.weight");
    p.o = lora_.add_base_weight(D, D, pre + "self_attn.o_proj.weight");
    rt_.ctx.module = Module::mlp;
    p.gate = lora_.add_base_weight(F, D, pre + "mlp.gate_proj.weight");
    p.up = lora_.add_base_weight(F, D, pre + "mlp.up_proj.weight");
    p.down = lora_.add_base_weight(D, F, pre + "mlp.down_proj.weight");
    rt_.ctx.module = Module::norm;
    p.ln1 = rt_.add_parameter(D * e, pre + "input_layernorm.weight");
    p.ln2 = rt_.add_parameter(D * e, pre + "post_attention_layernorm.weight");
  }
  rt_.ctx.layer = -1;
  rt_.ctx.module = Module::norm;
  norm_ = rt_.add_parameter(D * e, "model.norm.weight");
  // LlamaRotaryEmbedding's inv_freq buffer (hd/2 fp32, non-persistent):
  // 1.0 / (base ** (torch.arange(0, hd, 2, dtype=int64).float() / hd)), built on the
  // device op by op (H100 trace): arange, float, / hd, base ** x (the Python float base
  // becomes a 0-d double tensor), reciprocal, * 1.0.
  {
    const uint64_t n = s_.head_dim() / 2;
    Tensor ar = rt_.alloc(n * 8, TensorKind::temporary, OpKind::arange);
    Tensor f = rt_.alloc(n * 4, TensorKind::temporary, OpKind::to_copy);
    ar.reset();
    Tensor scaled = rt_.alloc(n * 4, TensorKind::temporary, OpKind::div_scalar);
    f.reset();
    Tensor pw = rt_.alloc(n * 4, TensorKind::temporary, OpKind::other);  // pow
    rt_.alloc(8, TensorKind::temporary, OpKind::fill).reset();  // the wrapped base
    scaled.reset();
    Tensor rec = rt_.alloc(n * 4, TensorKind::temporary, OpKind::other);  // reciprocal
    inv_freq_ = rt_.alloc(n * 4, TensorKind::other, OpKind::mul_scalar);
    rec.reset();
    pw.reset();
  }
  rt_.ctx.module = Module::head;
  if (!s_.tied) {
    lm_head_ = rt_.add_parameter(V * D * e, "lm_head.weight");
    rt_.parameters()[lm_head_].rows = V;
  }
  if (lora_.enabled()) {
    // get_peft_model: freeze the base model, then inject the adapters module by module.
    lora_.freeze_all();
    static const char* const kNames[kLlamaLinears] = {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    const uint64_t out[kLlamaLinears] = {D, kvD, kvD, D, F, F, D};
    const uint64_t in[kLlamaLinears] = {D, D, D, D, D, D, F};
    for (int32_t l = 0; l < s_.layers; ++l) {
      rt_.ctx.layer = l;
      const std::string pre = "model.layers." + std::to_string(l) + ".";
      for (uint32_t m = 0; m < kLlamaLinears; ++m) {
        if (!lora_.targets(m)) continue;
        rt_.ctx.module = m < kGateProj ? Module::attention : Module::mlp;
        layers_[l].ad[m] = lora_.add_adapter(out[m], in[m], pre + kNames[m]);
      }
    }
    rt_.ctx.layer = -1;
  }
  rt_.ctx.module = Module::none;
}

Tensor HfLlamaModel::proj(const Tensor& x, const LayerParams& p, LlamaLinear which, int32_t w,
                          int64_t d_in, int64_t d_out) {
  if (autocast_on()) return linear(x, w, d_in, d_out);  // no LoRA under autocast (refused)
  Tensor base = lora_.base_linear(x, w, d_in, d_out);
  return lora_.add_adapter_path(x, std::move(base), p.ad[which], d_in, d_out);
}

bool HfLlamaModel::autocast_on() const { return ac_ != nullptr && ac_->active(); }

// nn.Linear without bias on a contiguous (B,S,in) input: matmul folds it to 2-D (a
// view) and runs mm.
Tensor HfLlamaModel::linear(const Tensor& x, int32_t w, int64_t d_in, int64_t d_out) {
  const double flops = 2.0 * static_cast<double>(s_.rows()) * d_in * d_out;
  if (autocast_on())
    return ac_->mm_linear(x, w, static_cast<int64_t>(s_.rows()), d_in, d_out, flops);
  return mm_linear(rt_, x, rt_.param(w), s_.rows() * d_out * s_.elem, flops);
}

Tensor HfLlamaModel::rmsnorm(const Tensor& x, int32_t w) {
  const Module outer = rt_.ctx.module;
  rt_.ctx.module = Module::norm;
  const uint64_t e = s_.elem;
  // hidden_states.to(torch.float32): the same tensor in fp32, a copy otherwise.
  Tensor hf = e == 4 ? x : to_copy(rt_, x, x.bytes / e * 4);
  Tensor variance;
  {
    Tensor sq = pow2(rt_, hf);
    variance = mean_dim(rt_, sq, s_.rows() * 4);
  }
  {
    Tensor ve = add_scalar(rt_, variance);
    Tensor r = rsqrt(rt_, ve);
    ve.reset();
    hf = mul(rt_, hf, r);
  }
  // `return self.weight * hidden_states.to(input_dtype)`: the fp32 `hidden_states` is a
  // local until forward returns (H100 trace, bf16).
  Tensor hb = e == 4 ? hf : to_copy(rt_, hf, hf.bytes / 4 * e);
  // weight * x: the weight's grad sums over (B, S), a CUDA reduction that stages its
  // partial sums in global memory (graph/cuda_reduce.h; 32 MiB at 4 x 1024 x 1024 on
  // an H100).
  Tensor out = mul(rt_, rt_.param(w), hb, Broadcast::leading_dims, e);
  hb.reset();
  variance.reset();
  hf.reset();
  rt_.ctx.module = outer;
  return out;
}

Tensor HfLlamaModel::attention(const LayerParams& p, const Tensor& x, const Tensor& mask,
                               const Tensor& cos, const Tensor& sin) {
  const Module outer = rt_.ctx.module;
  rt_.ctx.module = Module::attention;
  const int64_t D = s_.d_model;
  const uint64_t e = s_.elem, B = s_.batch, H = s_.heads, S = s_.seq, hd = s_.head_dim();
  const uint64_t n_rep = static_cast<uint64_t>(s_.heads / s_.kv_heads);
  const int64_t kvD = s_.kv_heads * static_cast<int64_t>(hd);
  const double bmm_flops = 2.0 * B * H * S * S * hd;
  Tensor out;
  {
    // q/k/v: mm, then view(B,S,h,hd).transpose(1,2). The grads arriving at these views
    // are not viewable back as (B,S,h*hd), so the view's backward reshape copies --
    // unless h == 1 (MQA k/v), where the transpose only moves a size-1 dimension.
    // HF runs the three projections, then the three view+transposes: the views' autograd
    // nodes are newer than every projection's, so backward copies all three grads back
    // before the first projection's MmBackward (H100 trace).
    Tensor query = proj(x, p, kQProj, p.q, D, D);
    Tensor key = proj(x, p, kKProj, p.k, D, kvD);
    Tensor value = proj(x, p, kVProj, p.v, D, kvD);
    numeric_hint(rt_, NumericHint::split_heads);  // numeric mode only (graph/numeric.h)
    query = view(rt_, query, s_.heads > 1);
    numeric_hint(rt_, NumericHint::split_heads);
    key = view(rt_, key, s_.kv_heads > 1);
    numeric_hint(rt_, NumericHint::split_heads);
    value = view(rt_, value, s_.kv_heads > 1);
    // RoPE keeps q's (B,S,H,hd) memory layout (TensorIterator follows the first input).
    // `query_states, key_states = apply_rotary_pos_emb(query_states, key_states, ...)`:
    // the un-rotated q and k stay alive until both rotations have returned.
    {
      const bool low = autocast_on();  // low-precision q/k times fp32 cos/sin: fp32 q/k
      Tensor q_embed = low ? rope_hf_autocast(rt_, query, cos, sin) : rope_hf(rt_, query, cos, sin);
      Tensor k_embed = low ? rope_hf_autocast(rt_, key, cos, sin) : rope_hf(rt_, key, cos, sin);
      query = std::move(q_embed);
      key = std::move(k_embed);
    }
    // repeat_kv: expand + reshape copies, except for a single KV head (a view).
    const bool repeat_copies = n_rep > 1 && s_.kv_heads > 1;
    if (n_rep > 1) {
      key = repeat_copies ? expand_clone(rt_, key, n_rep) : expand_view(rt_, key, n_rep);
      value = repeat_copies ? expand_clone(rt_, value, n_rep) : expand_view(rt_, value, n_rep);
    }
    Tensor attn_output;
    if (s_.attention == HfAttention::eager) {
      // The eager attention core (matmul, scale, mask, softmax, dropout, matmul) is the
      // candidate region of `selective` (graph/checkpoint.h); it captures values only.
      Tensor o4 = run_region(rt_, RegionKind::core_attention, {query, key, value, mask},
                             [this](const Inputs& in) { return eager_core(in[0], in[1], in[2], in[3]); });
      numeric_hint(rt_, NumericHint::merge_heads);
      attn_output = clone(rt_, o4);  // transpose(1, 2).contiguous()
    } else {
      SdpaShape sh{B, H, S, hd, e};
      // The kernel's (B,S,H,hd) output makes transpose(1,2).contiguous() a no-op.
      const bool flash = s_.attention == HfAttention::flash;
      attn_output = run_region(rt_, RegionKind::core_attention, {query, key, value},
                               [this, sh, flash, bmm_flops](const Inputs& in) {
                                 return flash ? sdpa_flash(rt_, in[0], in[1], in[2], sh, 2 * bmm_flops)
                                              : sdpa_efficient(rt_, in[0], in[1], in[2], sh, 2 * bmm_flops);
                               });
    }
    out = proj(attn_output, p, kOProj, p.o, D, D);
  }  // the attention forward's locals (q/k/v states, attn_output) die here
  rt_.ctx.module = outer;
  return out;
}

// matmul(q, k^T) / sqrt(hd) + mask, softmax (fp32), dropout, matmul with v: the
// (B,H,S,hd) result, still in the bmm's layout.
Tensor HfLlamaModel::eager_core(const Tensor& query, const Tensor& key, const Tensor& value,
                                const Tensor& mask) {
  const uint64_t e = s_.elem, B = s_.batch, H = s_.heads, S = s_.seq, hd = s_.head_dim();
  const uint64_t D = s_.d_model;
  const uint64_t n_rep = static_cast<uint64_t>(s_.heads / s_.kv_heads);
  const bool repeat_copies = n_rep > 1 && s_.kv_heads > 1;
  const double bmm_flops = 2.0 * B * H * S * S * hd;
  // matmul reshapes: q (transposed layout) copies; k^T and v are views when
  // repeat_kv made contiguous copies, copies otherwise.
  const bool ac = autocast_on();
  Tensor w;
  if (ac) {
    // matmul is a lower-precision op: q and k (fp32 after RoPE) are cast first (saved),
    // then matmul's reshape copies the q copy (it keeps q's transposed layout); k^T
    // of a contiguous key copy is a view. Scores are low precision.
    const uint64_t low = ac_->low_elem();
    Tensor qa = ac_->cast(query, query.bytes / 4 * low);
    Tensor ka = ac_->cast(key, key.bytes / 4 * low);
    // The cast of an expanded (single-KV-head) key is a dense copy too: k^T is a view.
    Tensor qc = clone(rt_, qa);
    Tensor kc = n_rep > 1 ? ka : clone(rt_, ka);
    w = bmm(rt_, qc, kc, B * H * S * S * low, bmm_flops);
    qc.reset();
    kc.reset();
    qa.reset();  // not saved (bmm saved the reshaped copy): dies with the matmul
    ka.reset();
  } else {
    Tensor qc = clone(rt_, query);
    Tensor kc = repeat_copies ? key : clone(rt_, key);
    numeric_hint(rt_, NumericHint::transpose_b);  // q @ k^T (k kept (B,H,S,hd))
    w = bmm(rt_, qc, kc, B * H * S * S * e, bmm_flops);
    qc.reset();
    kc.reset();
  }
  w = div_scalar(rt_, w);
  if (mask.defined() && ac) {  // low-precision scores + the fp32 mask: fp32
    Tensor low_w = w;
    w = add(rt_, ac_->widen(low_w), mask);
    Autocast::promoted(rt_, w, 0, low_w);
  } else if (mask.defined()) {
    numeric_hint(rt_, NumericHint::mask_slice);  // attention_mask[:, :, :, :S]
    w = add(rt_, w, mask);
  }
  if (e == 4) {
    w = softmax(rt_, w);
  } else {
    // `attn_weights = F.softmax(attn_weights, dtype=float32).to(dtype)`: softmax converts
    // its input first (the copy dies with the call), .to casts back; the bf16 scores are
    // rebound only once the whole expression has returned (H100 trace).
    Tensor p32;
    {
      Tensor w32 = to_copy(rt_, w, w.bytes / e * 4);
      p32 = softmax(rt_, w32);
    }
    Tensor p = to_copy(rt_, p32, p32.bytes / 4 * e);
    p32.reset();
    w = std::move(p);
  }
  if (s_.dropout > 0.0) w = native_dropout(rt_, w, e);
  Tensor o;
  if (ac) {  // the fp32 probabilities are cast (saved) before matmul copies v
    Tensor wa = ac_->cast(w, w.bytes / 4 * ac_->low_elem());
    Tensor vc = repeat_copies ? value : clone(rt_, value);
    o = bmm(rt_, wa, vc, B * S * D * ac_->low_elem(), bmm_flops);
  } else {
    Tensor vc = repeat_copies ? value : clone(rt_, value);
    o = bmm(rt_, w, vc, B * S * D * e, bmm_flops);
    vc.reset();
  }
  w.reset();
  return view(rt_, o, /*copy_in_backward=*/true);  // `o` dies on return
}

Tensor HfLlamaModel::mlp(const LayerParams& p, const Tensor& x) {
  const Module outer = rt_.ctx.module;
  rt_.ctx.module = Module::mlp;
  const int64_t D = s_.d_model, F = s_.d_ff;
  Tensor m;
  {
    Tensor a = silu(rt_, proj(x, p, kGateProj, p.gate, D, F));
    Tensor u = proj(x, p, kUpProj, p.up, D, F);
    m = mul(rt_, a, u);
  }
  Tensor out = proj(m, p, kDownProj, p.down, F, D);
  rt_.ctx.module = outer;
  return out;
}

Tensor HfLlamaModel::layer(int32_t l, const Tensor& x, const Inputs& extra) {
  const int32_t outer = rt_.ctx.layer;
  rt_.ctx.layer = l;
  // extra = {causal_mask, cache_position, cos, sin} (see forward). The two halves are
  // candidate checkpoint regions (graph/checkpoint.h); their lambdas capture values only,
  // because a checkpointed half is re-run during backward.
  Tensor h = run_region(rt_, RegionKind::attention, {x, extra[0], extra[2], extra[3]},
                        [this, l](const Inputs& in) {
                          const LayerParams& p = layers_[l];
                          Tensor h1 = rmsnorm(in[0], p.ln1);
                          return attention(p, h1, in[1], in[2], in[3]);
                        });
  // Under autocast the attention/MLP outputs are low precision: the fp32 residual promotes.
  Tensor r1 = autocast_on() ? add(rt_, x, ac_->widen(h)) : add(rt_, x, h);
  if (autocast_on()) Autocast::promoted(rt_, r1, 1, h);
  h.reset();  // `hidden_states = residual + hidden_states` drops the attention output
  h = run_region(rt_, RegionKind::mlp, {r1}, [this, l](const Inputs& in) {
    const LayerParams& p = layers_[l];
    Tensor h2 = rmsnorm(in[0], p.ln2);
    return mlp(p, h2);
  });
  Tensor out = autocast_on() ? add(rt_, r1, ac_->widen(h)) : add(rt_, r1, h);
  if (autocast_on()) Autocast::promoted(rt_, out, 1, h);
  rt_.ctx.layer = outer;
  return out;
}

Tensor HfLlamaModel::forward(const Tensor& ids) {
  const uint64_t e = s_.elem, D = s_.d_model, S = s_.seq, hd = s_.head_dim();
  rt_.ctx.module = Module::embedding;
  Tensor embed_w, head_w;
  if (s_.tied) {  // both grads meet in the weight's input buffer (ops_nn.h TiedWeight)
    TiedWeight tied(rt_, rt_.param(embed_));
    embed_w = tied.use(1);
    head_w = tied.use(0);
  } else {
    embed_w = rt_.param(embed_);
  }
  Tensor hidden;
  {
    Tensor inputs_embeds = embedding_nn(rt_, embed_w, ids, s_.rows() * D * e, D);
    embed_w.reset();
    Tensor cache_position = new_tensor(rt_, S * 8, OpKind::arange);
    Tensor causal_mask;
    if (s_.attention == HfAttention::eager) {
      // _prepare_4d_causal_attention_mask_with_cache_position: target = S + 1.
      const uint64_t T = S + 1;
      {
        Tensor full = new_tensor(rt_, S * T * e, OpKind::fill, TensorKind::temporary);
        numeric_hint(rt_, NumericHint::causal_mask);
        causal_mask = new_tensor(rt_, S * T * e, OpKind::fill);  // triu(full)
      }
      Tensor ar = new_tensor(rt_, T * 8, OpKind::arange, TensorKind::temporary);
      numeric_hint(rt_, NumericHint::unread);  // folded into causal_mask above
      Tensor gt = new_tensor(rt_, S * T, OpKind::compare, TensorKind::temporary);
      ar.reset();  // causal_mask *= (arange > cache_position): in place
    }
    Tensor cos, sin;
    {
      // LlamaRotaryEmbedding.forward under no_grad, fp32, batch 1 of position ids.
      const bool was = rt_.grad_enabled;
      rt_.grad_enabled = false;
      Tensor pos = new_tensor(rt_, S * 4, OpKind::to_copy, TensorKind::temporary);
      Tensor freqs = new_tensor(rt_, hd / 2 * S * 4, OpKind::bmm, TensorKind::temporary);
      // inv_freq @ position_ids is a cuBLAS matmul: the step's first one, so it is where
      // the forward thread's cuBLAS workspace is allocated (measured on an H100,
      // tests/data/cuda_runs.json), not at q_proj.
      rt_.note_gemm();
      Tensor emb = new_tensor(rt_, S * hd * 4, OpKind::other, TensorKind::temporary);
      Tensor cos32 = new_tensor(rt_, S * hd * 4, OpKind::other);
      Tensor sin32 = new_tensor(rt_, S * hd * 4, OpKind::other);
      numeric_hint(rt_, NumericHint::rope_cos);
      cos32 = new_tensor(rt_, S * hd * 4, OpKind::mul_scalar);  // * attention_scaling
      numeric_hint(rt_, NumericHint::rope_sin);
      sin32 = new_tensor(rt_, S * hd * 4, OpKind::mul_scalar);
      if (e != 4) {  // return cos.to(x.dtype), sin.to(x.dtype)
        cos = new_tensor(rt_, S * hd * e, OpKind::to_copy);
        sin = new_tensor(rt_, S * hd * e, OpKind::to_copy);
      } else {
        cos = std::move(cos32);
        sin = std::move(sin32);
      }
      // The frame's locals die in declaration order (H100 trace).
      pos.reset();
      freqs.reset();
      emb.reset();
      cos32.reset();
      sin32.reset();
      rt_.grad_enabled = was;
    }
    // The decoder loop. With gradient checkpointing HF calls
    // checkpoint(decoder_layer.__call__, hidden_states, causal_mask, position_ids, ...,
    // cache_position, position_embeddings): the frame holds those tensors (position_ids
    // is a view of cache_position).
    Tensor h = run_layers(rt_, static_cast<int32_t>(s_.layers), inputs_embeds,
                          {causal_mask, cache_position, cos, sin},
                          [this](int32_t l, const Tensor& in, const Inputs& extra) {
                            return layer(l, in, extra);
                          });
    hidden = rmsnorm(h, norm_);
    // LlamaModel.forward returns: its locals die in declaration order (H100 trace).
    inputs_embeds.reset();
    cache_position.reset();
    causal_mask.reset();
    h.reset();
    cos.reset();
    sin.reset();
  }
  rt_.ctx.module = Module::head;
  Tensor logits;
  if (s_.tied) {
    logits = mm_linear(rt_, hidden, head_w, s_.rows() * s_.vocab * e,
                       2.0 * static_cast<double>(s_.rows()) * D * s_.vocab);
  } else {
    logits = linear(hidden, lm_head_, D, s_.vocab);
  }
  if (autocast_on())
    logits = to_copy(rt_, logits, logits.bytes / ac_->low_elem() * 4);  // logits.float()
  else if (e != 4)
    logits = to_copy(rt_, logits, logits.bytes / e * 4);  // logits.float()
  hidden.reset();  // a local of forward: it dies when forward returns (H100 trace)
  rt_.ctx.module = Module::none;
  return logits;
}

Tensor HfLlamaModel::loss(const Tensor& logits, const Tensor& labels) {
  const Module outer = rt_.ctx.module;
  rt_.ctx.module = Module::loss;
  const uint64_t shifted_rows = static_cast<uint64_t>(s_.batch * (s_.seq - 1));
  Tensor shift_logits;
  {
    Tensor sl = slice_seq(rt_, logits, shifted_rows * s_.vocab * 4);
    numeric_hint(rt_, NumericHint::shift_logits);
    shift_logits = clone(rt_, sl);  // .contiguous()
  }
  numeric_hint(rt_, NumericHint::shift_labels, labels);  // labels[..., 1:].contiguous()
  Tensor shift_labels = new_tensor(rt_, shifted_rows * 8, OpKind::clone, TensorKind::temporary);
  Tensor logp = log_softmax(rt_, shift_logits);
  Tensor out = nll_loss(rt_, logp, shift_labels, 4);
  rt_.ctx.module = outer;
  return out;
}

}  // namespace memsim::graph
