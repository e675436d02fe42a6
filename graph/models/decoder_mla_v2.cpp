// DecoderModel's DeepSeek-V2 multi-head latent attention and its RoPE table
// (graph/models/decoder.h; docs/deepseek.md "DeepSeek-V2"): DeepseekV2Attention and
// DeepseekV2RotaryEmbedding as transformers 5.17.0 writes them
// (transformers/models/deepseek_v2/modeling_deepseek_v2.py, read under /work/src517), eager
// attention, no cache. The projections are DeepseekV3Attention's (construct_mla in
// decoder_mla.cpp: q_proj for DeepSeek-V2-Lite's null q_lora_rank, else q_a_proj /
// q_a_layernorm / q_b_proj; kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj). What
// differs from the V3 forward memsim models (f5a9ec51's, decoder_mla.cpp):
//  - the model's rotary module returns one complex64 table, freqs_cis (1, S, rope/2):
//    position_ids[:, None, :].float(), inv_freq @ positions (a matmul), torch.polar(
//    ones_like(freqs), freqs), `freqs_cis * attention_scaling` (a new table: the polar result
//    dies at the rebinding), under no_grad; S*rope*4 bytes whatever the model dtype (no
//    .to(dtype)); it is passed to every layer and saved by each rotation's MulBackward0;
//  - kv_a_layernorm's output is viewed (B, 1, S, kv_lora_rank) and kv_b_proj runs on it (the
//    same sizes as V3's);
//  - apply_rotary_emb (graph/ops/ops_mla.h rope_complex_pair_hf): view_as_complex products
//    with freqs_cis, no de-interleaving copy; q's grad reaches its rotation strided (a narrow
//    of the query grad from CatBackward0), so fp32 backward copies it contiguous first;
//  - query_states = cat((q_nope, q_pe)) as V3; the key is expand_kv's `new_empty` (B, H, S,
//    qk) plus two slice copy_s (k_nope, then the expanded k_pe): the same forward bytes as a
//    cat, but two CopySlices nodes in backward (graph/ops/ops_mla.h copy_into_slice).
// The frame's locals die at return in their order (q, q_nope, q_pe, compressed_kv, kv_nope,
// k_pe, k_nope, query_states, key_states, value_states, attn_output); expand_kv's at its own
// return (its kv_b_proj output stays alive as value_states' base).
#include <stdexcept>

#include "graph/checkpoint.h"
#include "graph/models/decoder.h"
#include "graph/ops/ops_mla.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

Tensor DecoderModel::rope_table_complex() {
  const uint64_t S = s_.seq * static_cast<uint64_t>(s_.pos_batch), rd = s_.rotary_dim();
  const bool was = rt_.grad_enabled;
  rt_.grad_enabled = false;
  // inv_freq[None, :, None].float().expand(...): the fp32 buffer itself (a view).
  Tensor pos = new_tensor(rt_, S * 4, OpKind::to_copy, TensorKind::temporary);  // position_ids.float()
  Tensor freqs = new_tensor(rt_, rd / 2 * S * 4, OpKind::bmm, TensorKind::temporary);
  rt_.note_gemm();  // inv_freq @ positions: the step's first cuBLAS call (as rope_tables)
  Tensor table;
  {
    Tensor polar;
    {
      Tensor ones = new_tensor(rt_, rd / 2 * S * 4, OpKind::fill, TensorKind::temporary);  // ones_like
      polar = new_tensor(rt_, S * rd * 4, OpKind::other);  // torch.polar: complex64 (S, rd/2)
    }
    table = new_tensor(rt_, S * rd * 4, OpKind::mul_scalar);  // freqs_cis * attention_scaling
  }
  // The frame's locals die in declaration order: position_ids_expanded, freqs.
  pos.reset();
  freqs.reset();
  rt_.grad_enabled = was;
  return table;
}

Tensor DecoderModel::attention_mla_v2(const LayerParams& p, const Tensor& x, const Tensor& mask,
                                      const Tensor& freqs) {
  ModuleScope module_scope(rt_, Module::attention);
  const MlaSpec& m = arch().mla;
  if (autocast_on()) throw std::runtime_error("multi-head latent attention under autocast is not modelled");
  const uint64_t e = s_.elem, H = static_cast<uint64_t>(s_.heads), rows = s_.rows();
  const uint64_t nope = static_cast<uint64_t>(m.qk_nope_head_dim), rope = static_cast<uint64_t>(m.qk_rope_head_dim);
  const uint64_t rkv = static_cast<uint64_t>(m.kv_lora_rank);
  const uint64_t table_bytes = s_.seq * static_cast<uint64_t>(s_.pos_batch) * rope * 4;
  Tensor out;
  // The forward's locals, declared in the order Python first binds them.
  Tensor q, q_nope, q_pe, compressed_kv, kv_nope, k_pe, k_nope, query_states, key_states, value_states,
      attn_output;
  if (m.q_lora_rank > 0) {
    Tensor qn;
    {
      Tensor qa = project(x, p, p.q_a);
      qn = norm(qa, p.q_a_norm, rows, static_cast<uint64_t>(m.q_lora_rank));
    }
    q = project(qn, p, p.q_b);
  } else {
    q = project(x, p, p.q);
  }
  q = view(rt_, q, H > 1);  // .view(query_shape).transpose(1, 2)
  {
    Chunk2 split(rt_, q, rows * H * nope * e);  // torch.split(q, [nope, rope], -1)
    q_nope = split.piece(rt_, 0);
    q_pe = split.piece(rt_, 1);
  }
  compressed_kv = project(x, p, p.kv_a);
  {
    Chunk2 split(rt_, compressed_kv, rows * rkv * e);  // torch.split(ckv, [kv_lora_rank, rope], -1)
    kv_nope = split.piece(rt_, 0);
    k_pe = split.piece(rt_, 1);
  }
  // self.kv_a_layernorm(kv_nope).view(B, 1, S, kv_lora_rank); k_pe.view(B, 1, S, rope) (a
  // view whose grad comes back contiguous: no node).
  k_nope = view(rt_, norm(kv_nope, p.kv_a_norm, rows, rkv), false);
  {
    // q_pe, k_pe = apply_rotary_emb(q_pe, k_pe, position_embeddings)
    Tensor q_rot, k_rot;
    rope_complex_pair_hf(rt_, q_pe, k_pe, freqs, table_bytes, e, true, q_rot, k_rot);
    q_pe = std::move(q_rot);
    k_pe = std::move(k_rot);
  }
  query_states = cat2(rt_, q_nope, q_pe);  // torch.cat((q_nope, q_pe), dim=-1)
  {
    // self.expand_kv(k_nope, k_pe)
    Tensor kv = view(rt_, project(k_nope, p, p.kv_b), H > 1);  // kv_b_proj(...).view.transpose
    Tensor k_pass;
    {
      Chunk2 split(rt_, kv, rows * H * nope * e);  // torch.split(kv_nope, [nope, v], -1)
      k_pass = split.piece(rt_, 0);
      value_states = split.piece(rt_, 1);
    }
    Tensor k_rot = expand_view(rt_, k_pe, H);  // k_rot.expand(-1, H, -1, -1)
    // kv_nope.new_empty(B, H, S, qk) and its two slices' copy_ (no grad of its own).
    key_states = rt_.alloc(rows * H * (nope + rope) * e, TensorKind::activation, OpKind::other);
    copy_into_slice(rt_, key_states, k_pass, rows * H * nope * e);
    copy_into_slice(rt_, key_states, k_rot, rows * H * rope * e);
    // expand_kv returns: kv (value_states' base), k_pass, k_rot die.
  }
  attn_output = run_region(rt_, RegionKind::core_attention, {query_states, key_states, value_states, mask},
                           [this](const Inputs& in) { return attention_function(in[0], in[1], in[2], in[3]); });
  out = project(attn_output, p, p.o);  // .reshape(B, S, -1).contiguous() is a view
  q.reset();
  q_nope.reset();
  q_pe.reset();
  compressed_kv.reset();
  kv_nope.reset();
  k_pe.reset();
  k_nope.reset();
  query_states.reset();
  key_states.reset();
  value_states.reset();
  attn_output.reset();
  return out;
}

}  // namespace memsim::graph
