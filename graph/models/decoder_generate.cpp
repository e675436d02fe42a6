// DecoderModel's forward inside Hugging Face generate (graph/models/decoder.h; issue #17): the
// model half of one generation step -- embedding, the causal mask built from generate's 2-D
// attention mask, RoPE tables of the batch's position_ids, the decoder layers with the KV
// cache (graph/models/kv_cache.h), the final norm and the head on the last
// num_logits_to_keep positions. The loop around it (special tokens, cache_position,
// position_ids, argmax, stopping criteria) is sim/step/generate.cpp.
//
// Modelled from transformers v4.45 (a55adee890b0757461e1588d8847fd385ce5c214)
// src/transformers/models/llama/modeling_llama.py: LlamaModel.forward with use_cache and a
// Cache, _update_causal_mask, _prepare_4d_causal_attention_mask_with_cache_position,
// LlamaForCausalLM.forward (`self.lm_head(hidden_states[:, -num_logits_to_keep:, :]).float()`);
// the exclude mask is MistralModel's of the same version. Checked against the CPU stand-ins
// of tools/fixtures/gen_generate_fixtures.py (tests/test_generate.cpp).
#include <stdexcept>

#include "graph/checkpoint.h"
#include "graph/models/decoder.h"
#include "graph/models/kv_cache.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

void DecoderModel::set_generate_step(int64_t seq, int64_t keys) {
  s_.seq = seq;
  s_.keys = keys;
  s_.pos_batch = s_.batch;
}

// _prepare_4d_causal_attention_mask_with_cache_position with a 2-D attention_mask:
//   causal = full((S, target), min); triu(causal, 1) unless S == 1 (Llama) | the exclude
//   bool (arange > cache_position [| arange <= cache_position - window], Mistral);
//   causal *= ...; causal[None, None].expand(B, 1, -1, -1).clone();
//   padding = causal[..., :mask_len] + attention_mask[:, None, None, :]; padding == 0;
//   causal[..., :mask_len] = causal[..., :mask_len].masked_fill(padding, min).
// generate.cache_classes v5 builds one such mask per layer type at the cache's
// (kv_length, kv_offset): the offset is added to the arange in place, the padding part reads
// a view of the 2-D mask's columns of those keys -- the same allocations at target kv_length.
Tensor DecoderModel::generate_mask(uint64_t target, uint64_t mask_len, bool fold_window) {
  const DecoderArch& a = arch();
  const uint64_t e = s_.elem, S = s_.seq, B = s_.batch;
  // generate.cache_classes v5 on Gemma-2/3 (sliding layers that masked themselves in v4.45):
  // the sliding type's mask has the window folded in, built with Mistral's exclude code.
  const bool own_window = fold_window && cache_ != nullptr && cache_->layered() &&
                          a.sliding_window > 0 && a.sliding_at == SlidingAt::layer;
  Tensor causal = new_tensor(rt_, S * target * e, OpKind::full, TensorKind::temporary);
  if (a.mask == MaskBuild::exclude || own_window) {
    Tensor exclude;
    {
      Tensor ar = new_tensor(rt_, target * 8, OpKind::arange, TensorKind::temporary);
      exclude = new_tensor(rt_, S * target, OpKind::compare, TensorKind::temporary);
    }
    if ((fold_window && a.sliding_window > 0 && a.sliding_at == SlidingAt::mask) || own_window) {
      Tensor ar = new_tensor(rt_, target * 8, OpKind::arange, TensorKind::temporary);
      Tensor sub = new_tensor(rt_, S * 8, OpKind::other, TensorKind::temporary);
      Tensor le = new_tensor(rt_, S * target, OpKind::compare, TensorKind::temporary);
      ar.reset();
      sub.reset();
      le.reset();  // bitwise_or_ into exclude, then `del`
    }
    exclude.reset();  // causal_mask *= exclude (in place)
  } else {
    if (S != 1) causal = new_tensor(rt_, S * target * e, OpKind::triu, TensorKind::temporary);
    Tensor ar = new_tensor(rt_, target * 8, OpKind::arange, TensorKind::temporary);
    Tensor gt = new_tensor(rt_, S * target, OpKind::compare, TensorKind::temporary);
    ar.reset();  // causal_mask *= (arange > cache_position): in place
  }
  // .expand(B, 1, -1, -1).clone(): the (S, target) base dies with the rebinding.
  causal = new_tensor(rt_, B * S * target * e, OpKind::clone, TensorKind::temporary);
  {
    Tensor padding = new_tensor(rt_, B * S * mask_len * e, OpKind::add, TensorKind::temporary);
    padding = new_tensor(rt_, B * S * mask_len, OpKind::eq, TensorKind::temporary);
    // masked_fill (out of place), copied into the slice; the filled copy dies at once.
    new_tensor(rt_, B * S * mask_len * e, OpKind::masked_fill, TensorKind::temporary).reset();
  }
  return causal;
}

Tensor DecoderModel::forward_generate(const Tensor& ids, const GenerateInputs& in) {
  const DecoderArch& a = arch();
  if (cache_ == nullptr) throw std::logic_error("forward_generate: no KV cache set");
  const uint64_t e = s_.elem, D = s_.d_model, S = s_.seq, B = s_.batch;
  rt_.ctx.module = Module::embedding;
  Tensor hidden;
  {
    Tensor inputs_embeds = embedding_nn(rt_, rt_.param(embed_), ids, s_.rows() * D * e, D);
    if (a.embed_scale && a.embed_scale_at == EmbedScaleAt::embedding)
      inputs_embeds = mul_scalar(rt_, inputs_embeds);
    // _update_causal_mask. A StaticCache's get_seq_length() runs first:
    // key_cache[0][0, 0].any(dim=-1).sum(), alive until the mask is built.
    Tensor mask, full_mask, sliding_mask;  // the last two: generate.cache_classes v5
    Tensor past_seen;
    // (5.x's lazily allocated StaticLayer returns 0 before its first update: no tensors.)
    if (cache_->kind() == KvCacheKind::static_buffers && cache_->initialized(0)) {
      Tensor any = new_tensor(rt_, static_cast<uint64_t>(cache_->max_len()), OpKind::reduce_any,
                              TensorKind::temporary);
      past_seen = new_tensor(rt_, 8, OpKind::reduce_sum, TensorKind::temporary);
    }
    if (s_.attention == HfAttention::eager && cache_->layered()) {
      // generate.cache_classes v5: one mask per layer type present (full, then sliding:
      // 5.x's causal_mask_mapping), each at the cache's mask sizes for those layers.
      for (bool sliding : {false, true}) {
        if (!cache_->has_layer_type(sliding)) continue;
        const auto kv = static_cast<uint64_t>(cache_->mask_sizes(sliding, s_.seq).first);
        (sliding ? sliding_mask : full_mask) = generate_mask(kv, kv, sliding);
      }
    } else if (s_.attention == HfAttention::eager) {
      // The static cache's 4-D mask was built by prepare_inputs_for_generation and is used
      // as is; a dynamic cache's target length is attention_mask.shape[-1].
      mask = in.mask4d != nullptr ? *in.mask4d
                                  : generate_mask(static_cast<uint64_t>(in.mask_len),
                                                  static_cast<uint64_t>(in.mask_len));
    } else {
      // SDPA with a DynamicCache: AttentionMaskConverter._ignore_causal_mask_sdpa's
      // torch.all(attention_mask == 1) (a (B, T) bool and a 0-d bool), then no mask
      // (one query, or as many keys as queries: is_causal).
      Tensor eq = new_tensor(rt_, B * static_cast<uint64_t>(in.mask_len), OpKind::eq,
                             TensorKind::temporary);
      new_tensor(rt_, 1, OpKind::reduce_any, TensorKind::temporary).reset();
    }
    past_seen.reset();
    Tensor h0 = inputs_embeds;
    if (a.embed_scale && a.embed_scale_at == EmbedScaleAt::model) h0 = mul_scalar(rt_, inputs_embeds);
    Tensor cos, sin, cos_local, sin_local;
    if (a.rope == RopeAt::model) {
      rope_tables(true, cos, sin);
      if (a.rope_local) rope_tables(true, cos_local, sin_local);
    }
    Inputs extra = {mask, *in.cache_position, cos, sin};
    if (a.rope_local) {
      extra.push_back(cos_local);
      extra.push_back(sin_local);
    }
    Tensor h = std::move(h0);
    for (int32_t l = 0; l < s_.layers; ++l) {
      if (cache_->layered() && s_.attention == HfAttention::eager)
        extra[0] = cache_->layer_sliding(static_cast<size_t>(l)) ? sliding_mask : full_mask;
      h = layer(l, h, extra);
    }
    extra.clear();
    rt_.ctx.module = Module::norm;
    hidden = norm(h, final_norm_, s_.rows(), D);
    inputs_embeds.reset();
    mask.reset();
    full_mask.reset();
    sliding_mask.reset();
    h.reset();
    cos.reset();
    sin.reset();
    cos_local.reset();
    sin_local.reset();
  }
  // LlamaForCausalLM.forward: lm_head(hidden_states[:, -num_logits_to_keep:, :]) -- a view
  // of the last rows, which matmul folds without a copy -- then .float() where the row
  // upcasts in forward (v4.45).
  rt_.ctx.module = Module::head;
  const uint64_t keep = in.logits_to_keep <= 0 || static_cast<uint64_t>(in.logits_to_keep) > S
                            ? S
                            : static_cast<uint64_t>(in.logits_to_keep);
  Tensor head_w = s_.tied ? rt_.param(embed_) : Tensor{};
  Tensor logits = logits_head(hidden, head_w, B * keep);
  hidden.reset();
  head_w.reset();
  rt_.ctx.module = Module::none;
  return logits;
}

}  // namespace memsim::graph
