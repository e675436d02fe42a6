// DecoderModel's multi-head latent attention (graph/models/decoder.h; docs/deepseek.md):
// DeepseekV3Attention as transformers writes it (models/deepseek_v3/modeling_deepseek_v3.py;
// read at huggingface/transformers f5a9ec51 and the 5.x copies of the same forward, which
// did not change between 4.5x and 5.x), eager attention, use_cache False. With D the hidden
// size, H heads, nope/rope/v the qk_nope/qk_rope/v head dims, qk = nope + rope:
//  - registration: q_a_proj (D -> q_lora_rank), q_a_layernorm, q_b_proj (-> H*qk) or q_proj
//    (q_lora_rank null), kv_a_proj_with_mqa (D -> kv_lora_rank + rope), kv_a_layernorm,
//    kv_b_proj (kv_lora_rank -> H*(nope + v)), o_proj (H*v -> D); attention_bias on
//    q_a_proj, kv_a_proj_with_mqa and o_proj;
//  - forward: q = q_b(norm(q_a(x))) (or q_proj(x)), .view(B,S,H,qk).transpose(1,2) (its
//    grad is copied back in backward), split [nope, rope] (views; SplitWithSizesBackward0
//    cats the grads); compressed_kv = kv_a(x), split [kv_lora_rank, rope]; kv_b(norm(latent))
//    viewed (B,H,S,nope+v) and split into k_pass and value_states (views); k_rot viewed
//    (B,1,S,rope) (one shared rope key); RoPE on q_rot and k_rot only: with rope_interleave
//    (DeepSeek's default) view(..., d/2, 2).transpose(4,3).reshape copies each first (and
//    the grad of that view is copied back), then (x*cos) + rotate_half(x)*sin;
//    k_rot.expand(B,H,S,rope) (a view: ExpandBackward0 sums the grad back); query/key =
//    cat((pass, rot), -1), contiguous (B,H,S,qk), which the matmuls use without copies;
//    eager_attention_forward (scores * scaling; the value slice is copied by matmul's
//    reshape; the (B,H,S,v) output transposed contiguous), o_proj.
//  - qk_head_dim != v_head_dim: scores and q/k are qk wide, the output and o_proj's input
//    H*v; the softmax scale (qk^-0.5, times mscale^2 with yarn's mscale_all_dim) is a
//    Python float: no memory.
//  - the frame's locals die at return in their order: q_states/q_pass (q_b's output),
//    q_rot (the rotated q), compressed_kv (kept by kv_a_layernorm in fp32), k_pass/k_rot
//    (the rotated k), value_states (kv_b's output), then q/k (kept by the matmul).
// Not modelled (refused by the scenario reader): SDPA kernels and flash attention (torch's
// flash kernel needs equal q/k/v head dims; HF pads v for FA2), autocast, LoRA, generation.
#include <stdexcept>

#include "graph/checkpoint.h"
#include "graph/models/decoder.h"
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
    p.q_a = add_proj(rq, D, pre, "self_attn.q_a_proj", a.qkv_bias, -1);
    rt_.ctx.module = Module::norm;
    p.q_a_norm = add_norm(rq, pre, "self_attn.q_a_layernorm");
    rt_.ctx.module = Module::attention;
    p.q_b = add_proj(H * qk, rq, pre, "self_attn.q_b_proj", false, -1);
  } else {
    p.q = add_proj(H * qk, D, pre, "self_attn.q_proj", false, -1);
  }
  p.kv_a = add_proj(rkv + rope, D, pre, "self_attn.kv_a_proj_with_mqa", a.qkv_bias, -1);
  rt_.ctx.module = Module::norm;
  p.kv_a_norm = add_norm(rkv, pre, "self_attn.kv_a_layernorm");
  rt_.ctx.module = Module::attention;
  p.kv_b = add_proj(H * (nope + v), rkv, pre, "self_attn.kv_b_proj", false, -1);
  p.o = add_proj(D, H * v, pre, "self_attn.o_proj", a.o_bias, -1);
}

Tensor DecoderModel::attention_mla(const LayerParams& p, const Tensor& x, const Tensor& mask,
                                   const Tensor& cos, const Tensor& sin) {
  if (arch().mla.v2_code) return attention_mla_v2(p, x, mask, cos);  // decoder_mla_v2.cpp
  ModuleScope module_scope(rt_, Module::attention);
  const MlaSpec& m = arch().mla;
  if (autocast_on()) throw std::runtime_error("multi-head latent attention under autocast is not modelled");
  const uint64_t e = s_.elem, H = static_cast<uint64_t>(s_.heads), rows = s_.rows();
  const uint64_t nope = static_cast<uint64_t>(m.qk_nope_head_dim);
  const uint64_t rkv = static_cast<uint64_t>(m.kv_lora_rank);
  Tensor out;
  // The forward's locals, declared in the order Python first binds them.
  Tensor q_states, q_pass, q_rot, compressed_kv, k_pass, k_rot, value_states, query_states, key_states,
      attn_output;
  if (m.q_lora_rank > 0) {
    // self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states))): each inner result is
    // a temporary of the call that consumes it.
    Tensor qn;
    {
      Tensor qa = project(x, p, p.q_a);
      qn = norm(qa, p.q_a_norm, rows, static_cast<uint64_t>(m.q_lora_rank));
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
    k_pass = split.piece(rt_, 0);
    k_rot = split.piece(rt_, 1);
  }
  {
    // self.kv_b_proj(self.kv_a_layernorm(k_pass)).view(key_shape).transpose(1, 2)
    Tensor kv;
    {
      Tensor kn = norm(k_pass, p.kv_a_norm, rows, rkv);
      kv = project(kn, p, p.kv_b);
    }
    k_pass = view(rt_, kv, H > 1);
  }
  {
    Chunk2 split(rt_, k_pass, rows * H * nope * e);  // torch.split(k, [nope, v], -1)
    Tensor kp = split.piece(rt_, 0);
    value_states = split.piece(rt_, 1);
    k_pass = std::move(kp);
  }
  // k_rot.view(B, 1, S, rope): its grad comes back contiguous, viewable (no node that copies).
  {
    // apply_rotary_pos_emb[_interleave](q_rot, k_rot, cos, sin): the interleave's reshape
    // copies q and k (locals of the function, dying at its return); the rotated q and k.
    Tensor q = q_rot, k = k_rot;
    if (m.rope_interleave) {
      q = clone(rt_, view(rt_, q_rot, true));  // view(b,h,s,d/2,2).transpose(4,3).reshape
      k = clone(rt_, view(rt_, k_rot, true));
    }
    Tensor q_embed = rope_hf(rt_, q, cos, sin);
    Tensor k_embed = rope_hf(rt_, k, cos, sin);
    q.reset();
    k.reset();
    q_rot = std::move(q_embed);
    k_rot = std::move(k_embed);
  }
  k_rot = expand_view(rt_, k_rot, H);  // k_rot.expand(*k_pass.shape[:-1], -1)
  query_states = cat2(rt_, q_pass, q_rot);
  key_states = cat2(rt_, k_pass, k_rot);
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
  k_pass.reset();
  k_rot.reset();
  value_states.reset();
  query_states.reset();
  key_states.reset();
  attn_output.reset();
  return out;
}

}  // namespace memsim::graph
