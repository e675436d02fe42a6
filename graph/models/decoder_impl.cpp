// DecoderModel rows of other training stacks' model code (model.implementation;
// graph/models/decoder_spec.h ModelImpl, docs/implementations.md): the same Llama
// architecture as the hf row, written as that stack writes it. What differs from
// transformers' code is here; the shared pieces (projections, the GLU MLP, the residual
// layer, SDPA kernels, checkpoint regions) are the hf row's modules.
//
// torchtitan (pytorch/torchtitan 5077be6ef889de93fc7a246197e33967d4307531, 2025-12-26):
//  - torchtitan/models/llama3/model/model.py Transformer: tok_embeddings, layers (a
//    ModuleDict of TransformerBlock: attention wq/wk/wv/wo, feed_forward w1/w2/w3,
//    attention_norm, ffn_norm, all nn.RMSNorm), norm, output; the non-persistent complex64
//    `freqs_cis` buffer (max_seq_len = training.seq_len, TransformerModelArgs.
//    update_from_config) of (S, head_dim/2). Built on the meta device, then to_empty()
//    (children's parameters, then the root's buffer) and init_weights(), which recomputes
//    freqs_cis into a new tensor.
//  - forward: h = tok_embeddings(tokens); each layer h = layer(h, freqs_cis); norm; output.
//    With step.compile_scope: block each layer is a compiled region (apply_compile wraps
//    every TransformerBlock; graph/compile.h, docs/compile.md "torchtitan's own model code").
//    No mask, no position ids: SDPA with is_causal (attention.py
//    ScaledDotProductAttentionWrapper).
//  - Attention.forward: wq, wk, wv; views (B,S,h,hd); apply_rotary_emb (complex product,
//    graph/ops/ops_stack.h); repeat_kv = unsqueeze/expand/reshape (a copy when n_rep > 1
//    and KV > 1); transposes (views); SDPA; output.transpose(1,2).contiguous() (the
//    kernel's layout makes it a no-op); wo.
//  - components/loss.py cross_entropy_loss: F.cross_entropy(pred.flatten(0, 1).float(),
//    labels.flatten(0, 1)): the labels come shifted from the dataloader (no slice, no
//    copy); the fp32 copy (16-bit logits) lives for the call; train.py divides it by the
//    accumulation steps (RescaleAccumulatedLoss) and `del pred` before backward
//    (TrainingScript::del_output_after_loss).
//
// torchtune (pytorch/torchtune v0.6.1; models/llama3/_component_builders.py llama3()):
//  - one RotaryPositionalEmbeddings (modules/position_embeddings.py) shared by every
//    attention: `theta` (hd/2 fp32) and the (max_seq_len, hd/2, 2) fp32 `cache` buffers,
//    max_seq_len = model.context_length (8192 for llama3, 131072 for llama3_1 builders);
//    applied to q and k in their (B,S,h,hd) layout, before the transposes
//    (graph/ops/ops_stack.h rope_pairs).
//  - RMSNorm (modules/rms_norm.py): x.float(), x * rsqrt(pow(2).mean + eps) in fp32,
//    .type_as(x), * scale.
//  - MultiHeadAttention (modules/attention.py): q_proj, view, rope, transpose; k_proj,
//    v_proj, views, rope on k, transposes; GQA by unsqueeze/expand/flatten (a copy when
//    KV > 1); SDPA is_causal (no mask, no kv cache); output_proj.
//  - TransformerSelfAttentionLayer (modules/transformer.py): `attn_out` and `mlp_out` are
//    named locals, alive until the layer returns.
//  - TransformerDecoder.unembed with the recipe's set_num_output_chunks(8): norm, then
//    [output(chunk) for chunk in h.chunk(8, dim=1)] (each chunk a (B, S/8, D) view that
//    matmul copies when B > 1 and the output weight requires grad).
//  - lora_llama3 (lora.rank > 0): LoRALinear for the lora.targets among q/k/v/output_proj
//    (lora_attn_modules) and w1/w2/w3 (apply_lora_to_mlp, all three), the rest frozen
//    (graph/models/lora_tune.cpp; recipes/lora_finetune_single_device.py).
//  - CEWithChunkedOutputLoss (modules/loss/ce_chunked_output_loss.py) after the recipe's
//    label shift (recipes/full_finetune_single_device.py _loss_step: hstack with the
//    ignore_labels_cache); `del logits` before backward.
#include <stdexcept>
#include <string>

#include "graph/checkpoint.h"
#include "graph/compile.h"
#include "graph/models/decoder.h"
#include "graph/ops/ops_nn.h"
#include "graph/ops/ops_stack.h"

namespace memsim::graph {

bool DecoderModel::titan() const { return arch().impl == ModelImpl::torchtitan; }

// The (S, head_dim/2) complex64 freqs_cis: S x head_dim x 4 bytes.
uint64_t DecoderModel::freqs_bytes() const { return s_.seq * s_.head_dim() * 4; }

// The two stacks' Llama modules register the same parameters in the same order (the
// optimizer's order); only the names differ.
constexpr StackParamNames kTitanNames = {"attention.wq", "attention.wk", "attention.wv",
                                         "attention.wo", "feed_forward.w1", "feed_forward.w2",
                                         "feed_forward.w3", "attention_norm", "ffn_norm"};
constexpr StackParamNames kTuneNames = {"attn.q_proj", "attn.k_proj", "attn.v_proj",
                                        "attn.output_proj", "mlp.w1", "mlp.w2", "mlp.w3",
                                        "sa_norm", "mlp_norm"};

// tok_embeddings, per layer q/k/v/o, w1/w2/w3 and the two norms, the final norm, output.
void DecoderModel::add_stack_parameters(const StackParamNames& n) {
  const uint64_t e = s_.elem, D = s_.d_model, F = s_.d_ff, V = s_.vocab;
  const uint64_t qD = s_.q_dim(), kvD = s_.kv_dim();
  rt_.ctx.module = Module::embedding;
  embed_ = rt_.add_parameter(V * D * e, "tok_embeddings.weight");
  rt_.parameters()[embed_].rows = V;
  layers_.resize(s_.layers);
  for (int32_t l = 0; l < s_.layers; ++l) {
    rt_.ctx.layer = l;
    LayerParams& p = layers_[l];
    const std::string pre = "layers." + std::to_string(l) + ".";
    // torchtune's LoRALinear registers its base weight, then lora_a and lora_b
    // (graph/models/lora_tune.cpp); torchtitan has no LoRA (refused).
    auto proj = [&](uint64_t out, uint64_t in, const char* name, uint32_t m) {
      const bool adapted = tune() && lora_.targets(m);
      Proj pr = add_proj(out, in, pre, name, false, adapted ? static_cast<int32_t>(m) : -1);
      if (adapted) p.ad[m] = lora_.add_tune_adapter(out, in, pre + name);
      return pr;
    };
    rt_.ctx.module = Module::attention;
    p.q = proj(qD, D, n.wq, kQProj);
    p.k = proj(kvD, D, n.wk, kKProj);
    p.v = proj(kvD, D, n.wv, kVProj);
    p.o = proj(D, qD, n.wo, kOProj);
    rt_.ctx.module = Module::mlp;
    p.gate = proj(F, D, n.w1, kGateProj);
    p.down = proj(D, F, n.w2, kDownProj);
    p.up = proj(F, D, n.w3, kUpProj);
    rt_.ctx.module = Module::norm;
    p.norm[kInputNorm] = add_norm(D, pre, n.attn_norm);
    p.norm[kPostAttnNorm] = add_norm(D, pre, n.ffn_norm);
  }
  rt_.ctx.layer = -1;
  rt_.ctx.module = Module::norm;
  final_norm_ = add_norm(D, "", "norm");
  rt_.ctx.module = Module::head;
  lm_head_ = rt_.add_parameter(V * D * e, "output.weight");
  rt_.parameters()[lm_head_].rows = V;
  if (tune() && lora_.enabled()) lora_.freeze_all_but_tune_adapters();
}

void DecoderModel::construct_titan() {
  add_stack_parameters(kTitanNames);
  // to_empty() gives the buffer its storage after every parameter; init_weights() then
  // assigns a freshly computed table (precompute_freqs_cis' temporaries are a few
  // head_dim/2 vectors and one (S, head_dim/2) fp32 angle table, freed as it returns).
  rt_.ctx.module = Module::attention;
  Tensor empty = rt_.alloc(freqs_bytes(), TensorKind::other, OpKind::other);
  {
    Tensor angles = rt_.alloc(freqs_bytes() / 2, TensorKind::temporary, OpKind::other);  // outer
    Tensor ones = rt_.alloc(freqs_bytes() / 2, TensorKind::temporary, OpKind::fill);     // ones_like
    freqs_cis_ = rt_.alloc(freqs_bytes(), TensorKind::other, OpKind::other);            // polar
  }
  empty.reset();
  rt_.ctx.module = Module::none;
}

Tensor DecoderModel::forward_titan(const Tensor& ids) {
  const uint64_t e = s_.elem, D = s_.d_model;
  rt_.ctx.module = Module::embedding;
  Tensor h = embedding_nn(rt_, rt_.param(embed_), ids, s_.rows() * D * e, D);
  // TransformerBlock.forward(x, freqs_cis): the layer's extra inputs in the hf row's
  // slots {mask, cache_position, cos, sin}: only the table.
  Inputs extra = {Tensor(), Tensor(), freqs_cis_, Tensor()};
  h = run_layers(rt_, static_cast<int32_t>(s_.layers), std::move(h), extra,
                 [this](int32_t l, const Tensor& in, const Inputs& ex) {
                   // step.compile_scope: block: torchtitan's apply_compile compiles each
                   // TransformerBlock (graph/compile.h; fully_shard wraps the compiled block).
                   return compile_region(
                       rt_, CompileScope::block, [&] { return layer(l, in, ex); }, l);
                 });
  extra.clear();
  h = norm(h, final_norm_, s_.rows(), D);
  rt_.ctx.module = Module::head;
  Tensor output = lm_linear(h, lm_head_, D, s_.vocab);
  h.reset();
  rt_.ctx.module = Module::none;
  return output;
}

Tensor DecoderModel::attention_titan(const LayerParams& p, const Tensor& x) {
  ModuleScope module_scope(rt_, Module::attention);
  const uint64_t e = s_.elem, B = s_.batch, H = s_.heads, S = s_.seq, hd = s_.head_dim();
  const uint64_t KV = static_cast<uint64_t>(s_.kv_heads), n_rep = H / KV;
  Tensor out;
  {
    Tensor xq = project(x, p, p.q);
    Tensor xk = project(x, p, p.k);
    Tensor xv = project(x, p, p.v);
    xq = view(rt_, xq, false);  // .view(bs, seqlen, -1, head_dim)
    xk = view(rt_, xk, false);
    xv = view(rt_, xv, false);
    {
      Tensor q_rot, k_rot;
      rope_complex_pair(rt_, xq, xk, freqs_cis_, freqs_bytes(), e, q_rot, k_rot);
      xq = std::move(q_rot);  // `xq, xk = apply_rotary_emb(...)`: the projections die
      xk = std::move(k_rot);
    }
    Tensor keys = xk, values = xv;
    if (n_rep > 1) {  // repeat_kv: reshape of the expanded (B,S,KV,n_rep,hd) copies unless KV == 1
      keys = KV > 1 ? expand_clone(rt_, xk, n_rep) : expand_view(rt_, xk, n_rep);
      values = KV > 1 ? expand_clone(rt_, xv, n_rep) : expand_view(rt_, xv, n_rep);
    }
    xq = view(rt_, xq, false);  // .transpose(1, 2): the kernel's grads come back in this layout
    xk = view(rt_, keys, false);
    xv = view(rt_, values, false);
    SdpaShape sh{B, H, S, hd, e};
    const double flops = 4.0 * B * H * S * S * hd;
    const bool flash = s_.attention == HfAttention::flash;
    Tensor o = run_region(rt_, RegionKind::core_attention, {xq, xk, xv},
                          [this, sh, flash, flops](const Inputs& in) {
                            return flash ? sdpa_flash(rt_, in[0], in[1], in[2], sh, flops)
                                         : sdpa_efficient(rt_, in[0], in[1], in[2], sh, flops);
                          });
    out = project(o, p, p.o);  // output.transpose(1, 2).contiguous() is the kernel's layout
  }  // Attention.forward's locals die
  return out;
}

Tensor DecoderModel::loss_titan(const Tensor& logits, const Tensor& labels) {
  ModuleScope module_scope(rt_, Module::loss);
  const uint64_t le = logits.bytes / (s_.rows() * s_.vocab);
  // pred.flatten(0, 1).float(): a copy for 16-bit logits, an argument of the call.
  Tensor ce;
  {
    Tensor pred = le == 4 ? logits : to_copy(rt_, logits, logits.bytes / le * 4);
    Tensor logp = log_softmax(rt_, pred);
    ce = nll_loss(rt_, logp, labels, 4);  // labels.flatten(0, 1): a view
  }
  // train.py wraps the loss in RescaleAccumulatedLoss: `loss / accumulation_steps`, a new
  // scalar even for one step.
  return div_scalar(rt_, ce);
}

// --- torchtune --------------------------------------------------------------------------

bool DecoderModel::tune() const { return arch().impl == ModelImpl::torchtune; }

void DecoderModel::construct_tune() {
  const uint64_t hd = s_.head_dim();
  const uint64_t ctx = static_cast<uint64_t>(s_.context_length);
  // The builder makes the RoPE module first: theta, then build_rope_cache's seq_idx,
  // idx_theta (einsum), cos and sin, their stack (the cache); the list dies after the
  // stack, the locals at return.
  rt_.ctx.module = Module::attention;
  rope_theta_ = rt_.alloc(hd / 2 * 4, TensorKind::other, OpKind::other);
  {
    Tensor seq_idx = rt_.alloc(ctx * 4, TensorKind::temporary, OpKind::arange);
    Tensor idx_theta = rt_.alloc(ctx * hd / 2 * 4, TensorKind::temporary, OpKind::other);
    {
      Tensor c = rt_.alloc(ctx * hd / 2 * 4, TensorKind::temporary, OpKind::other);
      Tensor sn = rt_.alloc(ctx * hd / 2 * 4, TensorKind::temporary, OpKind::other);
      rope_cache_ = rt_.alloc(ctx * hd * 4, TensorKind::other, OpKind::other);
    }
  }
  // Parameters in the module's registration order (model.parameters(), the optimizer's
  // order): tok_embeddings, layers (attn q/k/v/output_proj, mlp w1/w2/w3, sa_norm,
  // mlp_norm), norm, output. (The builder allocates the layers before tok_embeddings.)
  add_stack_parameters(kTuneNames);
  // The recipe's setup: ignore_labels_cache = torch.full((batch_size, 1), -100) on the
  // device, used by every step's label shift (counted with the batch).
  rt_.ctx.module = Module::loss;
  ignore_labels_ = rt_.alloc(s_.batch * 8, TensorKind::input, OpKind::fill);
  rt_.ctx.module = Module::none;
}

// torchtune's RMSNorm: x_fp32 = x.float(); (x_fp32 * rsqrt(x_fp32.pow(2).mean(-1, keepdim)
// + eps)).type_as(x) * scale. Unlike LlamaRMSNorm the mean is a temporary and, for 16-bit
// x, the fp32 product dies at its .type_as.
Tensor DecoderModel::tune_rms_norm(const Tensor& x, int32_t w, uint64_t rows) {
  ModuleScope module_scope(rt_, Module::norm);
  const uint64_t e = s_.elem;
  Tensor xf = e == 4 ? x : to_copy(rt_, x, x.bytes / e * 4);
  Tensor normed;
  {
    Tensor r;
    {
      Tensor m;
      {
        Tensor sq = pow2(rt_, xf);
        m = mean_dim(rt_, sq, rows * 4);
      }
      Tensor a = add_scalar(rt_, m);
      m.reset();
      r = rsqrt(rt_, a);
    }
    Tensor prod = mul(rt_, xf, r);
    normed = e == 4 ? prod : to_copy(rt_, prod, prod.bytes / 4 * e);
  }
  Tensor out = mul(rt_, normed, rt_.param(w), Broadcast::leading_dims, e);  // x_normed * scale
  return out;
}

Tensor DecoderModel::attention_tune(const LayerParams& p, const Tensor& x) {
  ModuleScope module_scope(rt_, Module::attention);
  const uint64_t e = s_.elem, B = s_.batch, H = s_.heads, S = s_.seq, hd = s_.head_dim();
  const uint64_t KV = static_cast<uint64_t>(s_.kv_heads), n_rep = H / KV;
  Tensor out;
  {
    Tensor q = project(x, p, p.q);
    q = view(rt_, q, false);         // .view(b, s, H, hd)
    q = rope_pairs(rt_, q, rope_cache_, e);
    q = view(rt_, q, false);         // .transpose(1, 2): the kernel's dq comes back in q's layout
    Tensor k = project(x, p, p.k);
    Tensor v = project(x, p, p.v);
    k = view(rt_, k, false);
    // v.view(...).transpose(1, 2): with a GQA copy the grad arrives through expand's
    // sum_to as (B,KV,S,hd), which the view's backward must copy back.
    v = view(rt_, v, KV > 1 && n_rep > 1);
    k = rope_pairs(rt_, k, rope_cache_, e);
    k = view(rt_, k, false);         // .transpose(1, 2)
    if (n_rep > 1) {  // unsqueeze(2).expand(...).flatten(1, 2): a copy unless KV == 1
      k = KV > 1 ? expand_clone(rt_, k, n_rep) : expand_view(rt_, k, n_rep);
      v = KV > 1 ? expand_clone(rt_, v, n_rep) : expand_view(rt_, v, n_rep);
    }
    SdpaShape sh{B, H, S, hd, e};
    const double flops = 4.0 * B * H * S * S * hd;
    const bool flash = s_.attention == HfAttention::flash;
    Tensor o = run_region(rt_, RegionKind::core_attention, {q, k, v},
                          [this, sh, flash, flops](const Inputs& in) {
                            return flash ? sdpa_flash(rt_, in[0], in[1], in[2], sh, flops)
                                         : sdpa_efficient(rt_, in[0], in[1], in[2], sh, flops);
                          });
    out = project(o, p, p.o);
  }
  return out;
}

Tensor DecoderModel::forward_tune(const Tensor& ids) {
  const uint64_t e = s_.elem, D = s_.d_model, V = s_.vocab;
  rt_.ctx.module = Module::embedding;
  Tensor h = embedding_nn(rt_, rt_.param(embed_), ids, s_.rows() * D * e, D);
  Inputs extra = {Tensor(), Tensor(), Tensor(), Tensor()};  // the RoPE module holds its cache
  h = run_layers(rt_, static_cast<int32_t>(s_.layers), std::move(h), extra,
                 [this](int32_t l, const Tensor& in, const Inputs& ex) {
                   // step.compile_scope: block: torchtune's compile_model compiles each
                   // TransformerSelfAttentionLayer in place (m.compile(); graph/compile.h).
                   return compile_region(
                       rt_, CompileScope::block, [&] { return layer(l, in, ex); }, l);
                 });
  extra.clear();
  h = norm(h, final_norm_, s_.rows(), D);
  // unembed: [self.output(chunk) for chunk in h.chunk(8, dim=1)]. torch.chunk's one
  // SplitBackward0 (a cat of the eight grads) is emitted as three levels of two-way
  // chunks (graph::Chunk2): the same views forward; backward, 2-way cats level by level.
  rt_.ctx.module = Module::head;
  constexpr int kChunks = 8;
  std::vector<Tensor> pieces = {h};
  while (static_cast<int>(pieces.size()) < kChunks) {
    std::vector<Tensor> next;
    for (const Tensor& t : pieces) {
      Chunk2 halves(rt_, t);
      next.push_back(halves.piece(rt_, 0));
      next.push_back(halves.piece(rt_, 1));
    }
    pieces = std::move(next);
  }
  h.reset();
  std::vector<Tensor> outs;
  const uint64_t rows = s_.rows() / kChunks;
  const double flops = 2.0 * static_cast<double>(rows) * D * V;
  // matmul(chunk, W.t()) (aten/src/ATen/native/LinearAlgebra.cpp should_fold): a 3-D
  // input times a weight that requires grad is folded to one mm even when that copies
  // it (a (B, S/8, D) slice is not viewable as 2-D when B > 1; the copy is saved); with a
  // frozen weight (LoRA: the output layer is not adapted) a non-viewable input is not
  // folded: bmm against the expanded weight, no copy (it saves the slice, a view of h).
  // Measured on the H200: tests/data/gpu/impl, impl_torchtune_bf16 (eight copies) and
  // impl_torchtune_lora_bf16 (none).
  // (Parameter::frozen is requires_grad=False; grad mode does not enter should_fold.)
  const bool fold_copies = s_.batch > 1 && !rt_.parameters()[lm_head_].frozen;
  for (Tensor& c : pieces) {
    // self.output(chunk): the module's weight is read (its FSDP2 pre-forward, when the
    // output is sharded by itself: sim/parallel/fsdp2.h) before the fold's copy.
    Tensor w = rt_.param(lm_head_);
    Tensor in = fold_copies ? clone(rt_, c) : c;
    c.reset();
    outs.push_back(mm_linear(rt_, in, w, rows * V * e, flops));
    // A frozen output (LoRA) has no AccumulateGrad to say where each call's backward runs:
    // the node names the parameter it reads, for the module's pre/post-backward hooks
    // (Runtime::run_node calls RuntimeHooks::param_used for it; torchtune's FSDP2 output
    // group, sim/parallel/fsdp2.h).
    if (rt_.parameters()[lm_head_].frozen && outs.back().grad_fn >= 0)
      rt_.node(outs.back().grad_fn).param = lm_head_;
  }
  pieces.clear();
  // `logits = model(...)` rebinds the loop's name: the previous output dies now.
  std::vector<Tensor> old = std::move(chunks_);
  chunks_ = std::move(outs);
  old.clear();
  rt_.ctx.module = Module::none;
  return chunks_.front();
}

// The recipe's label shift and CEWithChunkedOutputLoss(num_output_chunks=8), on the chunks
// the forward kept (this is the model's default loss call site; another loss would be
// wired here).
Tensor DecoderModel::loss_tune(const Tensor& labels) {
  ModuleScope module_scope(rt_, Module::loss);
  (void)labels;
  const uint64_t B = s_.batch, S = s_.seq, V = s_.vocab, n = chunks_.size();
  const uint64_t rows = s_.rows() / n;
  // labels = torch.hstack((labels[..., 1:], ignore_labels_cache[:B])): a new (B, S) int64.
  Tensor shifted = rt_.alloc(B * S * 8, TensorKind::temporary, OpKind::other);
  Tensor total_elements;
  {
    Tensor ne = rt_.alloc(B * S, TensorKind::temporary, OpKind::compare);  // labels != -100
    total_elements = rt_.alloc(8, TensorKind::temporary, OpKind::other);  // .sum()
  }
  std::vector<Tensor> targets;  // target_chunk.reshape(-1): a copy of each slice when B > 1
  for (uint64_t i = 0; i < n; ++i)
    targets.push_back(B > 1 ? rt_.alloc(rows * 8, TensorKind::temporary, OpKind::clone) : shifted);
  shifted.reset();  // `labels` is rebound to the list
  Tensor total;
  for (uint64_t i = 0; i < n; ++i) {
    const Tensor& logits = chunks_[i];
    const uint64_t le = logits.bytes / (rows * V);
    // compute_cross_entropy: F.cross_entropy(logits.float(), labels, reduction="sum").
    // With `compile: True` the recipe's training.compile_loss compiles this method alone
    // (torchtune a6290a5b torchtune/training/_compile.py): each chunk is its own graph
    // (CompileScope::loss; docs/compile.md "torchtune's code").
    const Tensor& target = targets[i];
    Tensor ce = compile_region(rt_, CompileScope::loss, [&] {
      Tensor x = le == 4 ? logits : to_copy(rt_, logits, logits.bytes / le * 4);
      Tensor logp = log_softmax(rt_, x);
      Tensor c = nll_loss(rt_, logp, target, 4);
      logp.reset();
      x.reset();
      return c;
    });
    // `total_loss += ...`: 0.0 + ce the first time (a new scalar), in place after; the
    // chunk's loss is a temporary of the statement.
    total = i == 0 ? add_scalar(rt_, ce) : add_(rt_, total, ce);
  }
  // total_loss / total_elements (an int64 scalar that needs no grad).
  Tensor out = div_scalar(rt_, total);
  total.reset();
  targets.clear();
  total_elements.reset();
  chunks_.clear();  // `del logits` follows in the recipe: nothing else holds the chunks
  return out;
}

}  // namespace memsim::graph
