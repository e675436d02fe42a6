// DecoderModel's shared modules (graph/models/decoder.h): projections, norms, MLPs and their
// activations, dropout, soft-capping.
#include <cmath>

#include "graph/autocast.h"
#include "graph/models/decoder.h"
#include "graph/numeric/numeric.h"
#include "graph/ops/ops_float8.h"
#include "graph/ops/ops_float8_rowwise.h"
#include "graph/ops/ops_nn.h"
#include "graph/ops/ops_stack.h"

namespace memsim::graph {

// --- projections -----------------------------------------------------------------------

// A decoder projection plus its LoRA adapter, if any. nn.Linear without bias is mm on
// the folded input; with a bias (and transformers' Conv1D always) addmm(bias, x2d, W):
// PyTorch 2.x's linear flattens a contiguous 3-D input and calls addmm, and Conv1D
// calls it itself. Both hand W's grad back in W's own layout (stolen), so the two share
// one recipe. Under QLoRA the base is bitsandbytes' Linear4bit (its bias fused).
Tensor DecoderModel::project(const Tensor& x, const LayerParams& p, const Proj& pr) {
  const double flops = 2.0 * static_cast<double>(s_.rows()) * pr.in * pr.out;
  const bool addmm = pr.b >= 0 || arch().linear == LinearKind::conv1d;
  // torchao Float8Linear (bias-free nn.Linear only; the reader refuses the rest)
  if (s_.float8 == Float8Kind::rowwise || s_.float8 == Float8Kind::rowwise_with_gw_hp)
    return float8_linear_rowwise(rt_, x, rt_.param(pr.w), s_.rows(),
                                 static_cast<uint64_t>(pr.in), static_cast<uint64_t>(pr.out),
                                 flops, s_.float8);
  if (s_.float8 == Float8Kind::tensorwise) {
    Tensor w = rt_.param(pr.w);
    // FSDP2's float8 all-gather handed the weight over already cast (its scale set at the
    // copy-out, sim/parallel/fsdp2.h).
    const uint32_t gathered_scale = rt_.parameters()[static_cast<size_t>(pr.w)].float8_scale;
    if (gathered_scale != kNoStorage)
      return float8_linear_gathered(rt_, x, w, gathered_scale, s_.rows(),
                                    static_cast<uint64_t>(pr.in), static_cast<uint64_t>(pr.out),
                                    flops);
    return float8_linear(rt_, x, w, s_.rows(), static_cast<uint64_t>(pr.in),
                         static_cast<uint64_t>(pr.out), flops);
  }
  if (autocast_on()) {  // PEFT LoRA under autocast: graph/models/lora_autocast.cpp
    const int64_t rows = static_cast<int64_t>(s_.rows());
    Tensor base;
    if (addmm && arch().linear == LinearKind::conv1d)  // addmm(bias, x2d, W) as Conv1D writes it
      base = ac_->addmm(x, pr.w, pr.b, rows, pr.in, pr.out, flops);
    else if (addmm)
      base = ac_->linear_bias(x, pr.w, pr.b, rows, pr.in, pr.out, flops);
    else
      base = ac_->mm_linear(x, pr.w, rows, pr.in, pr.out, flops);
    if (pr.lora < 0) return base;
    return lora_.add_adapter_path_autocast(*ac_, x, std::move(base), p.ad[pr.lora], pr.in, pr.out);
  }
  Tensor base;
  if (addmm && !lora_.quantized()) {
    Tensor wt = rt_.param(pr.w), bt = rt_.param(pr.b);
    base = addmm_bias(rt_, bt, x, wt, s_.rows() * pr.out * s_.elem, flops, linear_input_);
  } else {
    base = lora_.base_linear(x, pr.w, pr.in, pr.out, linear_input_);
  }
  if (pr.lora < 0) return base;
  // torchtune's LoRALinear and LitGPT's (litgpt/lora.py: `(x @ A.T @ B.T) * scaling`,
  // then `pretrained + lora`) allocate and save the same, in the same order.
  if (tune() || litgpt()) return lora_.tune_adapter_path(x, std::move(base), p.ad[pr.lora], pr.in, pr.out);
  // QLoRA: PEFT wraps a bitsandbytes Linear4bit in lora.bnb.Linear4bit, whose forward clones
  // the base output and casts the adapter output back before the add (graph/models/lora.h).
  if (lora_.quantized())
    return lora_.add_adapter_path_4bit(x, std::move(base), p.ad[pr.lora], pr.in, pr.out, linear_input_);
  return lora_.add_adapter_path(x, std::move(base), p.ad[pr.lora], pr.in, pr.out, linear_input_);
}

// An untied lm_head (nn.Linear without bias).
Tensor DecoderModel::lm_linear(const Tensor& x, int32_t w, int64_t d_in, int64_t d_out,
                               uint64_t rows) {
  if (rows == 0) rows = s_.rows();
  const double flops = 2.0 * static_cast<double>(rows) * d_in * d_out;
  if (autocast_on())
    return ac_->mm_linear(x, w, static_cast<int64_t>(rows), d_in, d_out, flops);
  return mm_linear(rt_, x, rt_.param(w), rows * d_out * s_.elem, flops);
}

// --- norms ---------------------------------------------------------------------------------

Tensor DecoderModel::norm(const Tensor& x, const Norm& n, uint64_t rows, uint64_t width) {
  if (titan()) {  // nn.RMSNorm: one fused kernel (graph/ops/ops_stack.h)
    ModuleScope module_scope(rt_, Module::norm);
    return fused_rms_norm(rt_, x, rt_.param(n.w), rows);
  }
  if (tune()) return tune_rms_norm(x, n.w, rows);  // decoder_impl.cpp
  if (litgpt()) return lit_rms_norm(x, n.w, rows);  // decoder_litgpt.cpp
  switch (arch().norm) {
    case NormKind::rms: return rms_norm(x, n.w, rows);
    case NormKind::rms_one_plus: return gemma_rms_norm(x, n.w, rows, width);
    case NormKind::layer: {
      ModuleScope module_scope(rt_, Module::norm);
      Tensor wt = rt_.param(n.w), bt = rt_.param(n.b);
      Tensor out = layer_norm(rt_, x, wt, bt, rows);
      return out;
    }
  }
  return {};
}

// Under autocast a projection's output is low precision; a q/k RMSNorm on it is the one
// norm of the model whose input is not the fp32 residual stream. Only the Llama-style
// RMSNorm is modelled there (scenario/arch_checks.cpp refuses Gemma-3's).
Tensor DecoderModel::qk_norm(const Tensor& x, const Norm& n, uint64_t rows, uint64_t width) {
  if (autocast_on() && arch().norm == NormKind::rms && !titan() && !tune() && !litgpt())
    return rms_norm(x, n.w, rows, ac_->low_elem());
  return norm(x, n, rows, width);
}

// LlamaRMSNorm as written: to(float32), pow(2).mean(-1, keepdim), * rsqrt(var + eps),
// weight * hidden.to(input_dtype). `rows` vectors of `width` (the hidden size, or
// head_dim for a per-head q/k norm). `in_elem`: the input's element size when it is not
// the parameters' (0: it is). Under autocast a q/k norm (Qwen3-MoE, OLMoE) gets the low
// projection output: `.to(float32)` and `.to(input_dtype)` are plain copies (no autocast
// op), pow/mean/rsqrt see fp32, and `self.weight * x_low` promotes to fp32 (the fp32
// weight), so q/k leave the norm fp32; in backward validate_outputs casts x_low's fp32
// grad back to the low dtype (after the weight's sum_to: outputs in order).
Tensor DecoderModel::rms_norm(const Tensor& x, int32_t w, uint64_t rows, uint64_t in_elem) {
  ModuleScope module_scope(rt_, Module::norm);
  const uint64_t e = in_elem != 0 ? in_elem : s_.elem;
  // hidden_states.to(torch.float32): the same tensor in fp32, a copy otherwise.
  Tensor hf = e == 4 ? x : to_copy(rt_, x, x.bytes / e * 4);
  Tensor variance;
  {
    Tensor sq = pow2(rt_, hf);
    variance = mean_dim(rt_, sq, rows * 4);
  }
  {
    Tensor ve = add_scalar(rt_, variance);
    Tensor r = rsqrt(rt_, ve);
    ve.reset();
    hf = mul(rt_, hf, r);
  }
  // `return self.weight * hidden_states.to(input_dtype)`: the fp32 `hidden_states` is a
  // local until forward returns (H100 trace, bf16).
  Tensor hb = e == 4 ? hf : to_copy(rt_, hf, hf.bytes / 4 * e);
  // weight * x: the weight's grad sums over the rows, a CUDA reduction that stages its
  // partial sums in global memory (graph/ops/cuda_reduce.h; 32 MiB at 4 x 1024 x 1024 on
  // an H100).
  Tensor out;
  if (e == s_.elem || !autocast_on()) {
    out = mul(rt_, rt_.param(w), hb, Broadcast::leading_dims, e);
  } else {
    out = mul(rt_, rt_.param(w), ac_->widen(hb), Broadcast::leading_dims, s_.elem);
    Autocast::promoted(rt_, out, 1, hb);
  }
  hb.reset();
  variance.reset();
  hf.reset();
  return out;
}

// GemmaRMSNorm: `output = self._norm(x.float())` (x * rsqrt(x.pow(2).mean(-1, keepdim)
// + eps), its temporaries dying inside the expression), `output = output * (1.0 +
// self.weight.float())`, `return output.type_as(x)`. The (1 + w) vector is a new fp32
// tensor saved by the product; the weight's grad is the product's reduction over the
// rows, then AddBackward passes it on (and ToCopyBackward casts it for 16-bit weights).
Tensor DecoderModel::gemma_rms_norm(const Tensor& x, int32_t w, uint64_t rows, uint64_t width) {
  ModuleScope module_scope(rt_, Module::norm);
  const uint64_t e = s_.elem;
  Tensor output;
  {
    Tensor hf = e == 4 ? x : to_copy(rt_, x, x.bytes / e * 4);  // x.float()
    Tensor r;
    {
      Tensor variance;
      {
        Tensor sq = pow2(rt_, hf);
        variance = mean_dim(rt_, sq, rows * 4);
      }
      Tensor ve = add_scalar(rt_, variance);
      variance.reset();
      r = rsqrt(rt_, ve);
    }
    output = mul(rt_, hf, r);
  }  // _norm returns; the argument x.float() dies with the call
  {
    Tensor wf = rt_.param(w);
    if (e != 4) wf = to_copy(rt_, wf, width * 4);  // self.weight.float()
    Tensor one_plus = add_scalar(rt_, wf);           // 1.0 + w
    wf.reset();
    output = mul(rt_, output, one_plus, Broadcast::leading_dims, 4);
  }
  if (e != 4) output = to_copy(rt_, output, output.bytes / 4 * e);  // .type_as(x)
  return output;
}

// --- MLP -------------------------------------------------------------------------------------

Tensor DecoderModel::activation(const Tensor& x) {
  switch (arch().act) {
    case Activation::silu: return silu(rt_, x);
    case Activation::gelu_tanh:
    case Activation::gelu: return gelu(rt_, x);
    case Activation::gelu_new: return autocast_on() ? gelu_new_autocast(x) : gelu_new(x);
  }
  return {};
}

// GLU: down(act(gate(x)) * up(x)); plain: fc2(act(fc1(x))) with GPT-2's resid dropout.
Tensor DecoderModel::mlp(const LayerParams& p, const Tensor& x) {
  if (p.moe) return moe_block(static_cast<int32_t>(&p - layers_.data()), p, x);  // decoder_moe.cpp
  if (litgpt()) return mlp_litgpt(p, x);  // decoder_litgpt.cpp
  ModuleScope module_scope(rt_, Module::mlp);
  Tensor out;
  if (arch().mlp == MlpKind::plain) {
    Tensor h = project(x, p, p.up);
    h = activation(h);
    h = project(h, p, p.down);
    out = arch().residual_dropout ? drop(h) : h;
  } else if (arch().fused_gate_up) {
    // Phi-3: up_states = gate_up_proj(x); gate, up_states = up_states.chunk(2, -1);
    // up_states = up_states * act(gate); down_proj(up_states). One SplitBackward0 cats
    // the two grads.
    // `gate` (a view of gate_up's output) is a local until the MLP returns: without grad
    // (generation) nothing else keeps that storage alive through down_proj.
    Tensor m, gate;
    {
      Tensor up;
      {
        Tensor gu = project(x, p, p.gate_up);
        Chunk2 halves(rt_, gu);
        gate = halves.piece(rt_, 0);
        up = halves.piece(rt_, 1);
      }
      Tensor a = activation(gate);
      m = mul(rt_, up, a);
    }
    out = project(m, p, p.down);
  } else {
    Tensor m;
    {
      Tensor a = activation(project(x, p, p.gate));
      Tensor u = project(x, p, p.up);
      m = mul(rt_, a, u);
    }
    out = project(m, p, p.down);
  }
  return out;
}

// nn.Dropout: p == 0 returns its input (no op at all); otherwise native_dropout.
Tensor DecoderModel::drop(const Tensor& x) {
  if (s_.dropout <= 0.0) return x;
  return native_dropout(rt_, x, s_.elem);
}

// `x = x / cap; x = tanh(x); x = x * cap` (Gemma-2's attention-logit and final-logit
// soft-capping): three new tensors, tanh saving its result. Each rebinding drops the
// previous tensor, so the input (which the division does not save) is freed as soon as the
// division returns, before tanh allocates: the caller passes it by move (seen on the H200
// trace of the Gemma-2 bf16 stand-in, where holding the logits one op longer cost a third
// 250 MiB segment).
Tensor DecoderModel::softcap(Tensor x) {
  Tensor d = div_scalar(rt_, x);
  x.reset();
  Tensor t = tanh(rt_, d);
  d.reset();
  return mul_scalar(rt_, t);
}

// NewGELUActivation: 0.5 * x * (1.0 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3.0)))).
// CPython evaluates `0.5 * x` first and frees each temporary after its consumer.
Tensor DecoderModel::gelu_new(const Tensor& x) {
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
Tensor DecoderModel::gelu_new_autocast(const Tensor& x) {
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

}  // namespace memsim::graph
