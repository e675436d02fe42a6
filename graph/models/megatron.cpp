#include "graph/models/megatron.h"

#include "graph/checkpoint.h"
#include "graph/numeric/numeric.h"
#include "graph/ops/megatron_global_buffer.h"
#include "graph/ops/ops.h"
#include "graph/ops/ops_megatron_arch.h"

namespace memsim::graph {

int64_t megatron_parameter_count(const MegatronShape& s) {
  const int64_t h = s.hidden, f = s.ffn, bias = s.bias ? 1 : 0, t = s.tensor;
  // QKV of h + 2 * groups * head_dim columns (3h for MHA), fc1 of 2f with --swiglu.
  const int64_t qkv = s.qkv_width(), f1 = s.fc1_width(f), qkv_bias = s.qkv_bias() ? 1 : 0;
  const int64_t per_layer = (qkv * h + h * h + f1 * h + h * f) / t  // QKV, dense, fc1, fc2 weights
                            + qkv_bias * qkv / t                    // the QKV bias
                            + bias * (h + f1 / t + h)   // proj, fc1, fc2 biases (row-parallel: full)
                            + 4 * h;                    // two LayerNorms
  const int64_t word = s.padded_vocab() / t * h;
  int64_t n = s.layers * per_layer;
  if (s.moe.enabled()) {
    // A MoE layer (graph/models/megatron_moe.cpp) replaces the MLP's fc1 / fc2: the router
    // (E x h, replicated, plus E bias), this rank's E/EP experts (fc1 columns and fc2 rows
    // split over ETP, fc2's bias whole: no bias with ETP > 1 in Megatron) and the shared
    // experts (tensor-parallel like the MLP).
    const int64_t E = s.moe.spec.experts, F = s.moe.expert_ffn(), S = s.moe.spec.shared_d_ff;
    const int64_t F1 = s.fc1_width(F), S1 = s.fc1_width(S);
    const int64_t dense_mlp = (f1 * h + h * f) / t + bias * (f1 / t + h);
    const int64_t moe_mlp = E * h + bias * E + s.moe.local_experts() * ((F1 + F) * h + bias * (F1 + h)) +
                            (S > 0 ? (S1 * h + h * S) / t + bias * (S1 / t + h) : 0);
    for (int64_t l = 0; l < s.layers; ++l)
      if (s.layer_is_moe(l)) n += moe_mlp - dense_mlp;
  }
  if (s.pre_process) n += word + s.max_positions * h;
  if (s.post_process) n += 2 * h + (s.pre_process && s.tied ? 0 : word);
  return n;
}

MegatronLayerBytes megatron_layer_saved_bytes(const MegatronShape& s) {
  const uint64_t sbh = static_cast<uint64_t>(s.seq * s.batch * s.hidden);
  const uint64_t t = static_cast<uint64_t>(s.tensor);
  const uint64_t as2b = static_cast<uint64_t>(s.heads / s.tensor * s.seq * s.seq * s.batch);
  const uint64_t e = s.elem, mask = s.dropout ? 1 : 0;
  MegatronLayerBytes r;
  // 16 sbh-sized 16-bit tensors plus two 1-byte masks (34 sbh for e = 2); eager adds the
  // softmax output, the dropout output and its mask (5 as^2 b). With tensor parallel t
  // (Korthikanti Table 2, sbh(10 + 24/t + 5as/(ht))): the two LayerNorm inputs, the two
  // LayerNorm outputs (QKV and fc1 inputs) and the two dropout masks stay full (5 tensors
  // + 2 masks = 10 sbh); Q, K, V, the projection input, the fc1 output and the GeLU
  // output are split (12 tensors = 24 sbh / t), and so are the heads.
  r.korthikanti = sbh * (4 * e + 2 * mask) + sbh * 12 * e / t;
  // With sequence parallel (Table 2: sbh(34/t + 5as/(ht))) the full ones are split too.
  if (s.sequence_parallel) r.korthikanti = sbh * (16 * e + 2 * mask) / t;
  if (!s.flash) r.korthikanti += as2b * (e + mask * (e + 1));
  r.norm_stats = 2 * 2 * 4 * static_cast<uint64_t>(s.seq * s.batch) / (s.sequence_parallel ? t : 1);
  if (s.flash)
    r.flash_extras =
        4 * static_cast<uint64_t>(s.heads / s.tensor * s.seq * s.batch) + (s.dropout ? 16 : 0);
  return r;
}

void MegatronModel::use_global_buffer(uint64_t bytes) {
  global_buffer_get(rt_, global_buffer(), bytes);  // the view dies at once
}

int32_t MegatronModel::param(uint64_t elems, const std::string& name, bool decay) {
  const int32_t id = rt_.add_parameter(elems * s_.elem, name);
  params_.push_back(id);
  decayed_.push_back(decay);
  expert_.push_back(false);
  return id;
}

void MegatronModel::construct() {
  const uint64_t h = s_.hidden, f = s_.ffn, t = tp();
  rt_.ctx.layer = -1;
  rt_.ctx.module = Module::embedding;
  // VocabParallelEmbedding: this rank's rows of the padded vocabulary.
  if (s_.pre_process) {
    word_ = param(static_cast<uint64_t>(s_.padded_vocab()) / t * h,
                  "embedding.word_embeddings.weight", true);
    pos_ = param(s_.max_positions * h, "embedding.position_embeddings.weight", true);
  }
  ids_.assign(static_cast<size_t>(s_.layers), LayerIds{});
  for (int32_t l = 0; l < s_.layers; ++l) {
    rt_.ctx.layer = l;
    LayerIds& id = ids_[static_cast<size_t>(l)];
    const std::string pre = "decoder.layers." + std::to_string(l) + ".";
    rt_.ctx.module = Module::norm;
    id.ln1 = param(h, pre + "input_layernorm.weight", false);
    param(h, pre + "input_layernorm.bias", false);
    rt_.ctx.module = Module::attention;
    const uint64_t qkv = static_cast<uint64_t>(s_.qkv_width());  // 3h for MHA
    id.qkv = param(qkv * h / t, pre + "self_attention.linear_qkv.weight", true);
    if (s_.qkv_bias()) id.qkv_b = param(qkv / t, pre + "self_attention.linear_qkv.bias", false);
    id.proj = param(h * h / t, pre + "self_attention.linear_proj.weight", true);
    if (s_.bias) id.proj_b = param(h, pre + "self_attention.linear_proj.bias", false);
    rt_.ctx.module = Module::norm;
    id.ln2 = param(h, pre + "pre_mlp_layernorm.weight", false);
    param(h, pre + "pre_mlp_layernorm.bias", false);
    rt_.ctx.module = Module::mlp;
    if (s_.layer_is_moe(l)) {
      construct_moe(l, pre);  // graph/models/megatron_moe.cpp
      continue;
    }
    const uint64_t f1 = static_cast<uint64_t>(s_.fc1_width(s_.ffn));  // [gate, up] with --swiglu
    id.fc1 = param(f1 * h / t, pre + "mlp.linear_fc1.weight", true);
    if (s_.bias) id.fc1_b = param(f1 / t, pre + "mlp.linear_fc1.bias", false);
    id.fc2 = param(h * f / t, pre + "mlp.linear_fc2.weight", true);
    if (s_.bias) id.fc2_b = param(h, pre + "mlp.linear_fc2.bias", false);
  }
  rt_.ctx.layer = -1;
  if (s_.post_process) {
    rt_.ctx.module = Module::norm;
    final_ln_ = param(h, "decoder.final_layernorm.weight", false);
    param(h, "decoder.final_layernorm.bias", false);
    if (!s_.pre_process || !s_.tied) {
      // The untied output layer's weight, or the last pipeline stage's copy of the word
      // embedding for the tied one.
      rt_.ctx.module = Module::head;
      output_ = param(static_cast<uint64_t>(s_.padded_vocab()) / t * h, "output_layer.weight",
                      true);
    }
  }
  rt_.ctx.module = Module::none;
}

// DotProductAttention (local spec) or TE fused attention on the packed QKV output.
// `mixed` is the QKV output (flash), or unused when q, k, v are given (eager).
Tensor MegatronModel::core_attention(const Inputs& in) {
  // This rank's heads (np = a / t); the context is [s, b, h / t].
  const uint64_t b = s_.batch, a = s_.heads / tp(), s = s_.seq, e = s_.elem;
  const double hd = static_cast<double>(s_.hidden / s_.heads);
  const double attn_flops = 2.0 * static_cast<double>(b * a * s * s) * hd;  // per GEMM
  if (s_.flash) {
    return fused_attention(rt_, in[0], act() / tp(), b * a * s * 4, rows() * s_.hidden / tp() * 4,
                           s_.dropout, 2 * attn_flops);
  }
  const Tensor& q = in[0];
  const Tensor& k = in[1];
  const Tensor& v = in[2];
  use_global_buffer(b * a * s * s * e);  // the baddbmm input
  // matmul_result (and its attention_scores view) stay bound until forward returns.
  Tensor scores = baddbmm_qk(rt_, q, k, b * a * s * s * e, attn_flops);
  Tensor probs = fused_causal_softmax(rt_, scores);
  probs = dropout(rt_, probs, b * a * s * s, s_.dropout);
  numeric_hint(rt_, NumericHint::megatron_v);  // numeric mode only (graph/numeric/numeric.h)
  Tensor context = bmm(rt_, probs, v, act() / tp(), attn_flops);
  // [b, np, sq, hn] -> [sq, b, np, hn]: permute(...).contiguous(), a copy; the bmm
  // result dies when the name is rebound.
  numeric_hint(rt_, NumericHint::merge_heads);
  context = clone(rt_, context);
  return context;
}

// TE fused attention with grouped-query attention: the query copy, the key / value views of
// the QKV output (graph/ops/ops_megatron_arch.h). Megatron-Core d98e8a64 attention.py.
Tensor MegatronModel::core_attention_gqa(const Inputs& in) {
  const uint64_t b = s_.batch, a = s_.heads / tp(), s = s_.seq;
  const double hd = static_cast<double>(s_.hidden / s_.heads);
  const double attn_flops = 2.0 * static_cast<double>(b * a * s * s) * hd;  // per GEMM
  return fused_attention_gqa(rt_, in[0], in[1], act() / tp(), b * a * s * 4,
                             rows() * s_.hidden / tp() * 4, s_.dropout, 2 * attn_flops);
}

Tensor MegatronModel::attention(const Tensor& ln_out, const Tensor& attention_mask) {
  ModuleScope module_scope(rt_, Module::attention);
  const uint64_t h = s_.hidden, e = s_.elem, t = tp();
  const double r = static_cast<double>(rows()), hd = static_cast<double>(h);
  const double td = static_cast<double>(t);
  const LayerIds& id = ids_[static_cast<size_t>(rt_.ctx.layer)];
  // ColumnParallelLinear: this rank's 3h/t output columns.
  numeric_param_hint(rt_, id.qkv, id.qkv_b);
  // [s, b, (np + 2 ng) hn / t]: 3h/t columns for MHA, fewer with grouped-query attention.
  const uint64_t width = static_cast<uint64_t>(s_.qkv_width());
  Tensor mixed = megatron_linear(rt_, ln_out,
                                 {rows() * width * e / t, width * h * e / t, s_.qkv_bias() ? width * e / t : 0,
                                  s_.gqa() ? 2 * r * hd * static_cast<double>(width) / td
                                           : 2 * r * hd * 3 * hd / td,
                                  sp_gather(), 0, id.qkv});
  // Selective recomputation checkpoints exactly core_attention(q, k, v, attention_mask)
  // (tensor_parallel.checkpoint in _checkpointed_attention_forward).
  Tensor context;
  if (s_.gqa()) {
    // get_query_key_value_tensors: split views of [s, b, ng, (np/ng + 2) hn]; the query's
    // reshape to [s, b, np, hn] is a copy when this rank has more than one query group (the
    // group stride skips the keys and values), a view with one (tests/data/megatron_gqa, a
    // torch CPU fixture; graph/ops/ops_megatron_arch.h).
    const bool copy = s_.groups() / s_.tensor > 1;
    Tensor query = copy ? gqa_query_copy(rt_, mixed, act() / t) : rt_.view_of(mixed, act() / t);
    context = run_region(rt_, RegionKind::core_attention, {query, mixed, attention_mask},
                         [this](const Inputs& in) { return core_attention_gqa(in); });
  } else if (s_.flash) {
    context = run_region(rt_, RegionKind::core_attention, {mixed, attention_mask},
                         [this](const Inputs& in) { return core_attention(in); });
  } else {
    QkvViews qkv = qkv_split(rt_, mixed);
    context = run_region(rt_, RegionKind::core_attention, {qkv.q, qkv.k, qkv.v, attention_mask},
                         [this](const Inputs& in) { return core_attention(in); });
  }
  mixed.reset();
  // linear_proj: RowParallelLinear, skip_bias_add (its bias goes to bias-dropout-add);
  // the partial [s, b, h] output is all-reduced in place.
  numeric_param_hint(rt_, id.proj);
  Tensor out = megatron_linear(
      rt_, context, {act(), h * h * e / t, 0, 2 * r * hd * hd / td, 0, sp_scatter(act()), id.proj});
  return out;
}

// MLP with bias-GeLU fusion up to linear_fc2 (its bias goes to bias-dropout-add).
Tensor MegatronModel::mlp(const Tensor& ln_out) {
  rt_.ctx.module = Module::mlp;
  if (s_.moe.enabled()) {  // Megatron-Core MoE model (graph/models/megatron_moe.cpp)
    if (s_.layer_is_moe(rt_.ctx.layer)) return moe(ln_out);
    const LayerIds& lid = ids_[static_cast<size_t>(rt_.ctx.layer)];
    return mlp_unfused(ln_out, static_cast<uint64_t>(s_.ffn), lid.fc1, lid.fc2, true);
  }
  const uint64_t h = s_.hidden, f = s_.ffn / tp(), e = s_.elem;  // f: this rank's columns
  const double r = static_cast<double>(rows());
  const double flops = 2 * r * static_cast<double>(h) * static_cast<double>(f);
  const LayerIds& id = ids_[static_cast<size_t>(rt_.ctx.layer)];
  numeric_param_hint(rt_, id.fc1);
  if (s_.swiglu) {
    // fc1 [s, b, 2f] ([gate, up]); bias_swiglu_impl (bias_activation_fusion, on by default
    // with --swiglu): SwiGLUFunction / BiasSwiGLUFunction save fc1's output (and bias).
    Tensor gated = megatron_linear(rt_, ln_out, {rows() * 2 * f * e, 2 * f * h * e, 0, 2 * flops, sp_gather(), 0, id.fc1});
    gated = fused_swiglu(rt_, gated, s_.bias ? 2 * f * e : 0);
    return megatron_linear(rt_, gated, {act(), h * f * e, 0, flops, 0, sp_scatter(act()), id.fc2});
  }
  Tensor inter = megatron_linear(rt_, ln_out, {rows() * f * e, f * h * e, 0, flops, sp_gather(), 0, id.fc1});
  numeric_param_hint(rt_, -1, id.fc1_b);
  // Without biases Megatron turns bias_gelu_fusion off and runs F.gelu: the same memory
  // (saves its input, one input-sized grad).
  inter = bias_gelu(rt_, inter, s_.bias ? f * e : 0);
  numeric_param_hint(rt_, id.fc2);
  return megatron_linear(rt_, inter, {act(), h * f * e, 0, flops, 0, sp_scatter(act()), id.fc2});
}

Tensor MegatronModel::layer(int32_t index, const Tensor& x, const Tensor& attention_mask) {
  LayerScope layer_scope(rt_, index);
  const uint64_t h = s_.hidden, e = s_.elem;
  // The attention half (input_layernorm + self_attention) and the MLP half
  // (pre_mlp_layernorm + mlp) are candidate checkpoint regions (graph/checkpoint.h); the
  // bias-dropout-adds stay outside. Unless a half is itself checkpointed (then its norm
  // output is a local of the checkpointed function), the layer frame keeps the norm
  // output bound until it returns, as TransformerLayer.forward does: the lambda, run at
  // once and never stored in that case, hands it out through `keep`.
  CheckpointEngine* engine = rt_.checkpoint;
  Tensor ln1;
  Tensor* keep1 = engine && engine->wants(RegionKind::attention, index) ? nullptr : &ln1;
  Tensor attn_out = run_region(rt_, RegionKind::attention, {x, attention_mask},
                               [this, keep1, index](const Inputs& in) {
                                 rt_.ctx.module = Module::norm;
                                 const LayerIds& id = ids_[static_cast<size_t>(index)];
                                 numeric_param_hint(rt_, id.ln1, id.ln1 + 1);
                                 Tensor ln = fused_layer_norm(rt_, in[0], rows_sp(), s_.hidden, s_.elem);
                                 Tensor out = attention(ln, in[1]);
                                 if (keep1 != nullptr) *keep1 = std::move(ln);
                                 return out;
                               });
  rt_.ctx.module = Module::attention;
  const LayerIds& id = ids_[static_cast<size_t>(index)];
  numeric_param_hint(rt_, -1, id.proj_b);
  Tensor hidden = bias_dropout_add(rt_, attn_out, x, rows_sp() * h, s_.bias ? h * e : 0,
                                   s_.dropout);
  Tensor ln2;
  Tensor* keep2 = engine && engine->wants(RegionKind::mlp, index) ? nullptr : &ln2;
  // mlp_output_with_bias stays bound until the layer returns.
  Tensor fc2_out = run_region(rt_, RegionKind::mlp, {hidden}, [this, keep2, index](const Inputs& in) {
    rt_.ctx.module = Module::norm;
    const LayerIds& lid = ids_[static_cast<size_t>(index)];
    numeric_param_hint(rt_, lid.ln2, lid.ln2 + 1);
    Tensor ln = fused_layer_norm(rt_, in[0], rows_sp(), s_.hidden, s_.elem);
    Tensor out = mlp(ln);
    if (keep2 != nullptr) *keep2 = std::move(ln);
    return out;
  });
  rt_.ctx.module = Module::mlp;
  numeric_param_hint(rt_, -1, id.fc2_b);
  // A MoE layer returns no bias (mlp_bias None): the bias-dropout-add has none to add.
  const bool mlp_bias = s_.bias && !s_.layer_is_moe(index);
  Tensor out = bias_dropout_add(rt_, fc2_out, hidden, rows_sp() * h, mlp_bias ? h * e : 0,
                                s_.dropout);
  rt_.ctx.module = Module::none;
  layer_scope.restore();
  return out;  // ln1, attn_out, hidden, ln2, fc2_out die with the frame, in the caller's layer
}

Tensor MegatronModel::forward(const Tensor& tokens, const Tensor& position_ids,
                              const Tensor& attention_mask) {
  // GPTModel.forward keeps decoder_input bound until it returns.
  Tensor embedded = embed(tokens, position_ids);
  return head(decoder(embedded, attention_mask));
}

Tensor MegatronModel::embed(const Tensor& tokens, const Tensor& position_ids) {
  const uint64_t h = s_.hidden, e = s_.elem;
  rt_.ctx.layer = -1;
  rt_.ctx.module = Module::embedding;
  Tensor embedded;
  {
    // VocabParallelEmbedding: a full [b, s, h] output (masked lookup, then all-reduce).
    const uint64_t local_vocab = static_cast<uint64_t>(s_.padded_vocab()) / tp();
    numeric_param_hint(rt_, word_);
    Tensor word = megatron_embedding(rt_, tokens, act(), local_vocab * h * e, true);
    numeric_param_hint(rt_, pos_);
    Tensor pos = megatron_embedding(rt_, position_ids, act(), s_.max_positions * h * e, true);
    Tensor sum = add(rt_, word, pos);
    embedded = clone(rt_, sum);  // transpose(0, 1).contiguous() -> [s, b, h]
    sum.reset();
    if (s_.sequence_parallel) {
      // scatter_to_sequence_parallel_region, then .clone() (clone_scatter_output_in_embedding).
      embedded = sequence_scatter(rt_, embedded, act() / tp());
      embedded = clone(rt_, embedded);
    }
    embedded = dropout(rt_, embedded, rows_sp() * h, s_.dropout);
  }
  return embedded;
}

Tensor MegatronModel::decoder(const Tensor& input, const Tensor& attention_mask) {
  // The decoder loop rebinds hidden_states. TransformerBlock: the layer loop, or
  // _checkpointed_forward with full recomputation (tensor_parallel.checkpoint(custom(l,
  // l + n), False, hidden_states, attention_mask, ...): the chunk's inputs are saved).
  return run_layers(rt_, static_cast<int32_t>(s_.layers), input, {attention_mask},
                    [this](int32_t l, const Tensor& in, const Inputs& extra) {
                      return layer(l, in, extra[0]);
                    });
}

Tensor MegatronModel::head(Tensor hidden) {
  const uint64_t h = s_.hidden, e = s_.elem;
  rt_.ctx.layer = -1;
  rt_.ctx.module = Module::norm;
  numeric_param_hint(rt_, final_ln_, final_ln_ + 1);
  Tensor final_ln = fused_layer_norm(rt_, hidden, rows_sp(), h, e);
  hidden.reset();
  rt_.ctx.module = Module::head;
  // Output layer tied to the word embedding (its wgrad also goes to that main_grad), or
  // its own weight (untied, or the last stage's shared copy).
  // Column-parallel over the padded vocabulary: this rank's V/t logits.
  const uint64_t local_vocab = static_cast<uint64_t>(s_.padded_vocab()) / tp();
  numeric_param_hint(rt_, output_ >= 0 ? output_ : word_);
  Tensor logits = megatron_linear(
      rt_, final_ln,
      {rows() * local_vocab * e, local_vocab * h * e, 0,
       2.0 * static_cast<double>(rows()) * static_cast<double>(h) *
           static_cast<double>(local_vocab),
       sp_gather(), 0, output_ >= 0 ? output_ : word_});
  rt_.ctx.module = Module::none;
  return logits;
}

Tensor MegatronModel::language_model_loss(const Tensor& logits, const Tensor& labels) {
  ModuleScope module_scope(rt_, Module::loss);
  Tensor labels_t = rt_.alloc(labels.bytes, TensorKind::input, OpKind::clone);
  numeric_hint(rt_, NumericHint::labels, labels);  // rows kept in [b, s] order numerically
  Tensor loss = vocab_parallel_cross_entropy(
      rt_, logits, rows(), static_cast<uint64_t>(s_.padded_vocab()) / tp());
  labels_t.reset();
  loss = clone(rt_, loss);  // transpose(0, 1).contiguous() -> [b, s]
  return loss;
}

}  // namespace memsim::graph
