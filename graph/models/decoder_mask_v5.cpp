// transformers 5.x's mask preamble (graph/models/decoder_mask_v5.h).
//
// Modelled from transformers 5.17.0 (read under /work/src517/transformers-5.17.0:
// masking_utils.py find_packed_sequence_indices :729-758, _preprocess_mask_arguments :761-862,
// create_causal_mask :865-995, create_sliding_window_causal_mask :1101-1236, sdpa_mask
// :373-536, eager_mask :539-605, and_masks :49-60, sliding_window_overlay :93-102; the
// XModel.forward of models/{llama,qwen2,qwen3,mistral,phi3,gemma2,mixtral,qwen3_moe,olmoe})
// and checked allocation for allocation against the H200 traces of tests/data/h100/arch
// (tf_arch_*.pickle, PyTorch 2.11, frames in masking_utils.py). Per forward, B x S tokens,
// model dtype e (inputs_embeds.dtype: fp32 under autocast with fp32 weights):
//   position_ids = arange(S) + past_seen_tokens            S*8 (dies), S*8 (kept)
//   find_packed_sequence_indices(position_ids.expand(B,S)) B*8, B*(S+1)*8 cat, B*S*8 diff,
//       B*S bool (!= 1), B*S*8 cumsum (+ a B*S*8 temporary), B bool (== 0), 1 B (.all());
//       returns None (one sequence per row): its three locals die.
//   SDPA / flash: sdpa_mask's _ignore_causal_mask_sdpa holds (no padding, kv == q): None.
//   eager: eager_mask -> sdpa_mask(allow_is_causal_skip=False): aranges B*8, 8, S*8 (+S*8
//       temporary) twice; the mask function over (1,1,S,1) x (1,1,1,S) indices -> an (S, S)
//       bool (the sliding one: and_masks(overlay, causal): a 1-byte ones, q - window S*8,
//       and an (S,S) bool per term plus an (S,S) `&` per term); expand(B, ...) is a view;
//       then torch.where(mask, tensor(0.0, dtype), finfo(dtype).min): two e-byte scalars and
//       the (B, 1, S, S) mask in dtype, which lives until the model returns.
// Gemma-2 builds both masks (full, then sliding) into a dict at model level; its layers take
// their type's mask and build nothing (decoder.cpp layer()).
// Not modelled (refused or never reached): a 2-D padding mask, packed sequences (position
// ids that restart), a cache in the training forward, flex / flash masks.
#include "graph/models/decoder_mask_v5.h"

#include <cstring>

namespace memsim::graph {

Tensor v5_position_ids(Runtime& rt, const HfShape& s) {
  const uint64_t S = static_cast<uint64_t>(s.seq);
  Tensor ar = new_tensor(rt, S * 8, OpKind::arange, TensorKind::temporary);
  Tensor pos = new_tensor(rt, S * 8, OpKind::add_scalar);
  ar.reset();  // the arange dies at once
  return pos;
}

namespace {

// _preprocess_mask_arguments -> find_packed_sequence_indices over the expanded (B, S) ids.
void packed_sequence_check(Runtime& rt, const HfShape& s) {
  const uint64_t B = static_cast<uint64_t>(s.batch), S = static_cast<uint64_t>(s.seq);
  // first_dummy_value = position_ids[:, :1] - 1
  Tensor first = new_tensor(rt, B * 8, OpKind::add_scalar, TensorKind::temporary);
  // position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1): the cat dies
  Tensor diff;
  {
    Tensor cat = new_tensor(rt, B * (S + 1) * 8, OpKind::cat2, TensorKind::temporary);
    diff = new_tensor(rt, B * S * 8, OpKind::sub, TensorKind::temporary);
  }
  // packed_sequence_mask = (position_diff != 1).cumsum(-1): the int64 result, then a
  // temporary of the same size inside CUDA's cumsum of a bool (dies; the H200 traces), then
  // the comparison dies. torch 1.13's CPU kernel has no temporary: a CPU run (no kernel
  // scratch, device.kernel_scratch false) has none.
  Tensor packed;
  {
    Tensor ne = new_tensor(rt, B * S, OpKind::compare, TensorKind::temporary);
    packed = new_tensor(rt, B * S * 8, OpKind::cumsum, TensorKind::temporary);
    if (rt.kernel_scratch) Tensor scratch = new_tensor(rt, B * S * 8, OpKind::cumsum, TensorKind::temporary);
  }
  // (packed_sequence_mask[:, -1] == 0).all(): both die after the host reads the flag.
  {
    Tensor last0 = new_tensor(rt, B, OpKind::compare, TensorKind::temporary);
    Tensor all = new_tensor(rt, 1, OpKind::reduce_any, TensorKind::temporary);
    last0.reset();
    all.reset();
  }
  // `return None`: the locals die in order.
  first.reset();
  diff.reset();
  packed.reset();
}

// create_causal_mask (or create_sliding_window_causal_mask when `sliding`) with the eager
// interface: eager_mask -> sdpa_mask(allow_is_causal_skip=False), then torch.where.
Tensor eager_mask(Runtime& rt, const HfShape& s, bool sliding) {
  const uint64_t B = static_cast<uint64_t>(s.batch), S = static_cast<uint64_t>(s.seq), e = s.elem;
  packed_sequence_check(rt, s);
  Tensor bool_mask;
  {
    Tensor batch_ar = new_tensor(rt, B * 8, OpKind::arange, TensorKind::temporary);
    Tensor head_ar = new_tensor(rt, 8, OpKind::arange, TensorKind::temporary);
    Tensor q_ar, kv_ar;
    for (Tensor* t : {&q_ar, &kv_ar}) {  // torch.arange(n) + offset: the arange dies
      Tensor ar = new_tensor(rt, S * 8, OpKind::arange, TensorKind::temporary);
      *t = new_tensor(rt, S * 8, OpKind::add_scalar, TensorKind::temporary);
    }
    if (!sliding) {
      // causal_mask_function over (1,1,S,1) and (1,1,1,S) index views: kv_idx <= q_idx
      bool_mask = new_tensor(rt, S * S, OpKind::compare, TensorKind::temporary);
    } else {
      // and_masks(sliding_window_overlay(w), causal_mask_function): `result` starts as a 0-d
      // True and is rebound to `result & term` after each term.
      Tensor result = new_tensor(rt, 1, OpKind::fill, TensorKind::temporary);
      {
        Tensor term;
        {
          Tensor shifted = new_tensor(rt, S * 8, OpKind::add_scalar, TensorKind::temporary);
          term = new_tensor(rt, S * S, OpKind::compare, TensorKind::temporary);  // kv > q - w
        }
        Tensor next = new_tensor(rt, S * S, OpKind::bitwise, TensorKind::temporary);
        term.reset();
        result = std::move(next);
      }
      {
        Tensor term = new_tensor(rt, S * S, OpKind::compare, TensorKind::temporary);  // kv <= q
        Tensor next = new_tensor(rt, S * S, OpKind::bitwise, TensorKind::temporary);
        term.reset();
        result = std::move(next);
      }
      bool_mask = std::move(result);
    }
    // sdpa_mask returns (the mask is an expand(B, ...) view of the bool): its locals die.
    batch_ar.reset();
    head_ar.reset();
    q_ar.reset();
    kv_ar.reset();
  }
  // mask = torch.where(mask, torch.tensor(0.0, dtype), torch.finfo(dtype).min): two 0-d
  // device scalars of the dtype, the (B, 1, S, S) result; then the bool dies.
  Tensor zero = rt.alloc(e, TensorKind::temporary, OpKind::scalar_tensor);
  Tensor min_value = rt.alloc(e, TensorKind::temporary, OpKind::scalar_tensor);
  Tensor mask = new_tensor(rt, B * S * S * e, OpKind::where_scalar);
  min_value.reset();
  zero.reset();
  bool_mask.reset();
  return mask;
}

}  // namespace

// The model's create_*_mask calls: Mistral / Mixtral / Phi-3 / Qwen3-MoE with a window call
// create_sliding_window_causal_mask only; Gemma-2 (layers of both types) and Qwen2-MoE
// (Qwen2MoeModel.forward: both dict entries unconditionally, whether a layer slides or not)
// build the full mask, then the sliding one; the rest create_causal_mask only.
void v5_masks(Runtime& rt, const HfShape& s, Tensor& mask, Tensor& sliding) {
  const DecoderArch& a = s.arch;
  const bool windowed = a.sliding_window > 0;
  const bool both = std::strcmp(a.architecture, "qwen2_moe") == 0 ||
                    (windowed && a.sliding_at == SlidingAt::layer);
  auto one = [&](bool window) {
    if (s.attention == HfAttention::eager) return eager_mask(rt, s, window);
    packed_sequence_check(rt, s);  // sdpa_mask: _ignore_causal_mask_sdpa holds -> None
    return Tensor{};
  };
  mask = one(windowed && !both);
  if (both) sliding = one(true);
}

}  // namespace memsim::graph
