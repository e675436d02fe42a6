// DecoderModel's attention modules (graph/models/decoder.h): Llama-lineage self-attention with
// its knobs (biases, head_dim, q/k norms, eager cores with soft-capping, SDPA kernels)
// and GPT-2's attention (fused c_attn, the where-masked _attn).
#include <cmath>

#include "graph/autocast.h"
#include "graph/checkpoint.h"
#include "graph/models/decoder.h"
#include "graph/models/kv_cache.h"
#include "graph/numeric/numeric.h"
#include "graph/ops/ops_nn.h"
#include "graph/ops/ops_ring.h"
#include "graph/ops/ops_sdpa_cudnn.h"

namespace memsim::graph {

namespace {

// Phi-3's apply_rotary_pos_emb as transformers 5.17 writes it (models/phi3/modeling_phi3.py,
// also huggingface/transformers 00d4b3d2 :177-206; the v4.45 row memsim's default models
// has the plain form): `q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]`, k
// likewise, then `q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass],
// dim=-1)` and k_embed the same, with the cat even when the rotary covers the whole head
// (q_pass empty). The fused qkv module (Phi-3's) on 5.x's attention function is that code.
bool rope_pass_cat(const DecoderArch& a) { return a.fused_qkv && a.attn_function; }

}  // namespace

// The q, k, v projections and their (B,h,S,hd) views, with the q/k norms where the
// model puts them. `keep`: a tensor the attention's frame holds until it returns (Phi-3's
// fused qkv output).
void DecoderModel::project_qkv(const LayerParams& p, const Tensor& x, Tensor& query, Tensor& key,
                               Tensor& value, Tensor& keep) {
  const DecoderArch& a = arch();
  const uint64_t H = s_.heads, KV = static_cast<uint64_t>(s_.kv_heads);
  const uint64_t hd = s_.head_dim(), rows = s_.rows();
  if (a.fused_qkv) {
    const uint64_t e = act_elem();  // the projection's output dtype (low under autocast)
    // Phi-3: qkv = qkv_proj(x); q, k, v = slices of it (views; each slice's backward is
    // a zeros(qkv) + copy, the three summed into qkv's grad), then the views.
    Tensor qkv = project(x, p, p.qkv);
    query = slice_seq(rt_, qkv, rows * H * hd * e);
    key = slice_seq(rt_, qkv, rows * KV * hd * e);
    value = slice_seq(rt_, qkv, rows * KV * hd * e);
    query = view(rt_, query, H > 1);
    key = view(rt_, key, KV > 1);
    value = view(rt_, value, KV > 1);
    keep = std::move(qkv);  // a local of Phi3Attention.forward
    return;
  }
  if (a.qk_norm == QkNorm::head && a.qk_norm_at == QkNormAt::view) {
    // Qwen3: `self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)`, then k
    // likewise, then v. The norm's input is the contiguous (B,S,h,hd) view and its output
    // contiguous, so the forward copies nothing. In backward, eager attention's matmul
    // hands q/k a contiguous (B,h,S,hd) grad; the transpose's backward makes it a
    // (B,S,h,hd) view with (B,h,S,hd) memory, the norm's backward ops keep that layout
    // (TensorIterator follows its input), and the first view's backward (reshape to
    // (B,S,h*hd)) cannot view it: one copy per projection, allocated after the norm's
    // ToCopyBackward0 and freed after the projection's MmBackward0 (H100 trace of
    // transformers 5.17's Qwen3-MoE, tests/data/gpu/moe: a (T, h*hd) and a (T, kv*hd)
    // alloc/free per layer). With one KV head the transpose moves a size-1 dimension and
    // the grad stays viewable. SDPA's kernels return dq/dk in q/k's own layout (not
    // checked on a GPU for Qwen3): no copy is modelled there.
    const bool eager = s_.attention == HfAttention::eager;
    query = project(x, p, p.q);
    query = view(rt_, query, eager && H > 1);
    query = qk_norm(query, p.q_norm, rows * H, hd);
    query = view(rt_, query, false);
    key = project(x, p, p.k);
    key = view(rt_, key, eager && KV > 1);
    key = qk_norm(key, p.k_norm, rows * KV, hd);
    key = view(rt_, key, false);
    value = project(x, p, p.v);
    value = view(rt_, value, KV > 1);
    return;
  }
  // q/k/v: mm, then view(B,S,h,hd).transpose(1,2). The grads arriving at these views
  // are not viewable back as (B,S,h*hd), so the view's backward reshape copies --
  // unless h == 1 (MQA k/v), where the transpose only moves a size-1 dimension.
  // HF runs the three projections, then the three view+transposes: the views' autograd
  // nodes are newer than every projection's, so backward copies all three grads back
  // before the first projection's MmBackward (H100 trace). OLMo-2 norms each whole
  // projection output right after it (`self.q_norm(self.q_proj(x))`).
  if (a.qk_norm == QkNorm::head) {
    // Gemma-3 (Gemma3Attention.forward v4.50): `self.q_proj(x).view(hidden_shape).transpose(1,
    // 2)`, then k, then v, each view right after its projection; then q_norm and k_norm on
    // the transposed (B,h,S,hd) views. In backward the norms' grads come out in the layout
    // of the grad they were handed (eager attention's matmul and RoPE give a contiguous
    // (B,h,S,hd) one; every mul in the norm's derivative takes `grad` as its first operand,
    // and TensorIterator gives the output the first input's layout), so after the
    // transpose's backward the view's reshape to (B,S,h*hd) copies, as it does for v and
    // for Llama: one q-sized and one k-sized copy per layer (H100 trace of the Gemma-3
    // stand-in, fp32 and bf16: a 32 and a 16 MiB alloc each freed after its projection's
    // MmBackward0). As each view's node is newer than its own projection only, backward
    // runs v's copy and MmBackward0, then k's, then q's (the trace's order).
    const uint64_t heads[3] = {H, KV, KV};
    const Proj* proj[3] = {&p.q, &p.k, &p.v};
    Tensor* out[3] = {&query, &key, &value};
    for (int i = 0; i < 3; ++i) {
      *out[i] = project(x, p, *proj[i]);
      numeric_hint(rt_, NumericHint::split_heads);  // numeric mode only (graph/numeric/numeric.h)
      *out[i] = view(rt_, *out[i], heads[i] > 1);
    }
    query = norm(query, p.q_norm, rows * H, hd);
    key = norm(key, p.k_norm, rows * KV, hd);
    return;
  }
  const bool full = a.qk_norm == QkNorm::full;
  query = project(x, p, p.q);
  if (full) query = qk_norm(query, p.q_norm, rows, s_.q_dim());
  key = project(x, p, p.k);
  if (full) key = qk_norm(key, p.k_norm, rows, s_.kv_dim());
  value = project(x, p, p.v);
  numeric_hint(rt_, NumericHint::split_heads);  // numeric mode only (graph/numeric/numeric.h)
  query = view(rt_, query, s_.heads > 1);
  numeric_hint(rt_, NumericHint::split_heads);
  key = view(rt_, key, s_.kv_heads > 1);
  numeric_hint(rt_, NumericHint::split_heads);
  value = view(rt_, value, s_.kv_heads > 1);
}

Tensor DecoderModel::attention(const LayerParams& p, const Tensor& x, const Tensor& mask,
                               const Tensor& cos_in, const Tensor& sin_in) {
  if (titan()) return attention_titan(p, x);  // decoder_impl.cpp (cos_in is freqs_cis)
  if (tune()) return attention_tune(p, x);
  if (litgpt()) return attention_litgpt(p, x);  // decoder_litgpt.cpp
  if (arch().mla.enabled()) return attention_mla(p, x, mask, cos_in, sin_in);  // decoder_mla.cpp
  ModuleScope module_scope(rt_, Module::attention);
  const DecoderArch& a = arch();
  const uint64_t B = s_.batch, H = s_.heads, S = s_.seq, hd = s_.head_dim();
  const uint64_t rd = s_.rotary_dim();
  const double bmm_flops = 2.0 * B * H * S * S * hd;
  Tensor out;
  {
    Tensor query, key, value, qkv;  // qkv: Phi-3's fused output, alive until the attention returns
    project_qkv(p, x, query, key, value, qkv);
    // Gemma, Mistral, Phi-3, OLMo-2: `cos, sin = self.rotary_emb(value_states,
    // position_ids)` in every attention (no attention_scaling multiply).
    Tensor cos = cos_in, sin = sin_in;
    if (a.rope == RopeAt::layer) rope_tables(false, cos, sin);
    // RoPE keeps q's (B,S,H,hd) memory layout (TensorIterator follows the first input).
    // `query_states, key_states = apply_rotary_pos_emb(query_states, key_states, ...)`:
    // the un-rotated q and k stay alive until both rotations have returned.
    Tensor q_rot, k_rot, q_pass, k_pass;  // partial rotary's locals
    if (rope_pass_cat(a)) {
      // Phi-3 on 5.x (rope_pass_cat above; H200 trace tf_arch_phi3_*: per projection
      // q*cos, -x2, cat, *sin, +, then the 16 MiB cat whose input dies at once, and no
      // copies of q or k in the scores' matmul). q[..., :hd] is no slice (an alias of q,
      // whose backward passes the grad through: no memory); q[..., hd:] is an empty slice
      // whose SliceBackward0 still allocates zeros(q) (cat_tensors_backward narrows a 4-D
      // empty input instead of skipping it) and meets the rotary's grad in q's input
      // buffer. The two pass slices are made before either rotation (their nodes are older,
      // so backward runs them after both rotations). The cats are contiguous (B,h,S,hd).
      // tools/fixtures/probe_phi3_rope_cat.py checks these on torch 1.13 CPU.
      q_rot = rd < hd ? slice_seq(rt_, query, query.bytes / hd * rd) : query;
      q_pass = slice_seq(rt_, query, query.bytes / hd * (hd - rd));
      k_rot = rd < hd ? slice_seq(rt_, key, key.bytes / hd * rd) : key;
      k_pass = slice_seq(rt_, key, key.bytes / hd * (hd - rd));
      {
        Tensor q_embed = rope_hf(rt_, q_rot, cos, sin);
        query = cat2(rt_, q_embed, q_pass);
      }  // the sum dies as soon as the cat has copied it
      {
        Tensor k_embed = rope_hf(rt_, k_rot, cos, sin);
        key = cat2(rt_, k_embed, k_pass);
      }
    } else if (rd < hd) {
      // StableLM: rotary on q[..., :rd] and k[..., :rd] (slices), then cat with the rest:
      // contiguous (B,h,S,hd) q and k, which matmul uses without copies.
      q_rot = slice_seq(rt_, query, query.bytes / hd * rd);
      q_pass = slice_seq(rt_, query, query.bytes / hd * (hd - rd));
      k_rot = slice_seq(rt_, key, key.bytes / hd * rd);
      k_pass = slice_seq(rt_, key, key.bytes / hd * (hd - rd));
      {
        Tensor q_embed = rope_hf(rt_, q_rot, cos, sin);
        Tensor k_embed = rope_hf(rt_, k_rot, cos, sin);
        q_rot = std::move(q_embed);
        k_rot = std::move(k_embed);
      }
      query = cat2(rt_, q_rot, q_pass);
      key = cat2(rt_, k_rot, k_pass);
    } else {
      // Low-precision q/k times the model's fp32 cos/sin: fp32 q/k. Per-layer tables are
      // cast to the value states' dtype (rope_tables): low q/k stay low. After a q/k
      // RMSNorm (the fp32 weight times the low normalised states) q/k are fp32 already.
      const bool low = autocast_on() && a.rope != RopeAt::layer && a.qk_norm == QkNorm::none;
      Tensor q_embed = low ? rope_hf_autocast(rt_, query, cos, sin) : rope_hf(rt_, query, cos, sin);
      Tensor k_embed = low ? rope_hf_autocast(rt_, key, cos, sin) : rope_hf(rt_, key, cos, sin);
      query = std::move(q_embed);
      key = std::move(k_embed);
    }
    // Generation: past_key_value.update(key_states, value_states, layer_idx) hands back the
    // cached keys/values (graph/models/kv_cache.h).
    if (cache_ != nullptr) {
      // Whether the states are dense (B, KV, S, hd) (a quantized cache's .contiguous()): one
      // token's are; partial rotary's cat makes k dense; a single KV head's transposed view of
      // its own projection is dense; Phi-3's slices of the fused qkv never are.
      const bool one = S == 1, own_proj = s_.kv_heads == 1 && !qkv.defined();
      const bool k_dense = rd < hd || rope_pass_cat(a);
      cache_->states_layout(one || k_dense || own_proj, one || own_proj);
      cache_->update(static_cast<int32_t>(&p - layers_.data()), key, value);
      kv_dense_ = cache_->contiguous();
      // v5 layers: a sliding layer's keys are its window, the others' every token so far.
      if (cache_->layered()) s_.keys = cache_->returned_tokens();
    }
    Tensor attn_output;
    if (a.attn_function) {
      // v4.50+: attention_interface(self, q, k, v, mask): repeat_kv, the core and the
      // transpose-contiguous inside (the `selective` region); this frame's key/value
      // names keep the pre-repeat tensors until it returns.
      attn_output = run_region(rt_, RegionKind::core_attention, {query, key, value, mask},
                               [this](const Inputs& in) {
                                 return attention_function(in[0], in[1], in[2], in[3]);
                               });
    } else {
      // repeat_kv: expand + reshape copies, except for a single KV head (a view).
      const uint64_t n_rep = H / static_cast<uint64_t>(s_.kv_heads);
      const bool repeat_copies = n_rep > 1 && s_.kv_heads > 1;
      if (n_rep > 1) {
        key = repeat_copies ? expand_clone(rt_, key, n_rep) : expand_view(rt_, key, n_rep);
        value = repeat_copies ? expand_clone(rt_, value, n_rep) : expand_view(rt_, value, n_rep);
      }
      if (s_.attention == HfAttention::eager) {
        // The eager attention core (matmul, scale, mask, softmax, dropout, matmul) is the
        // candidate region of `selective` (graph/checkpoint.h); it captures values only.
        Tensor o4 = run_region(rt_, RegionKind::core_attention, {query, key, value, mask},
                               [this](const Inputs& in) { return core(in[0], in[1], in[2], in[3]); });
        numeric_hint(rt_, NumericHint::merge_heads);
        // transpose(1, 2).contiguous(); one query's (B,H,1,hd) is contiguous already.
        attn_output = one_query() ? o4 : clone(rt_, o4);
      } else {
        // The kernel's (B,S,H,hd) output makes transpose(1,2).contiguous() a no-op; the
        // ring's contiguous merged output copies (graph/ops/ops_ring.h).
        attn_output = run_region(rt_, RegionKind::core_attention, {query, key, value},
                                 [this, bmm_flops](const Inputs& in) {
                                   return sdpa_kernel(in[0], in[1], in[2], 2 * bmm_flops);
                                 });
        if (ring_copies_output()) attn_output = clone(rt_, attn_output);
      }
    }
    out = project(attn_output, p, p.o);
  }  // the attention forward's locals (q/k/v states, attn_output) die here
  return out;
}

// eager_attention_forward / sdpa_attention_forward (v4.50+): repeat_kv, the core, and
// `attn_output.transpose(1, 2).contiguous()`; the probabilities go to the layer's
// `self_attn_weights` (layer_weights_).
Tensor DecoderModel::attention_function(const Tensor& query, const Tensor& key_in,
                                        const Tensor& value_in, const Tensor& mask) {
  const uint64_t B = s_.batch, H = s_.heads, S = s_.seq, hd = s_.head_dim();
  const uint64_t n_rep = H / static_cast<uint64_t>(s_.kv_heads);
  const bool repeat_copies = n_rep > 1 && s_.kv_heads > 1;
  Tensor key = key_in, value = value_in;
  // transformers 5.x (integrations/sdpa_attention.py, use_gqa_in_sdpa): without a mask and
  // with head_dim <= 256 SDPA gets the KV-headed k/v and enable_gqa=True, no repeat_kv.
  // (memsim's SDPA rows never pass a mask: windows shorter than S are refused.)
  const bool gqa = arch().sdpa_gqa && s_.attention != HfAttention::eager && !mask.defined() &&
                   hd <= 256 && n_rep > 1;
  if (gqa) return sdpa_kernel(query, key, value, 4.0 * B * H * S * S * hd);
  if (n_rep > 1) {
    key = repeat_copies ? expand_clone(rt_, key_in, n_rep) : expand_view(rt_, key_in, n_rep);
    value = repeat_copies ? expand_clone(rt_, value_in, n_rep) : expand_view(rt_, value_in, n_rep);
  }
  if (s_.attention != HfAttention::eager) {
    Tensor out = sdpa_kernel(query, key, value, 4.0 * B * H * S * S * hd);
    // transpose(1, 2).contiguous(): a no-op on the kernel's (B,S,H,hd) output, a copy of
    // the ring's contiguous merged output (graph/ops/ops_ring.h).
    if (ring_copies_output()) out = clone(rt_, out);
    return out;
  }
  Tensor o4 = core(query, key, value, mask);
  if (one_query()) return o4;  // generation: one query's output is contiguous already
  // transpose(1, 2).contiguous(); the repeated key/value are the function's locals, alive
  // until it returns (without grad nothing else holds them).
  Tensor out = clone(rt_, o4);
  key.reset();
  value.reset();
  return out;
}

// scaled_dot_product_attention(q, k, v, is_causal=True) on the fused kernel (HF's SDPA
// path builds no mask without padding). Under autocast SDPA is on CUDA's lower-precision
// list (torch v2.4 aten/src/ATen/autocast_mode.cpp, AT_FORALL_LOWER_PRECISION_FP:
// scaled_dot_product_attention and _scaled_dot_product_flash_attention): the wrapper casts
// its tensor arguments right to left (v, k, q; the compiler's order, as for linear) to
// the low dtype. v is v_proj's low output already (no copy); q and k are fp32 after RoPE
// with the model's fp32 cos/sin, so each gets a _to_copy (an expanded single-KV-head key
// a dense one). The casts keep q's (B,S,H,hd) strides, so the kernel transposes them
// without copies. The kernel saves the low q/k/v casts, its low output and the fp32
// logsumexp; dq/dk come back low and the casts' ToCopyBackward0 makes them fp32. The
// casts are activations, never cached (except a reentrant re-run's detached inputs:
// Autocast::cast).
Tensor DecoderModel::sdpa_kernel(const Tensor& q, const Tensor& k, const Tensor& v, double flops) {
  const uint64_t B = s_.batch, H = s_.heads, S = s_.seq, hd = s_.head_dim();
  uint64_t e = s_.elem;
  // k/v with fewer heads than q: enable_gqa (attention_function); else q's heads.
  const uint64_t kv_heads = k.bytes < q.bytes ? static_cast<uint64_t>(s_.kv_heads) : 0;
  Tensor qa = q, ka = k, va = v;
  if (autocast_on()) {
    e = ac_->low_elem();
    const uint64_t low = B * H * S * hd * e;  // q, and k/v after repeat_kv
    const uint64_t low_kv = kv_heads != 0 ? B * kv_heads * S * hd * e : low;
    if (va.bytes != low_kv) va = ac_->cast(v, v.bytes / 4 * e);
    if (ka.bytes != low_kv) ka = ac_->cast(k, k.bytes / 4 * e);
    if (qa.bytes != low) qa = ac_->cast(q, q.bytes / 4 * e);
  }
  const SdpaShape sh{B, H, S, hd, e, kv_heads};
  Tensor out;
  if (s_.cp > 1) {  // context_parallel: the call runs as ring attention (graph/ops/ops_ring.h)
    RingSpec ring{static_cast<uint32_t>(s_.cp), s_.cp_rank, s_.cp_alltoall};
    // repeat_kv's expand + reshape copies are contiguous (B,H,L,hd); the transposed
    // projections (no repeat) and an expanded single KV head are not.
    ring.kv_contiguous = H / static_cast<uint64_t>(s_.kv_heads) > 1 && s_.kv_heads > 1;
    out = sdpa_ring_flash(rt_, qa, ka, va, sh, ring);
  } else {
    switch (s_.attention) {
      case HfAttention::flash: out = sdpa_flash(rt_, qa, ka, va, sh, flops); break;
      case HfAttention::cudnn: out = sdpa_cudnn(rt_, qa, ka, va, sh, flops); break;
      default: out = sdpa_efficient(rt_, qa, ka, va, sh, flops); break;
    }
  }
  qa.reset();  // the wrapper's temporaries, in reverse order of construction
  ka.reset();
  va.reset();
  return out;
}

// matmul(q, k^T) / sqrt(hd) (or * scaling) [soft-cap] + mask, softmax (fp32), dropout,
// matmul with v: the (B,H,S,hd) result, still in the bmm's layout.
Tensor DecoderModel::core(const Tensor& query, const Tensor& key, const Tensor& value,
                          const Tensor& mask) {
  const DecoderArch& a = arch();
  // Multi-head latent attention (decoder_mla.cpp): q/k are qk_head_dim wide and contiguous
  // (cat of their nope and rope parts), the output H x v_head_dim.
  const bool mla = a.mla.enabled();
  const uint64_t e = s_.elem, B = s_.batch, H = s_.heads, S = s_.seq;
  const uint64_t hd = mla ? static_cast<uint64_t>(a.mla.qk_head_dim()) : s_.head_dim();
  const uint64_t qD = mla ? H * static_cast<uint64_t>(a.mla.v_head_dim) : s_.q_dim();
  const uint64_t T = s_.key_len();  // keys: S in training, the cache's length in generation
  const uint64_t n_rep = static_cast<uint64_t>(s_.heads / s_.kv_heads);
  const bool repeat_copies = n_rep > 1 && s_.kv_heads > 1;
  // Generation: a cached dense (B, H, T, hd) key/value is a view for matmul's reshape (an
  // expanded single KV head still copies); one query's transposed q is too.
  const bool kv_view = kv_dense_ && cache_ != nullptr && n_rep == 1;
  const double bmm_flops = 2.0 * B * H * S * S * hd;
  // matmul reshapes: q (transposed layout) copies; k^T and v are views when
  // repeat_kv made contiguous copies, copies otherwise. Partial rotary's cat (and 5.x
  // Phi-3's, rope_pass_cat) makes q and k contiguous: no copies.
  const bool qk_contiguous = mla || s_.rotary_dim() < hd || rope_pass_cat(a);
  const bool ac = autocast_on();
  Tensor w;
  const uint64_t low_qk = ac ? B * H * S * hd * ac_->low_elem() : 0;
  const bool qk_low = ac && query.bytes == low_qk;  // per-layer rotary: q/k already low
  if (ac && !qk_low) {
    // matmul is a lower-precision op: q and k (fp32 after RoPE) are cast first (saved),
    // then matmul's reshape copies the q copy (it keeps q's transposed layout); k^T
    // of a contiguous key copy is a view. Scores are low precision.
    const uint64_t low = ac_->low_elem();
    Tensor qa = ac_->cast(query, query.bytes / 4 * low);
    // DeepSeek-V3's key is bf16 already (expand_kv's new_empty takes kv_b_proj's dtype):
    // not cast.
    const bool key_low = mla && key.bytes == low_qk / S * T;
    Tensor ka = key_low ? key : ac_->cast(key, key.bytes / 4 * low);
    // The cast of an expanded (single-KV-head) key is a dense copy too: k^T is a view.
    // MLA's q and k are contiguous (B,H,S,qk) (a cat and new_empty; _to_copy keeps the
    // strides): matmul's reshapes are views.
    Tensor qc = mla ? qa : clone(rt_, qa);
    Tensor kc = n_rep > 1 || mla ? ka : clone(rt_, ka);
    w = bmm(rt_, qc, kc, B * H * S * T * low, bmm_flops);
    qc.reset();
    kc.reset();
    qa.reset();  // not saved (bmm saved the reshaped copy): dies with the matmul
    ka.reset();
  } else {
    // Without autocast, or with q/k already low under it (matmul casts nothing).
    const uint64_t se = qk_low ? ac_->low_elem() : e;
    Tensor qc = qk_contiguous || one_query() ? query : clone(rt_, query);
    Tensor kc = repeat_copies || qk_contiguous || kv_view ? key : clone(rt_, key);
    numeric_hint(rt_, NumericHint::transpose_b);  // q @ k^T (k kept (B,H,S,hd))
    w = bmm(rt_, qc, kc, B * H * S * T * se, bmm_flops);
    qc.reset();
    kc.reset();
  }
  w = a.attn_scale_mul ? mul_scalar(rt_, w) : div_scalar(rt_, w);
  if (a.attn_softcap > 0.0) w = softcap(std::move(w));  // Gemma-2: before the mask
  // Phi-3's `attn_weights += causal_mask` is in place: the scores keep their dtype (bf16
  // under autocast; in-place ops do not promote), so softmax gets a low input.
  bool scores_low = ac && a.mask_add_inplace && mask.defined();
  if (scores_low) {
    w = add_(rt_, w, mask);
  } else if (mask.defined() && ac) {  // low-precision scores + the fp32 mask: fp32
    Tensor low_w = w;
    w = add(rt_, ac_->widen(low_w), mask);
    Autocast::promoted(rt_, w, 0, low_w);
  } else if (mask.defined()) {
    numeric_hint(rt_, NumericHint::mask_slice);  // attention_mask[:, :, :, :S]
    w = a.mask_add_inplace ? add_(rt_, w, mask) : add(rt_, w, mask);
  }
  if (scores_low) {
    // F.softmax(bf16 scores, dtype=float32): ATen converts the input first (a temporary of
    // the call), _softmax in fp32 (saved); `.to(value_states.dtype)` casts back to bf16.
    Tensor p32;
    {
      Tensor w32 = to_copy(rt_, w, w.bytes / ac_->low_elem() * 4);
      p32 = softmax(rt_, w32);
    }
    Tensor pr = to_copy(rt_, p32, p32.bytes / 4 * ac_->low_elem());
    p32.reset();
    w = std::move(pr);
  } else if (e == 4) {
    w = softmax(rt_, w);
    if (qk_low) {  // `.to(query.dtype)`: low q, so the fp32 probabilities are cast back
      Tensor pl = to_copy(rt_, w, w.bytes / 4 * ac_->low_elem());
      w = std::move(pl);
    }
  } else {
    // `attn_weights = F.softmax(attn_weights, dtype=float32).to(dtype)`: softmax converts
    // its input first (the copy dies with the call), .to casts back; the bf16 scores are
    // rebound only once the whole expression has returned (H100 trace).
    Tensor p32;
    {
      Tensor w32 = to_copy(rt_, w, w.bytes / e * 4);
      p32 = softmax(rt_, w32);
    }
    Tensor pr = to_copy(rt_, p32, p32.bytes / 4 * e);
    p32.reset();
    w = std::move(pr);
  }
  if (s_.dropout > 0.0) w = native_dropout(rt_, w, e);
  Tensor o;
  if (ac && !qk_low && !scores_low) {  // the fp32 probabilities are cast (saved) before matmul copies v
    Tensor wa = ac_->cast(w, w.bytes / 4 * ac_->low_elem());
    Tensor vc = repeat_copies ? value : clone(rt_, value);
    o = bmm(rt_, wa, vc, B * S * qD * ac_->low_elem(), bmm_flops);
  } else {
    Tensor vc = repeat_copies || kv_view ? value : clone(rt_, value);
    o = bmm(rt_, w, vc, B * S * qD * (qk_low || scores_low ? ac_->low_elem() : e), bmm_flops);
    vc.reset();
  }
  // v4.50+: the probabilities are returned as attn_weights (a re-run in backward writes
  // nothing: its outputs are dropped).
  if (layer_weights_ != nullptr && !rt_.recomputing) *layer_weights_ = w;
  w.reset();
  return view(rt_, o, /*copy_in_backward=*/true);  // `o` dies on return
}

// GPT2Attention._attn: returns attn_output, and its attn_weights (the dropout output)
// through `weights`.
Tensor DecoderModel::where_core(const LayerParams& p, const Tensor& q, const Tensor& k,
                                const Tensor& v, Tensor& weights) {
  // Under autocast q/k/v are the bf16 addmm output: matmul casts nothing.
  const uint64_t e = act_elem(), B = s_.batch, H = s_.heads, S = s_.seq, hd = s_.head_dim();
  const uint64_t D = s_.d_model;
  const uint64_t scores = B * H * S * S * e;
  const double bmm_flops = 2.0 * B * H * S * S * hd;
  // matmul of (B,H,S,hd) views of the (B,S,3D) projection: reshape copies.
  numeric_hint(rt_, NumericHint::qkv_piece, 0);
  Tensor qc = clone(rt_, q);
  numeric_hint(rt_, NumericHint::qkv_piece, 1);
  Tensor kc = clone(rt_, k);
  numeric_hint(rt_, NumericHint::transpose_b);  // q @ k^T (k kept (B,H,S,hd))
  Tensor w0 = bmm(rt_, qc, kc, scores, bmm_flops);
  qc.reset();
  kc.reset();
  numeric_hint(rt_, NumericHint::fill_scalar, std::sqrt(static_cast<double>(hd)));
  Tensor scale = new_tensor(rt_, e, OpKind::scalar_tensor, TensorKind::temporary);  // torch.full
  Tensor w1 = div(rt_, w0, scale);  // saves the 0-d divisor
  scale.reset();
  w0.reset();
  Tensor mask_value = rt_.alloc(e, TensorKind::temporary, OpKind::scalar_tensor);
  // causal_mask = self.bias[:, :, k - q : k, :k]: an (S, S) bool view of the buffer, which
  // torch.where saves (its own size is what save_on_cpu copies, graph/offload.h).
  Tensor causal_mask = rt_.view_of(p.causal_bias, S * S);
  Tensor w2 = where_tensor(rt_, causal_mask, w1, e);
  causal_mask.reset();
  w1.reset();
  Tensor w3;
  if (autocast_on()) {
    // softmax gets dtype=float32 under autocast; `.type(value.dtype)` casts back.
    w3 = ac_->fp32_softmax(w2);
    w2.reset();
    Tensor wl = to_copy(rt_, w3, w3.bytes / 4 * e);
    w3.reset();
    w3 = std::move(wl);
  } else {
    w3 = softmax(rt_, w2);
    w2.reset();
  }
  weights = drop(w3);
  w3.reset();
  numeric_hint(rt_, NumericHint::qkv_piece, 2);
  Tensor vc = clone(rt_, v);
  Tensor o = bmm(rt_, weights, vc, B * S * D * e, bmm_flops);
  vc.reset();
  mask_value.reset();  // a local of _attn
  return view(rt_, o, /*copy_in_backward=*/true);
}

Tensor DecoderModel::attention_gpt2(const LayerParams& p, const Tensor& x) {
  ModuleScope module_scope(rt_, Module::attention);
  Tensor out;
  {
    Tensor qkv = project(x, p, p.qkv);
    SplitQkv split(rt_, qkv);
    numeric_hint(rt_, NumericHint::qkv_piece, 0);
    Tensor q = split.head_view(rt_, 0);
    numeric_hint(rt_, NumericHint::qkv_piece, 1);
    Tensor k = split.head_view(rt_, 1);
    numeric_hint(rt_, NumericHint::qkv_piece, 2);
    Tensor v = split.head_view(rt_, 2);
    // `attn_output, attn_weights = self._attn(q, k, v)`: both names stay bound until
    // GPT2Attention.forward returns. _attn is the candidate region of `selective`
    // (graph/checkpoint.h). Its second output leaves through `keep`. A region that runs
    // plainly calls the lambda at once, while this frame is alive; a checkpointed one
    // also stores it for its re-run in backward, whose outputs torch drops (and this
    // frame is gone by then): `stored` tells the two apart.
    Tensor attn_weights;
    Tensor* keep = &attn_weights;
    const int32_t layer = rt_.ctx.layer;
    const bool stored =
        rt_.checkpoint != nullptr && rt_.checkpoint->wants(RegionKind::core_attention, layer);
    Tensor attn_output = run_region(
        rt_, RegionKind::core_attention, {q, k, v},
        [this, layer, keep, stored](const Inputs& in) {
          Tensor weights;
          Tensor o = where_core(layers_[layer], in[0], in[1], in[2], weights);
          if (!stored || !rt_.recomputing) *keep = std::move(weights);
          return o;
        });
    // _merge_heads: permute(0, 2, 1, 3).contiguous() copies; view.
    numeric_hint(rt_, NumericHint::merge_heads);
    Tensor merged = clone(rt_, attn_output);
    attn_output.reset();
    out = project(merged, p, p.o);
    merged.reset();
    out = drop(out);
  }  // q, k, v, the projection and attn_weights die with GPT2Attention.forward
  return out;
}

}  // namespace memsim::graph
