#include "sim/serve/vllm_profile_run.h"

#include <algorithm>
#include <utility>

#include "allocator/caching_allocator.h"
#include "graph/runtime.h"
#include "sim/serve/fused_moe.h"
#include "sim/step/execute.h"

namespace memsim::serve {

namespace {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

// The forward and sampler of one profile run, tensor by tensor (header comment).
class ProfileBuilder {
 public:
  ProfileBuilder(Runtime& rt, const ServedModel& m, const ProfileRunShape& s, bool kernel_scratch)
      : rt_(rt), m_(m), s_(s), scratch_(kernel_scratch) {
    T_ = static_cast<uint64_t>(s.tokens);
    R_ = static_cast<uint64_t>(s.requests);
    e_ = static_cast<uint64_t>(m.elem);
    d_ = static_cast<uint64_t>(m.d_model);
  }

  void run() {
    rt_.ctx.phase = Phase::forward;
    Tensor hidden = forward();
    rt_.ctx.layer = -1;
    // _dummy_run: hidden_states[logit_indices] (advanced indexing: a new [R, hidden]).
    Tensor last = act(R_ * d_ * e_, OpKind::gather);
    rt_.mark("forward_end");
    rt_.ctx.phase = Phase::other;
    sampler(last);
    // profile_run: `del hidden_states, output`.
    last.reset();
    hidden.reset();
    rt_.mark("profile_end");
  }

 private:
  Tensor act(uint64_t bytes, OpKind op) { return rt_.alloc(bytes, TensorKind::activation, op); }
  Tensor tmp(uint64_t bytes, OpKind op) { return rt_.alloc(bytes, TensorKind::temporary, op); }

  // F.linear(x, W[, b]): a new [rows, out] in the model dtype; cuBLAS's workspace on first use.
  Tensor linear(uint64_t rows, uint64_t out, bool bias) {
    Tensor y = act(rows * out * e_, bias ? OpKind::addmm : OpKind::mm_linear);
    rt_.note_gemm();
    if (bias) rt_.note_gemm_lt();
    return y;
  }
  // RowParallelLinear with reduce_results: pynccl's out-of-place all_reduce; the partial
  // output dies when the linear returns.
  Tensor reduce(Tensor partial) {
    if (m_.tp == 1) return partial;
    Tensor out = act(partial.bytes, OpKind::other);
    partial.reset();
    return out;
  }

  Tensor embedding() {
    Tensor h = act(T_ * d_ * e_, OpKind::embedding_nn);
    // Gemma-3 eager: embed_tokens(ids) * normalizer is out of place (the raw embedding dies);
    // Gemma-2 multiplies in place, and Inductor writes the product into one buffer.
    if (m_.gemma3 && !s_.compiled) h = act(T_ * d_ * e_, OpKind::mul_scalar);
    if (m_.tp > 1) {
      // VocabParallelEmbedding: masked ids (int64) before the lookup, then all_reduce.
      h = reduce(std::move(h));
    }
    return h;
  }

  uint64_t q_width() const { return static_cast<uint64_t>(m_.q_heads_rank * m_.head_dim); }
  uint64_t kv_width() const { return static_cast<uint64_t>(m_.kv_heads_rank * m_.head_dim); }

  // Eager LlamaAttention.forward on the normed input: the output [T, hidden]. RoPE and
  // the KV-cache write work in place; the locals (qkv, the q/k norms' outputs, the
  // attention output) die when forward returns.
  Tensor attention() {
    const uint64_t qkv_w = q_width() + 2 * kv_width();
    Tensor qkv = linear(T_, qkv_w, m_.qkv_bias);
    Tensor qn, kn;
    if (m_.qk_norm || m_.qk_norm_full) {  // Qwen3 per head, OLMoE over the width: out of place
      qn = act(T_ * q_width() * e_, OpKind::fused_rms_norm);
      kn = act(T_ * kv_width() * e_, OpKind::fused_rms_norm);
    }
    // Attention.forward: output = torch.empty(T, heads * head_dim); the kernel is skipped
    // without metadata (profiling).
    Tensor attn = act(T_ * q_width() * e_, OpKind::other);
    Tensor o = linear(T_, d_, m_.o_bias);
    return reduce(std::move(o));
  }

  // MLAAttention's part of the profile run, after its inputs exist: forward allocates the
  // output [T, heads x v_head_dim] (torch.empty(output_shape)); forward_impl without
  // metadata allocates the simulated kv_b_proj output [workspace, heads, nope + v], which
  // dies when forward_impl returns, and zero-fills the output (deepseek_mla.h).
  Tensor mla_attention_core() {
    const MlaDims& a = m_.mla;
    Tensor out = act(T_ * static_cast<uint64_t>(a.heads_rank * a.v_head) * e_, OpKind::other);
    Tensor upproj = tmp(mla_profile_upproj_bytes(a, s_.mla_workspace_tokens, m_.elem), OpKind::other);
    upproj.reset();
    return out;
  }

  // DeepseekScalingRotaryEmbedding.forward_native (is_neox_style False; vLLM's CUDA path
  // without FlashInfer) on x [T, n, rope]: cos_sin_cache[positions], repeat_interleave'd
  // cos / sin, x * cos, rotate_gptj(x) (-x2 and the stack), * sin, and the sum, which it
  // returns. The caller allocates the gathered cos / sin, shared by q and k.
  Tensor rope_native(uint64_t n) {
    const uint64_t r = static_cast<uint64_t>(m_.mla.qk_rope);
    Tensor xc = tmp(T_ * n * r * e_, OpKind::mul);           // x_rot * cos
    Tensor neg = tmp(T_ * n * (r / 2) * e_, OpKind::neg);    // -x2
    Tensor st = tmp(T_ * n * r * e_, OpKind::cat2);          // torch.stack((-x2, x1), -1)
    neg.reset();
    Tensor xs = tmp(T_ * n * r * e_, OpKind::mul);           // rotate_gptj(x) * sin
    st.reset();
    Tensor y = act(T_ * n * r * e_, OpKind::add);
    xc.reset();
    xs.reset();
    return y;
  }

  // Eager MultiHeadLatentAttentionWrapper.forward on the normed input (vllm/model_executor/
  // layers/mla.py at 00b9b7ad): every local (the a-projection output the splits view, the
  // normed q_c, q, kv_c_normed, the rotated k_pe, the attention output) lives until the
  // function returns, after o_proj (and its TP all-reduce).
  Tensor attention_mla() {
    const MlaDims& a = m_.mla;
    const uint64_t qk = static_cast<uint64_t>(a.heads_rank * a.qk_head());
    Tensor lora, q_c, q;
    if (a.q_lora_rank > 0) {
      lora = linear(T_, static_cast<uint64_t>(a.q_lora_rank + a.latent()), false);  // fused_qkv_a_proj
      q_c = act(T_ * static_cast<uint64_t>(a.q_lora_rank) * e_, OpKind::fused_rms_norm);  // q_a_layernorm
      q = linear(T_, qk, false);  // q_b_proj
    } else {
      lora = linear(T_, static_cast<uint64_t>(a.latent()), false);  // kv_a_proj_with_mqa
      q = linear(T_, qk, false);  // q_proj
    }
    Tensor kv_c_normed = act(T_ * static_cast<uint64_t>(a.kv_lora_rank) * e_, OpKind::fused_rms_norm);
    Tensor k_pe;
    {
      // q[..., nope:], k_pe = rotary_emb(positions, q[..., nope:], k_pe): the rotated q is
      // copied back into q's slice (and dies with the statement); k_pe is rebound.
      const uint64_t r = static_cast<uint64_t>(a.qk_rope);
      Tensor cs = tmp(T_ * r * e_, OpKind::index);              // cos_sin_cache[positions]
      Tensor cos = tmp(T_ * r * e_, OpKind::expand_clone);
      Tensor sin = tmp(T_ * r * e_, OpKind::expand_clone);
      Tensor q_rot = rope_native(static_cast<uint64_t>(a.heads_rank));
      Tensor k_rot = rope_native(1);
      cs.reset();
      cos.reset();
      sin.reset();
      q_rot.reset();
      k_pe = std::move(k_rot);
    }
    Tensor attn = mla_attention_core();
    Tensor o = linear(T_, d_, false);
    return reduce(std::move(o));
  }

  // The same under Inductor: the normed input dies after its last projection, q_c after
  // q_b_proj, the a-projection output once the norm and RoPE have read it (RoPE fused,
  // writing q's slice in place and a new k_pe), q / kv_c_normed / k_pe after the attention
  // op, its output after o_proj.
  Tensor attention_mla_compiled(Tensor normed) {
    const MlaDims& a = m_.mla;
    const uint64_t qk = static_cast<uint64_t>(a.heads_rank * a.qk_head());
    Tensor lora, q;
    if (a.q_lora_rank > 0) {
      lora = linear(T_, static_cast<uint64_t>(a.q_lora_rank + a.latent()), false);
      normed.reset();
      Tensor q_c = act(T_ * static_cast<uint64_t>(a.q_lora_rank) * e_, OpKind::fused_rms_norm);
      q = linear(T_, qk, false);
    } else {
      lora = linear(T_, static_cast<uint64_t>(a.latent()), false);
      q = linear(T_, qk, false);
      normed.reset();
    }
    Tensor kv_c_normed = act(T_ * static_cast<uint64_t>(a.kv_lora_rank) * e_, OpKind::fused_rms_norm);
    Tensor k_pe = act(T_ * static_cast<uint64_t>(a.qk_rope) * e_, OpKind::rope);
    lora.reset();
    Tensor attn = mla_attention_core();
    q.reset();
    kv_c_normed.reset();
    k_pe.reset();
    Tensor o = linear(T_, d_, false);
    attn.reset();
    return reduce(std::move(o));
  }

  // Eager LlamaMLP.forward on the normed input (which the caller keeps).
  Tensor mlp() {
    const uint64_t f = static_cast<uint64_t>(m_.d_ff_rank);
    Tensor gu = linear(T_, 2 * f, m_.mlp_bias);
    Tensor a = act(T_ * f * e_, OpKind::silu);  // SiluAndMul: torch.empty(..., d) + kernel
    gu.reset();  // `x = self.act_fn(x)` rebinds
    Tensor out = reduce(linear(T_, d_, m_.mlp_bias));
    a.reset();  // `x, _ = self.down_proj(x)` rebinds after down_proj returns
    return out;
  }

  // GroupedTopKRouter._compute_routing (router/grouped_topk_router.py at 055e47c2) on the
  // [T, E] router logits, returning fp32 weights and int32 ids [T, k]:
  //  - with e_score_correction_bias (V3's noaux_tc; VLLM_USE_FUSED_MOE_GROUPED_TOPK on,
  //    n_group and top_k <= 32): fused_grouped_topk's one CUDA kernel, which writes the two
  //    outputs directly;
  //  - else (V2): the torch.compile'd grouped_topk: softmax (sigmoid) scores [T, E], the
  //    group maxima and group mask [T, n_group], the masked scores [T, E] (model dtype),
  //    topk's values [T, k] and int64 ids, then .to(float32) / .to(int32); inside the compiled
  //    function every buffer dies at its last use. Not modelled: the [T, n_group] group
  //    scores and mask (128 KiB at 8192 tokens and 8 groups), whose fusion by Inductor is
  //    not known; the routed_scaling_factor multiply, which vLLM applies to the experts'
  //    output in place on CUDA (apply_routed_scale_to_output).
  void grouped_topk(Tensor& weights, Tensor& ids) {
    const uint64_t E = static_cast<uint64_t>(m_.moe.experts), k = static_cast<uint64_t>(m_.moe.top_k);
    if (m_.moe.correction_bias) {  // read_deepseek refuses n_group or top_k above 32
      weights = act(T_ * k * 4, OpKind::topk);
      ids = act(T_ * k * 4, OpKind::topk);
      return;
    }
    Tensor scores = tmp(T_ * E * e_, m_.moe.sigmoid ? OpKind::sigmoid : OpKind::softmax);
    Tensor masked = tmp(T_ * E * e_, OpKind::masked_fill);
    scores.reset();
    Tensor vals = tmp(T_ * k * e_, OpKind::topk);
    Tensor idx64 = tmp(T_ * k * 8, OpKind::topk);
    masked.reset();
    weights = act(T_ * k * 4, OpKind::to_copy);
    vals.reset();
    ids = act(T_ * k * 4, OpKind::to_copy);
    idx64.reset();
  }

  // One FusedMoE block (sim/serve/fused_moe.h) on the normed input x. The routed experts
  // run in place (forward_cuda: fused_experts(..., inplace=True)), so the block's output is
  // x's storage unless Qwen2-MoE's shared-expert add or the TP all-reduce makes a new one.
  Tensor moe(const Tensor& x) {
    const FusedMoeBuffers b = fused_moe_buffers(m_.moe, s_.tokens, m_.d_model, m_.elem);
    Tensor shared;
    if (m_.moe.shared_d_ff > 0) {
      // Qwen2MoeSparseMoeBlock: shared_output = shared_expert(x), gated by
      // sigmoid(shared_expert_gate(x)), computed before the router; it lives through the
      // routed experts. down_proj has reduce_results=False (one all-reduce at the end).
      const auto f = static_cast<uint64_t>(m_.moe.shared_d_ff_rank);
      Tensor gu = linear(T_, 2 * f, false);
      Tensor a = act(T_ * f * e_, OpKind::silu);
      gu.reset();
      Tensor dn = linear(T_, d_, false);
      a.reset();
      if (!m_.moe.shared_gate) {
        // DeepseekV2MoE: shared_experts is an ungated DeepseekV2MLP computed before the
        // routed experts (reduce_results=False); its output lives through them.
        shared = std::move(dn);
      } else {
        Tensor g = linear(T_, 1, false);
        Tensor sg = act(T_ * e_, OpKind::sigmoid);
        g.reset();
        shared = act(T_ * d_ * e_, OpKind::mul);
        sg.reset();
        dn.reset();
      }
    }
    Tensor logits = act(b.router_logits, OpKind::mm_linear);  // the ReplicatedLinear gate
    rt_.note_gemm();
    {
      Tensor weights, ids;
      if (m_.moe.grouped) {
        grouped_topk(weights, ids);
      } else {
      // FusedMoE.select_experts -> fused_topk: three [T, k] outputs, then .float().
      weights = act(b.topk_weights, OpKind::topk);
      ids = act(b.topk_ids, OpKind::topk);
      Tensor token_expert = tmp(b.token_expert_indices, OpKind::topk);
      Tensor gating_f32;
      if (b.gating_float > 0) gating_f32 = tmp(b.gating_float, OpKind::to_copy);
      if (b.renorm_sum > 0) {  // topk_weights = topk_weights / topk_weights.sum(-1, keepdim)
        Tensor sum = tmp(b.renorm_sum, OpKind::sum_dim);
        Tensor divided = act(b.topk_weights, OpKind::div);
        sum.reset();
        weights = std::move(divided);
      }
      gating_f32.reset();     // fused_topk returns
      token_expert.reset();   // select_experts returns (topk_weights, topk_ids)
      }
      // fused_experts_impl: cache13 (caches 1 and 3), cache2, then per chunk
      // moe_align_block_size's sorted_ids / expert_ids / num_tokens_post_pad (the previous
      // chunk's die when the names are rebound); moe_sum writes into x.
      Tensor cache13 = tmp(b.cache13, OpKind::other);
      Tensor cache2 = tmp(b.cache2, OpKind::other);
      Tensor sorted, expert_ids, post_pad;
      for (int64_t c = 0; c < b.chunks; ++c) {
        const bool last = c == b.chunks - 1;
        Tensor ns = tmp(last ? b.last_sorted_ids : b.sorted_ids, OpKind::fill);
        Tensor ne = tmp(last ? b.last_expert_ids : b.expert_ids, OpKind::zeros);
        Tensor np = tmp(b.num_post_pad, OpKind::other);
        sorted = std::move(ns);
        expert_ids = std::move(ne);
        post_pad = std::move(np);
      }
      // fused_experts_impl returns: its locals die; then forward_cuda's topk tensors.
    }
    logits.reset();
    Tensor out = x;
    if (shared.defined() && !m_.moe.shared_gate) {
      // DeepseekV2MoE: final_hidden_states *= routed_scaling_factor (applied to the output
      // on CUDA) and += shared_output, both in place.
      shared.reset();
    } else if (shared.defined()) {  // final_hidden_states + shared_output
      Tensor sum = act(T_ * d_ * e_, OpKind::add);
      shared.reset();
      out = std::move(sum);
    }
    return reduce(std::move(out));
  }

  Tensor forward() {
    Tensor h = embedding();
    Tensor residual;
    for (int64_t l = 0; l < m_.layers; ++l) {
      rt_.ctx.layer = static_cast<int32_t>(l);
      if (m_.gemma)
        h = s_.compiled ? layer_gemma_compiled(std::move(h), residual, l) : layer_gemma_eager(h, residual, l);
      else
        h = s_.compiled ? layer_compiled(std::move(h), residual, l) : layer_eager(h, residual, l);
    }
    rt_.ctx.layer = -1;
    if (s_.compiled) {
      // model.norm(h, residual): the fused add + norm writes two buffers; only the normed
      // output leaves the graph.
      Tensor sum = tmp(T_ * d_ * e_, OpKind::fused_rms_norm);
      h.reset();
      residual.reset();
      Tensor out = act(T_ * d_ * e_, OpKind::fused_rms_norm);
      sum.reset();
      return out;
    }
    if (m_.gemma) {
      // GemmaRMSNorm(h, residual): a new sum (discarded) and a new normed output; h and
      // residual die when the model's forward returns.
      Tensor sum = tmp(T_ * d_ * e_, OpKind::fused_rms_norm);
      Tensor out = act(T_ * d_ * e_, OpKind::fused_rms_norm);
      sum.reset();
      h.reset();
      residual.reset();
      return out;
    }
    // eager: fused_add_rms_norm in place; `residual` (the embedding's storage) dies when
    // LlamaModel.forward returns.
    residual.reset();
    return h;
  }

  // Python lifetimes: `h` (the layer input) is LlamaModel.forward's hidden_states for the
  // whole call; returns the layer output.
  Tensor layer_eager(const Tensor& h, Tensor& residual, int64_t l) {
    Tensor x;
    if (l == 0) {
      residual = h;  // `residual = hidden_states`: the embedding output
      x = act(T_ * d_ * e_, OpKind::fused_rms_norm);  // rms_norm: torch.empty_like + kernel
    } else {
      x = h;  // fused_add_rms_norm(hidden_states, residual) in place
    }
    Tensor a = m_.mla.enabled() ? attention_mla() : attention();
    x.reset();  // `hidden_states = self.self_attn(...)` (the layer-0 norm output dies)
    // post_attention_layernorm: fused_add_rms_norm in place on a and residual.
    Tensor out = m_.layer_is_moe(l) ? moe(a) : mlp();
    a.reset();  // `hidden_states = self.mlp(hidden_states)`
    return out;
  }

  // The attention under Inductor on the normed input (which dies after qkv_proj).
  Tensor attention_compiled(Tensor normed) {
    const uint64_t qkv_w = q_width() + 2 * kv_width();
    Tensor qkv = linear(T_, qkv_w, m_.qkv_bias);
    normed.reset();
    Tensor qr = act(T_ * q_width() * e_, OpKind::rope);  // (q_norm fused with RoPE)
    Tensor kr = act(T_ * kv_width() * e_, OpKind::rope);
    Tensor attn = act(T_ * q_width() * e_, OpKind::other);
    qr.reset();
    kr.reset();
    qkv.reset();
    Tensor o = linear(T_, d_, m_.o_bias);
    attn.reset();
    return reduce(std::move(o));
  }

  // Gemma-2/3 (gemma2.py / gemma3.py Gemma*DecoderLayer.forward) under Inductor: the four
  // GemmaRMSNorm are out of place (input and pre_feedforward fused with the residual add,
  // writing the sum and the normed output); every intermediate dies at its last use.
  Tensor layer_gemma_compiled(Tensor h, Tensor& residual, int64_t l) {
    const uint64_t row = T_ * d_ * e_;
    Tensor x;
    if (l == 0) {
      residual = std::move(h);
      x = act(row, OpKind::fused_rms_norm);
    } else {
      Tensor sum = act(row, OpKind::fused_rms_norm);  // h + residual
      h.reset();
      residual = std::move(sum);
      x = act(row, OpKind::fused_rms_norm);
    }
    Tensor a = attention_compiled(std::move(x));
    Tensor pa = act(row, OpKind::fused_rms_norm);  // post_attention_layernorm(a)
    a.reset();
    Tensor sum2 = act(row, OpKind::fused_rms_norm);  // pa + residual
    pa.reset();
    residual = std::move(sum2);
    Tensor x2 = act(row, OpKind::fused_rms_norm);   // pre_feedforward_layernorm
    const uint64_t f = static_cast<uint64_t>(m_.d_ff_rank);
    Tensor gu = linear(T_, 2 * f, m_.mlp_bias);
    x2.reset();
    Tensor g = act(T_ * f * e_, OpKind::gelu);  // GeluAndMul(approximate="tanh")
    gu.reset();
    Tensor dn = reduce(linear(T_, d_, m_.mlp_bias));
    g.reset();
    Tensor out = act(row, OpKind::fused_rms_norm);  // post_feedforward_layernorm
    dn.reset();
    return out;
  }

  // The same with Python's lifetimes (--enforce-eager): GemmaRMSNorm.forward_cuda runs a
  // torch.compile'd forward_static that returns new tensors (the normed output, and the new
  // residual when given one). Gemma*Model.forward keeps the layer's input hidden_states and
  // residual until the layer returns.
  Tensor layer_gemma_eager(const Tensor& h, Tensor& residual, int64_t l) {
    const uint64_t row = T_ * d_ * e_;
    Tensor held = residual;  // the caller's `residual` until the layer returns
    Tensor x;
    if (l == 0) {
      residual = h;
      x = act(row, OpKind::fused_rms_norm);
    } else {
      Tensor sum = act(row, OpKind::fused_rms_norm);
      x = act(row, OpKind::fused_rms_norm);
      residual = std::move(sum);
    }
    Tensor a = attention();
    x.reset();
    Tensor pa = act(row, OpKind::fused_rms_norm);  // post_attention_layernorm
    a.reset();
    Tensor sum2 = act(row, OpKind::fused_rms_norm);
    Tensor x2 = act(row, OpKind::fused_rms_norm);  // pre_feedforward_layernorm(pa, residual)
    pa.reset();
    residual = std::move(sum2);
    Tensor mo = mlp();
    x2.reset();
    Tensor out = act(row, OpKind::fused_rms_norm);  // post_feedforward_layernorm
    mo.reset();
    return out;
  }

  // Inductor lifetimes: every intermediate dies at its last use.
  Tensor layer_compiled(Tensor h, Tensor& residual, int64_t l) {
    Tensor x;
    if (l == 0) {
      residual = std::move(h);
      x = act(T_ * d_ * e_, OpKind::fused_rms_norm);
    } else {
      Tensor sum = act(T_ * d_ * e_, OpKind::fused_rms_norm);  // h + residual
      h.reset();
      residual = std::move(sum);
      x = act(T_ * d_ * e_, OpKind::fused_rms_norm);
    }
    Tensor a = m_.mla.enabled() ? attention_mla_compiled(std::move(x)) : attention_compiled(std::move(x));
    Tensor sum2 = act(T_ * d_ * e_, OpKind::fused_rms_norm);  // a + residual
    a.reset();
    residual = std::move(sum2);
    Tensor x2 = act(T_ * d_ * e_, OpKind::fused_rms_norm);
    if (m_.layer_is_moe(l)) {
      Tensor out = moe(x2);
      x2.reset();
      return out;
    }
    const uint64_t f = static_cast<uint64_t>(m_.d_ff_rank);
    Tensor gu = linear(T_, 2 * f, m_.mlp_bias);
    x2.reset();
    Tensor sm = act(T_ * f * e_, OpKind::silu);
    gu.reset();
    Tensor dn = linear(T_, d_, m_.mlp_bias);
    sm.reset();
    return reduce(std::move(dn));
  }

  // _dummy_sampler_run(last_hidden_states) and Sampler.forward (header comment).
  void sampler(const Tensor& /*last*/) {
    const uint64_t V = static_cast<uint64_t>(m_.vocab);
    const uint64_t N = R_ * V;
    Tensor rnd = act(R_ * d_ * e_, OpKind::other);  // torch.rand_like(hidden_states)
    // compute_logits: lm_head on the R rows, then (TP) all-gather along the vocabulary:
    // all_gather_into_tensor into a [tp, R, V/tp] buffer, movedim + reshape copies it.
    Tensor logits = linear(R_, static_cast<uint64_t>(m_.vocab_rank), false);
    if (m_.tp > 1) {
      const uint64_t full = R_ * static_cast<uint64_t>(m_.padded_vocab) * e_;
      Tensor gathered = act(full, OpKind::other);
      Tensor reshaped = act(full, OpKind::clone);
      gathered.reset();
      logits = std::move(reshaped);
    }
    // LogitsProcessor soft_cap (Gemma-2's final_logit_softcapping): logits / cap, tanh,
    // * cap, each out of place on the [R, vocab] slice; the previous one dies at rebinding.
    if (m_.final_softcap > 0.0) {
      for (OpKind op : {OpKind::div_scalar, OpKind::tanh, OpKind::mul_scalar}) {
        Tensor next = act(N * e_, op);
        logits = std::move(next);
      }
    }
    // Sampler.forward: logits.to(torch.float32) (the caller keeps the model-dtype logits).
    Tensor f32 = e_ == 4 ? logits : act(N * 4, OpKind::to_copy);
    Tensor greedy = act(R_ * 8, OpKind::other);  // greedy_sample: argmax
    // apply_temperature: div_ in place. TopKTopPSampler.forward_native:
    Tensor scattered;
    {
      // logits.sort(dim=-1): values, int64 indices, and PyTorch's segmented sort scratch
      // (aten/src/ATen/native/cuda/SortStable.cu: int64 reverse indices; CUB's
      // DeviceSegmentedRadixSort::SortPairs alternate key and value buffers).
      Tensor vals = act(N * 4, OpKind::other);
      Tensor idx = act(N * 8, OpKind::other);
      if (scratch_) {
        Tensor rev = tmp(N * 8, OpKind::other);
        Tensor cub = tmp(N * (4 + 8), OpKind::other);
        cub.reset();
        rev.reset();
      }
      Tensor k_row = tmp(R_ * 8, OpKind::sub);        // vocab - k (int64)
      Tensor k_thr = tmp(R_ * 4, OpKind::gather);     // logits_sort.gather(1, ...)
      k_row.reset();
      Tensor k_mask = act(N, OpKind::compare);        // logits_sort < threshold (bool)
      k_thr.reset();
      Tensor probs_sort = act(N * 4, OpKind::softmax);  // softmax; cumsum(out=) in place
      Tensor p_thr = tmp(R_ * 4, OpKind::sub);         // 1 - p.unsqueeze(1)
      Tensor p_mask = act(N, OpKind::compare);
      p_thr.reset();
      scattered = act(N * 4, OpKind::other);          // logits_sort.scatter(...)
      // apply_top_k_top_p returns: its locals die.
    }
    Tensor probs = act(N * 4, OpKind::softmax);  // logits.softmax(dim=-1, dtype=float32)
    {
      Tensor q = act(N * 4, OpKind::other);  // torch.empty_like(probs).exponential_()
      Tensor choice = act(R_ * 8, OpKind::other);  // probs.div_(q).argmax(dim=-1)
      q.reset();
      // random_sample returns `choice`; forward_native returns it.
      probs.reset();
      scattered.reset();
      Tensor cond = tmp(R_, OpKind::compare);  // temperature < eps, where(..., out=greedy)
      cond.reset();
    }
    f32.reset();
    greedy.reset();
    logits.reset();
    rnd.reset();
  }

  Runtime& rt_;
  const ServedModel& m_;
  const ProfileRunShape& s_;
  bool scratch_;
  uint64_t T_ = 0, R_ = 0, e_ = 2, d_ = 0;
};

}  // namespace

ProfileRun vllm_profile_run(const ServedModel& m, const std::vector<WeightTensor>& weights,
                            const ProfileRunShape& shape, const DeviceConfig& device,
                            const AllocatorConfig& allocator) {
  ProfileRun r;
  {
    Runtime rt(r.program);
    rt.grad_enabled = false;  // torch.inference_mode()
    rt.cublas_workspace = device.cublas_workspace;
    rt.ctx.phase = Phase::setup;
    for (const WeightTensor& w : weights) rt.add_parameter(w.bytes, w.name);
    rt.mark("profile_begin");
    ProfileBuilder(rt, m, shape, device.kernel_scratch).run();
    rt.freeze();
  }
  constexpr uint64_t kUnlimited = 1ull << 60;  // device.capacity 0: no limit
  const uint64_t total = device.capacity == 0 ? kUnlimited : device.capacity;
  SimulatedDevice dev(total, std::min(device.cuda_context, total));
  ExecuteOptions options;
  options.reset_peaks_at_mark = "profile_begin";
  const Timeline tl = execute(r.program, allocator, dev, options);
  r.oom = tl.oom.has_value();
  // Walk the timeline: the baseline at profile_begin, the peaks after it.
  const std::string& begin = "profile_begin";
  const std::string& fwd_end = "forward_end";
  size_t i_begin = tl.size(), i_fwd = tl.size();
  for (size_t i = 0; i < tl.size(); ++i) {
    const MemoryEvent& ev = r.program.events[i];
    if (ev.type != EventType::mark) continue;
    const std::string& name = r.program.str(static_cast<uint32_t>(ev.bytes));
    if (name == begin) i_begin = i;
    if (name == fwd_end) i_fwd = i;
  }
  if (i_begin < tl.size()) {
    r.baseline_allocated = tl.allocated[i_begin];
    size_t at = i_begin;
    for (size_t i = i_begin; i < tl.size(); ++i) {
      if (tl.allocated[i] > r.peak_allocated) {
        r.peak_allocated = tl.allocated[i];
        at = i;
      }
      const uint64_t inc = tl.allocated[i] - r.baseline_allocated;
      if (i <= i_fwd) r.forward_peak_increase = std::max(r.forward_peak_increase, inc);
      else r.sampler_peak_increase = std::max(r.sampler_peak_increase, inc);
    }
    r.torch_peak_increase = r.peak_allocated - r.baseline_allocated;
    r.peak_op = r.program.str(r.program.events[at].op);
  }
  if (r.oom) r.oom_what = tl.oom->details.message;
  return r;
}

}  // namespace memsim::serve
