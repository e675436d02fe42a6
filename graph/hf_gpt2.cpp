#include "graph/hf_gpt2.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "graph/autocast.h"
#include "graph/checkpoint.h"
#include "graph/numeric.h"
#include "graph/ops_nn.h"

namespace memsim::graph {

void HfGpt2Model::construct() {
  if (s_.attention != HfAttention::eager)
    throw std::runtime_error("hf-gpt2: only model.attention eager is modelled (GPT2Attention._attn)");
  const uint64_t e = s_.elem;
  const uint64_t D = s_.d_model, F = s_.d_ff, V = s_.vocab, P = s_.context_length;
  rt_.ctx.module = Module::embedding;
  wte_ = rt_.add_parameter(V * D * e, "transformer.wte.weight");
  wpe_ = rt_.add_parameter(P * D * e, "transformer.wpe.weight");
  rt_.parameters()[wte_].rows = V;  // shapes for Adafactor's factored state
  rt_.parameters()[wpe_].rows = P;
  layers_.resize(s_.layers);
  for (int32_t l = 0; l < s_.layers; ++l) {
    rt_.ctx.layer = l;
    LayerParams& p = layers_[l];
    const std::string pre = "transformer.h." + std::to_string(l) + ".";
    rt_.ctx.module = Module::norm;
    p.ln1_w = rt_.add_parameter(D * e, pre + "ln_1.weight");
    p.ln1_b = rt_.add_parameter(D * e, pre + "ln_1.bias");
    rt_.ctx.module = Module::attention;
    // GPT2Attention registers its buffers first: the (P, P) bool causal `bias` and the
    // 0-d `masked_bias`.
    // torch.tril(torch.ones((P, P), dtype=torch.bool)): the ones are a temporary.
    Tensor ones = new_tensor(rt_, P * P, OpKind::fill, TensorKind::temporary);
    numeric_hint(rt_, NumericHint::causal_tril);  // numeric mode only (graph/numeric.h)
    p.causal_bias = new_tensor(rt_, P * P, OpKind::fill, TensorKind::other);
    ones.reset();
    p.masked_bias = rt_.alloc(e, TensorKind::other, OpKind::fill);
    p.attn_w = lora_.add_base_weight(3 * D, D, pre + "attn.c_attn.weight", true);
    p.attn_b = rt_.add_parameter(3 * D * e, pre + "attn.c_attn.bias");
    p.aproj_w = lora_.add_base_weight(D, D, pre + "attn.c_proj.weight", true);
    p.aproj_b = rt_.add_parameter(D * e, pre + "attn.c_proj.bias");
    rt_.ctx.module = Module::norm;
    p.ln2_w = rt_.add_parameter(D * e, pre + "ln_2.weight");
    p.ln2_b = rt_.add_parameter(D * e, pre + "ln_2.bias");
    rt_.ctx.module = Module::mlp;
    p.fc_w = lora_.add_base_weight(F, D, pre + "mlp.c_fc.weight", true);
    p.fc_b = rt_.add_parameter(F * e, pre + "mlp.c_fc.bias");
    p.mproj_w = lora_.add_base_weight(D, F, pre + "mlp.c_proj.weight", true);
    p.mproj_b = rt_.add_parameter(D * e, pre + "mlp.c_proj.bias");
  }
  rt_.ctx.layer = -1;
  rt_.ctx.module = Module::norm;
  lnf_w_ = rt_.add_parameter(D * e, "transformer.ln_f.weight");
  lnf_b_ = rt_.add_parameter(D * e, "transformer.ln_f.bias");
  rt_.ctx.module = Module::head;
  if (!s_.tied) {
    lm_head_ = rt_.add_parameter(V * D * e, "lm_head.weight");
    rt_.parameters()[lm_head_].rows = V;
  }
  if (lora_.enabled()) {
    // get_peft_model: freeze the base model, then inject the adapters module by module.
    lora_.freeze_all();
    static const char* const kNames[kGpt2Linears] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                     "mlp.c_proj"};
    const uint64_t out[kGpt2Linears] = {3 * D, D, F, D};
    const uint64_t in[kGpt2Linears] = {D, D, D, F};
    for (int32_t l = 0; l < s_.layers; ++l) {
      rt_.ctx.layer = l;
      const std::string pre = "transformer.h." + std::to_string(l) + ".";
      for (uint32_t m = 0; m < kGpt2Linears; ++m) {
        if (!lora_.targets(m)) continue;
        rt_.ctx.module = m < kCFc ? Module::attention : Module::mlp;
        layers_[l].ad[m] = lora_.add_adapter(out[m], in[m], pre + kNames[m]);
      }
    }
    rt_.ctx.layer = -1;
  }
  rt_.ctx.module = Module::none;  // tied: lm_head.weight is wte, no parameter of its own
}

bool HfGpt2Model::autocast_on() const { return ac_ != nullptr && ac_->active(); }
uint64_t HfGpt2Model::act_elem() const { return autocast_on() ? ac_->low_elem() : s_.elem; }

// Conv1D: x.view(-1, in) (a view of a contiguous tensor), addmm(bias, x2d, W), view back.
// Under QLoRA, Linear4bit: matmul_4bit with the bias fused into the linear.
Tensor HfGpt2Model::conv1d(const Tensor& x, int32_t w, int32_t b, int64_t d_in, int64_t d_out,
                           const LoraAdapter& ad) {
  Tensor base;
  if (autocast_on()) {  // no LoRA under autocast (refused)
    const double flops = 2.0 * static_cast<double>(s_.rows()) * d_in * d_out;
    return ac_->addmm(x, w, b, static_cast<int64_t>(s_.rows()), d_in, d_out, flops);
  }
  if (lora_.quantized()) {
    base = lora_.base_linear(x, w, d_in, d_out);
  } else {
    Tensor wt = rt_.param(w), bt = rt_.param(b);
    const double flops = 2.0 * static_cast<double>(s_.rows()) * d_in * d_out;
    base = addmm_bias(rt_, bt, x, wt, s_.rows() * d_out * s_.elem, flops);
  }
  return lora_.add_adapter_path(x, std::move(base), ad, d_in, d_out);
}

Tensor HfGpt2Model::ln(const Tensor& x, int32_t w, int32_t b) {
  const Module outer = rt_.ctx.module;
  rt_.ctx.module = Module::norm;
  Tensor wt = rt_.param(w), bt = rt_.param(b);
  Tensor out = layer_norm(rt_, x, wt, bt, s_.rows());
  rt_.ctx.module = outer;
  return out;
}

// nn.Dropout: p == 0 returns its input (no op at all); otherwise native_dropout.
Tensor HfGpt2Model::drop(const Tensor& x) {
  if (s_.dropout <= 0.0) return x;
  return native_dropout(rt_, x, s_.elem);
}

// NewGELUActivation: 0.5 * x * (1.0 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3.0)))).
// CPython evaluates `0.5 * x` first and frees each temporary after its consumer.
Tensor HfGpt2Model::gelu_new(const Tensor& x) {
  numeric_hint(rt_, NumericHint::scalar, 0.5);
  Tensor half = mul_scalar(rt_, x);
  numeric_hint(rt_, NumericHint::cube);
  Tensor cube = pow2(rt_, x);  // pow.Tensor_Scalar: saves x; same backward as e = 2
  numeric_hint(rt_, NumericHint::scalar, 0.044715);
  Tensor c = mul_scalar(rt_, cube);
  cube.reset();
  Tensor inner = add(rt_, x, c);
  c.reset();
  numeric_hint(rt_, NumericHint::scalar, std::sqrt(2.0 / M_PI));
  Tensor scaled = mul_scalar(rt_, inner);
  inner.reset();
  Tensor t = tanh(rt_, scaled);
  scaled.reset();
  numeric_hint(rt_, NumericHint::scalar, 1.0);
  Tensor one_plus = add_scalar(rt_, t);
  t.reset();
  Tensor out = mul(rt_, half, one_plus);
  return out;
}

// NewGELUActivation under autocast on a low-precision x: `0.5 * x` stays low; pow is on
// CUDA's fp32 list (an fp32 copy of x, saved by PowBackward0); `x + 0.044715 * pow`
// promotes to fp32, and so does everything after it: the output is fp32.
Tensor HfGpt2Model::gelu_new_autocast(const Tensor& x) {
  const uint64_t f32 = x.bytes / ac_->low_elem() * 4;
  Tensor half = mul_scalar(rt_, x);
  Tensor cube;
  {
    Tensor xf = ac_->to_fp32(x, f32);
    cube = pow2(rt_, xf);
  }
  Tensor c = mul_scalar(rt_, cube);
  cube.reset();
  Tensor inner = add(rt_, ac_->widen(x), c);
  Autocast::promoted(rt_, inner, 0, x);
  c.reset();
  Tensor scaled = mul_scalar(rt_, inner);
  inner.reset();
  Tensor t = tanh(rt_, scaled);
  scaled.reset();
  Tensor one_plus = add_scalar(rt_, t);
  t.reset();
  Tensor out = mul(rt_, ac_->widen(half), one_plus);
  Autocast::promoted(rt_, out, 0, half);
  return out;
}

// GPT2Attention._attn: returns attn_output, and its attn_weights (the dropout output)
// through `weights`.
Tensor HfGpt2Model::attn_core(const LayerParams& p, const Tensor& q, const Tensor& k,
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
  Tensor w2 = where_tensor(rt_, p.causal_bias, w1, e);
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

Tensor HfGpt2Model::attention(const LayerParams& p, const Tensor& x) {
  const Module outer = rt_.ctx.module;
  rt_.ctx.module = Module::attention;
  const int64_t D = s_.d_model;
  Tensor out;
  {
    Tensor qkv = conv1d(x, p.attn_w, p.attn_b, D, 3 * D, p.ad[kCAttn]);
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
          Tensor o = attn_core(layers_[layer], in[0], in[1], in[2], weights);
          if (!stored || !rt_.recomputing) *keep = std::move(weights);
          return o;
        });
    // _merge_heads: permute(0, 2, 1, 3).contiguous() copies; view.
    numeric_hint(rt_, NumericHint::merge_heads);
    Tensor merged = clone(rt_, attn_output);
    attn_output.reset();
    out = conv1d(merged, p.aproj_w, p.aproj_b, D, D, p.ad[kAttnCProj]);
    merged.reset();
    out = drop(out);
  }  // q, k, v, the projection and attn_weights die with GPT2Attention.forward
  rt_.ctx.module = outer;
  return out;
}

Tensor HfGpt2Model::mlp(const LayerParams& p, const Tensor& x) {
  const Module outer = rt_.ctx.module;
  rt_.ctx.module = Module::mlp;
  Tensor h = conv1d(x, p.fc_w, p.fc_b, s_.d_model, s_.d_ff, p.ad[kCFc]);
  h = autocast_on() ? gelu_new_autocast(h) : gelu_new(h);
  h = conv1d(h, p.mproj_w, p.mproj_b, s_.d_ff, s_.d_model, p.ad[kMlpCProj]);
  h = drop(h);
  rt_.ctx.module = outer;
  return h;
}

// GPT2Block.forward: pre-norm residual blocks. The two halves are candidate checkpoint
// regions (graph/checkpoint.h); their lambdas capture values only (a checkpointed half
// is re-run during backward).
Tensor HfGpt2Model::block(int32_t layer, const Tensor& x) {
  const int32_t outer = rt_.ctx.layer;
  rt_.ctx.layer = layer;
  Tensor attn_output = run_region(rt_, RegionKind::attention, {x}, [this, layer](const Inputs& in) {
    const LayerParams& p = layers_[layer];
    Tensor h1 = ln(in[0], p.ln1_w, p.ln1_b);
    return attention(p, h1);
  });
  // Under autocast the branch outputs are low precision: the fp32 residual promotes.
  Tensor r1 = autocast_on() ? add(rt_, ac_->widen(attn_output), x) : add(rt_, attn_output, x);
  if (autocast_on()) Autocast::promoted(rt_, r1, 0, attn_output);
  Tensor ff = run_region(rt_, RegionKind::mlp, {r1}, [this, layer](const Inputs& in) {
    const LayerParams& p = layers_[layer];
    Tensor h2 = ln(in[0], p.ln2_w, p.ln2_b);
    return mlp(p, h2);
  });
  Tensor out = autocast_on() ? add(rt_, r1, ac_->widen(ff)) : add(rt_, r1, ff);
  if (autocast_on()) Autocast::promoted(rt_, out, 1, ff);
  attn_output.reset();
  ff.reset();
  r1.reset();
  rt_.ctx.layer = outer;
  return out;
}

Tensor HfGpt2Model::forward(const Tensor& ids) {
  const uint64_t e = s_.elem, D = s_.d_model, S = s_.seq;
  rt_.ctx.module = Module::embedding;
  Tensor wte_w, head_w;
  if (s_.tied) {
    TiedWeight wte(rt_, rt_.param(wte_));
    wte_w = wte.use(1);
    head_w = wte.use(0);
    // Under autocast lm_head's grad reaches wte as a fresh fp32 copy (the cast's
    // backward), which the engine's InputBuffer then owns alone: PyTorch 2.x adds the
    // embedding's grad into it in place.
    if (autocast_on() && head_w.grad_fn >= 0) rt_.node(head_w.grad_fn).flags |= kTiedSumInPlace;
  } else {
    wte_w = rt_.param(wte_);
    head_w = rt_.param(lm_head_);
  }
  Tensor hidden;
  {
    Tensor position_ids = new_tensor(rt_, S * 8, OpKind::arange);
    Tensor inputs_embeds = embedding_nn(rt_, wte_w, ids, s_.rows() * D * e, D);
    Tensor position_embeds = embedding_nn(rt_, rt_.param(wpe_), position_ids, S * D * e, D);
    Tensor h = add_bcast(rt_, inputs_embeds, position_embeds);
    h = drop(h);
    // The block loop; with gradient checkpointing HF calls
    // checkpoint(block.__call__, hidden_states, None, attention_mask (None), ...).
    h = run_layers(rt_, static_cast<int32_t>(s_.layers), h, {},
                   [this](int32_t l, const Tensor& in, const Inputs&) { return block(l, in); });
    rt_.ctx.module = Module::norm;
    hidden = ln(h, lnf_w_, lnf_b_);
  }  // GPT2Model.forward returns: its locals (embeddings, position ids) die
  rt_.ctx.module = Module::head;
  const double flops = 2.0 * static_cast<double>(s_.rows()) * D * s_.vocab;
  Tensor logits;
  if (autocast_on()) {  // F.linear casts W (cached; the tied handle), then x
    const int32_t w = s_.tied ? wte_ : lm_head_;
    Tensor wc = ac_->weight(w, /*grad_transposed=*/false, &head_w);
    const uint64_t low_in = s_.rows() * D * ac_->low_elem();
    Tensor xc = hidden.bytes == low_in ? hidden : ac_->cast(hidden, low_in);
    logits = mm_linear(rt_, xc, wc, s_.rows() * s_.vocab * ac_->low_elem(), flops);
  } else {
    logits = mm_linear(rt_, hidden, head_w, s_.rows() * s_.vocab * e, flops);
  }
  hidden.reset();
  rt_.ctx.module = Module::none;
  return logits;
}

Tensor HfGpt2Model::loss(const Tensor& logits, const Tensor& labels) {
  const Module outer = rt_.ctx.module;
  rt_.ctx.module = Module::loss;
  const uint64_t shifted_rows = static_cast<uint64_t>(s_.batch * (s_.seq - 1));
  // The logits' element size: low precision under autocast (also when the loss runs
  // outside the region: precision.autocast_region forward).
  const uint64_t e = logits.bytes / (s_.rows() * s_.vocab);
  Tensor shift_logits;
  {
    Tensor sl = slice_seq(rt_, logits, shifted_rows * s_.vocab * e);
    numeric_hint(rt_, NumericHint::shift_logits);
    shift_logits = clone(rt_, sl);  // .contiguous()
  }
  numeric_hint(rt_, NumericHint::shift_labels, labels);  // labels[..., 1:].contiguous()
  Tensor shift_labels = new_tensor(rt_, shifted_rows * 8, OpKind::clone, TensorKind::temporary);
  Tensor out;
  if (autocast_on()) {
    out = torch_cross_entropy_autocast(*ac_, rt_, shift_logits, shift_labels);
  } else {
    Tensor logp = log_softmax(rt_, shift_logits);
    out = nll_loss(rt_, logp, shift_labels, e);
  }
  rt_.ctx.module = outer;
  return out;
}

}  // namespace memsim::graph
