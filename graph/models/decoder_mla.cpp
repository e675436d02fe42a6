// DecoderModel's multi-head latent attention (graph/models/decoder.h; docs/deepseek.md):
// DeepseekV3Attention and DeepseekV2Attention as transformers 5.17.0 writes them
// (transformers/models/deepseek_v3/modeling_deepseek_v3.py and deepseek_v2/modeling_deepseek_v2.py
// of the 5.17.0 wheel installed on the GPU machine; the V3 forward is also what the models
// derived from it in huggingface/transformers 775a4dfe inherit, e.g. models/axk1/modular_axk1.py),
// eager attention, no cache. With D the hidden size, H heads, nope/rope/v the qk_nope/qk_rope/v
// head dims, qk = nope + rope:
//  - registration: q_a_proj (D -> q_lora_rank), q_a_layernorm, q_b_proj (-> H*qk) or q_proj
//    (q_lora_rank null), kv_a_proj_with_mqa (D -> kv_lora_rank + rope), kv_a_layernorm,
//    kv_b_proj (kv_lora_rank -> H*(nope + v)), o_proj (H*v -> D); attention_bias on
//    q_a_proj, kv_a_proj_with_mqa and o_proj;
//  - forward: q = q_b(norm(q_a(x))) (or q_proj(x)), .view(B,S,H,qk).transpose(1,2) (its
//    grad is copied back in backward), split [nope, rope] (views; SplitWithSizesBackward0
//    cats the grads); compressed_kv = kv_a(x), split [kv_lora_rank, rope];
//    kv_a_layernorm(latent).view(B,1,S,kv_lora_rank); the rope key viewed (B,1,S,rope) (one
//    shared rope key; its grad comes back contiguous: no node);
//  - RoPE on the rope slices only:
//      V3 with rope_interleave (DeepSeek's default): apply_rotary_pos_emb_interleave, the
//        even/odd form (graph/ops/ops_mla.h rope_interleave_pair_hf);
//      V3 without: apply_rotary_pos_emb (x*cos + rotate_half(x)*sin, rope_hf);
//      V2: apply_rotary_emb on the model's complex table (rope_complex_pair_hf; q's grad
//        reaches it strided, so fp32 backward copies it contiguous first);
//  - query_states = cat((q_pass, q_rot)); then expand_kv: kv_b_proj on the (B,1,S,r) latent
//    viewed (B,H,S,nope+v) and split into k_nope and value_states (views), the rope key
//    expanded to H heads (a view), key_states = new_empty(B,H,S,qk) with the two slices
//    copy_'d (k_nope, then the rope key): the forward bytes of a cat, but two CopySlices in
//    backward (copy_into_slice). Earlier transformers (f5a9ec51) ran kv_b_proj before the
//    RoPE, de-interleaved with a view/transpose/reshape copy and built the key with
//    torch.cat; memsim models 5.17.0 only (the version of the GPU runs);
//  - eager_attention_forward (scores * scaling; the value slice is copied by matmul's
//    reshape; the (B,H,S,v) output transposed contiguous), o_proj.
//  - qk_head_dim != v_head_dim: scores and q/k are qk wide, the output and o_proj's input
//    H*v; the softmax scale (qk^-0.5, times mscale^2 with yarn's mscale_all_dim) is a
//    Python float: no memory.
//  - under autocast (docs/deepseek.md "Under autocast"): bf16 projections, the latent norms'
//    fp32 outputs (qk_norm), V3's RoPE products fp32 (bf16 slices x fp32 tables), so V3's
//    query cat is fp32 (cat is on no CUDA autocast list: ATen's promotion) and its fp32 rope
//    key is converted by the copy_ into the bf16 new_empty key; V2's rotated q/k are bf16
//    (.type_as);
//  - the frame's locals die at return in their order: q_states (q_b's output), q_pass,
//    q_rot (the rotated q), compressed_kv (kept by kv_a_layernorm in fp32), the latent's
//    split view, the rotated k, the latent's norm output (kept by kv_b's mm), query_states /
//    key_states (kept by the matmul), value_states (kv_b's output), attn_output; expand_kv's
//    at its own return.
// Not modelled (refused by the scenario reader): SDPA kernels and flash attention (torch's
// flash kernel needs equal q/k/v head dims; HF pads v for FA2), generation.
// PEFT LoRA on the projections (lora.targets q_proj / q_a_proj / q_b_proj /
// kv_a_proj_with_mqa / kv_b_proj / o_proj) is the shared path of DecoderModel::project: each
// projection carries its LayerParams::ad slot (graph/models/lora.h MlaLinear).
#include <stdexcept>

#include "graph/autocast.h"
#include "graph/checkpoint.h"
#include "graph/models/decoder.h"
#include "graph/ops/ops_mla.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

void DecoderModel::construct_mla(LayerParams& p, const std::string& pre) {
  const DecoderArch& a = arch();
  const MlaSpec& m = a.mla;
  const uint64_t D = static_cast<uint64_t>(s_.d_model), H = static_cast<uint64_t>(s_.heads);
  const uint64_t qk = static_cast<uint64_t>(m.qk_head_dim());
  const uint64_t nope = static_cast<uint64_t>(m.qk_nope_head_dim), v = static_cast<uint64_t>(m.v_head_dim);
  const uint64_t rope = static_cast<uint64_t>(m.qk_rope_head_dim), rkv = static_cast<uint64_t>(m.kv_lora_rank);
  if (m.q_lora_rank > 0) {
    const uint64_t rq = static_cast<uint64_t>(m.q_lora_rank);
    p.q_a = add_proj(rq, D, pre, "self_attn.q_a_proj", a.qkv_bias, kQAProj);
    rt_.ctx.module = Module::norm;
    p.q_a_norm = add_norm(rq, pre, "self_attn.q_a_layernorm");
    rt_.ctx.module = Module::attention;
    p.q_b = add_proj(H * qk, rq, pre, "self_attn.q_b_proj", false, kQBProj);
  } else {
    p.q = add_proj(H * qk, D, pre, "self_attn.q_proj", false, kQProj);
  }
  p.kv_a = add_proj(rkv + rope, D, pre, "self_attn.kv_a_proj_with_mqa", a.qkv_bias, kKvAProj);
  rt_.ctx.module = Module::norm;
  p.kv_a_norm = add_norm(rkv, pre, "self_attn.kv_a_layernorm");
  rt_.ctx.module = Module::attention;
  p.kv_b = add_proj(H * (nope + v), rkv, pre, "self_attn.kv_b_proj", false, kKvBProj);
  p.o = add_proj(D, H * v, pre, "self_attn.o_proj", a.o_bias, kOProj);
}

Tensor DecoderModel::attention_mla(const LayerParams& p, const Tensor& x, const Tensor& mask,
                                   const Tensor& cos, const Tensor& sin) {
  ModuleScope module_scope(rt_, Module::attention);
  const MlaSpec& m = arch().mla;
  // e: what the projections produce (the low dtype under autocast, graph/autocast.h).
  const bool ac = autocast_on();
  const uint64_t e = act_elem(), H = static_cast<uint64_t>(s_.heads), rows = s_.rows();
  const uint64_t nope = static_cast<uint64_t>(m.qk_nope_head_dim), rope = static_cast<uint64_t>(m.qk_rope_head_dim);
  const uint64_t rkv = static_cast<uint64_t>(m.kv_lora_rank);
  Tensor out;
  // The forward's locals, declared in the order Python first binds them (V2 names them q,
  // q_nope, q_pe, compressed_kv, kv_nope, k_pe, k_nope: the same order). kv_nope is the
  // latent's split view, k_pass its norm's (B,1,S,r) view: under grad kv_b_proj saves the
  // latter, so their order at return only matters without grad.
  Tensor q_states, q_pass, q_rot, compressed_kv, kv_nope, k_rot, k_pass, query_states, key_states,
      value_states, attn_output;
  if (m.q_lora_rank > 0) {
    // self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states))): each inner result is
    // a temporary of the call that consumes it.
    Tensor qn;
    {
      Tensor qa = project(x, p, p.q_a);
      // Under autocast the norm gets the low q_a output and returns fp32 (qk_norm).
      qn = qk_norm(qa, p.q_a_norm, rows, static_cast<uint64_t>(m.q_lora_rank));
    }
    q_states = project(qn, p, p.q_b);
  } else {
    q_states = project(x, p, p.q);
  }
  q_states = view(rt_, q_states, H > 1);  // .view(query_shape).transpose(1, 2)
  {
    Chunk2 split(rt_, q_states, rows * H * nope * e);  // torch.split(q, [nope, rope], -1)
    q_pass = split.piece(rt_, 0);
    q_rot = split.piece(rt_, 1);
  }
  compressed_kv = project(x, p, p.kv_a);
  {
    Chunk2 split(rt_, compressed_kv, rows * rkv * e);  // torch.split(ckv, [kv_lora_rank, rope], -1)
    kv_nope = split.piece(rt_, 0);
    k_rot = split.piece(rt_, 1);
  }
  // k_pass = self.kv_a_layernorm(kv_nope).view(B, 1, S, kv_lora_rank); k_rot.view(B, 1, S, rope).
  k_pass = view(rt_, qk_norm(kv_nope, p.kv_a_norm, rows, rkv), false);
  {
    Tensor q_embed, k_embed;
    if (m.v2_code) {  // apply_rotary_emb(q_pe, k_pe, freqs_cis): `cos` is the complex table
      const uint64_t table_bytes = s_.seq * static_cast<uint64_t>(s_.pos_batch) * rope * 4;
      rope_complex_pair_hf(rt_, q_rot, k_rot, cos, table_bytes, e, true, q_embed, k_embed);
    } else if (m.rope_interleave) {
      // Under autocast the bf16 slices times the fp32 tables give fp32 products.
      rope_interleave_pair_hf(rt_, q_rot, k_rot, cos, sin, q_embed, k_embed, ac ? 4 / e : 1);
    } else if (ac) {
      q_embed = rope_hf_autocast(rt_, q_rot, cos, sin);
      k_embed = rope_hf_autocast(rt_, k_rot, cos, sin);
    } else {
      q_embed = rope_hf(rt_, q_rot, cos, sin);
      k_embed = rope_hf(rt_, k_rot, cos, sin);
    }
    q_rot = std::move(q_embed);
    k_rot = std::move(k_embed);
  }
  // torch.cat((q_pass, q_rot), dim=-1). Under autocast V3's q_rot is fp32 and q_pass bf16:
  // cat is on no CUDA autocast list, so ATen's type promotion writes one fp32 output (no cast
  // copy of q_pass; CPU autocast's cat is `promote`, which would copy it: the fixture
  // stand-in leaves autocast for the cat), and in backward validate_outputs casts q_pass's
  // fp32 grad slice back to bf16.
  if (q_rot.bytes > q_pass.bytes / nope * rope) {
    query_states = cat2(rt_, ac_->widen(q_pass), q_rot);
    Autocast::promoted(rt_, query_states, 0, q_pass);
  } else {
    query_states = cat2(rt_, q_pass, q_rot);
  }
  {
    // key_states, value_states = self.expand_kv(k_pass, k_rot)
    Tensor kv = view(rt_, project(k_pass, p, p.kv_b), H > 1);  // kv_b_proj(...).view.transpose
    Tensor k_nope;
    {
      Chunk2 split(rt_, kv, rows * H * nope * e);  // torch.split(kv, [nope, v], -1)
      k_nope = split.piece(rt_, 0);
      value_states = split.piece(rt_, 1);
    }
    Tensor k_exp = expand_view(rt_, k_rot, H);  // k_rot.expand(-1, H, -1, -1)
    // kv.new_empty(B, H, S, qk) and its two slices' copy_ (no grad of its own). new_empty
    // takes kv's dtype (bf16 under autocast), so V3's fp32 rope key is converted by its copy_
    // (CopyBackwards hands k_rot an fp32 grad: grad.to(src dtype)).
    key_states = rt_.alloc(rows * H * (nope + rope) * e, TensorKind::activation, OpKind::other);
    copy_into_slice(rt_, key_states, k_nope, rows * H * nope * e);
    copy_into_slice(rt_, key_states, k_exp, rows * H * rope * e);
    // expand_kv returns: kv (value_states' base), k_nope, the expanded view die.
  }
  // attention_interface(self, q, k, v, mask, scaling=...): eager_attention_forward (the
  // `selective` region), returning the transposed-contiguous (B,S,H,v) output.
  attn_output = run_region(rt_, RegionKind::core_attention, {query_states, key_states, value_states, mask},
                           [this](const Inputs& in) { return attention_function(in[0], in[1], in[2], in[3]); });
  out = project(attn_output, p, p.o);  // .reshape(B, S, -1).contiguous() is a view
  // return: the frame's locals die in order.
  q_states.reset();
  q_pass.reset();
  q_rot.reset();
  compressed_kv.reset();
  kv_nope.reset();
  k_rot.reset();
  k_pass.reset();
  query_states.reset();
  key_states.reset();
  value_states.reset();
  attn_output.reset();
  return out;
}

}  // namespace memsim::graph
