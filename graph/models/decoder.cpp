// DecoderModel: construction, the decoder layers, the model's forward, the head and the
// loss (graph/models/decoder.h). The modules are in decoder_modules.cpp and
// decoder_attention.cpp.
#include "graph/models/decoder.h"

#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph/autocast.h"
#include "graph/checkpoint.h"
#include "graph/compile.h"
#include "graph/models/decoder_mask_v5.h"
#include "graph/models/kv_cache.h"
#include "graph/numeric/numeric.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

bool DecoderModel::autocast_on() const { return ac_ != nullptr && ac_->active(); }
uint64_t DecoderModel::act_elem() const { return autocast_on() ? ac_->low_elem() : s_.elem; }

// --- construction --------------------------------------------------------------------

// Parameter names are built in one reused buffer (no allocation per parameter).
const std::string& DecoderModel::param_name(const std::string& prefix, const char* module,
                                            const char* suffix) {
  name_.assign(prefix).append(module).append(suffix);
  return name_;
}

DecoderModel::Proj DecoderModel::add_proj(uint64_t out, uint64_t in, const std::string& prefix,
                                          const char* module, bool bias, int32_t lora) {
  Proj p;
  p.in = static_cast<int64_t>(in);
  p.out = static_cast<int64_t>(out);
  p.lora = lora;
  p.w = lora_.add_base_weight(out, in, param_name(prefix, module, ".weight"),
                              arch().linear == LinearKind::conv1d);
  if (bias) p.b = rt_.add_parameter(out * s_.elem, param_name(prefix, module, ".bias"));
  return p;
}

DecoderModel::Norm DecoderModel::add_norm(uint64_t width, const std::string& prefix,
                                          const char* module) {
  Norm n;
  n.w = rt_.add_parameter(width * s_.elem, param_name(prefix, module, ".weight"));
  if (arch().norm == NormKind::layer)
    n.b = rt_.add_parameter(width * s_.elem, param_name(prefix, module, ".bias"));
  return n;
}

// A rotary module's inv_freq buffer (rotary_dim/2 fp32, non-persistent):
// 1.0 / (base ** (torch.arange(0, dim, 2, dtype=int64).float() / dim)), built on the
// device op by op (H100 trace): arange, float, / dim, base ** x (the Python float base
// becomes a 0-d double tensor), reciprocal, * 1.0.
Tensor DecoderModel::add_inv_freq() {
  const uint64_t n = s_.rotary_dim() / 2;
  Tensor ar = rt_.alloc(n * 8, TensorKind::temporary, OpKind::arange);
  Tensor f = rt_.alloc(n * 4, TensorKind::temporary, OpKind::to_copy);
  ar.reset();
  Tensor scaled = rt_.alloc(n * 4, TensorKind::temporary, OpKind::div_scalar);
  f.reset();
  Tensor pw = rt_.alloc(n * 4, TensorKind::temporary, OpKind::other);  // pow
  rt_.alloc(8, TensorKind::temporary, OpKind::fill).reset();  // the wrapped base
  scaled.reset();
  Tensor rec = rt_.alloc(n * 4, TensorKind::temporary, OpKind::other);  // reciprocal
  Tensor inv_freq = rt_.alloc(n * 4, TensorKind::other, OpKind::mul_scalar);
  rec.reset();
  pw.reset();
  return inv_freq;
}

void DecoderModel::cast_rotary_buffers(uint64_t elem) {
  const uint64_t n = s_.rotary_dim() / 2;
  auto cast = [&](Tensor& buffer) {
    if (!buffer.defined()) return;
    Tensor low = rt_.alloc(n * elem, TensorKind::other, OpKind::to_copy);
    rt_.program().tensors[low.storage].name = rt_.program().intern("rotary inv_freq in FSDP buffer_dtype");
    buffer = std::move(low);  // `.data =`: the fp32 storage is freed
  };
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) cast(it->inv_freq);
  cast(inv_freq_);
  cast(inv_freq_local_);
  inv_freq_elem_ = elem;
}

void DecoderModel::construct() {
  const DecoderArch& a = arch();
  if (a.impl != ModelImpl::hf && rt_.numeric != nullptr)
    throw std::runtime_error("the numeric check runs transformers' model code only (model.implementation hf)");
  if (titan()) return construct_titan();  // decoder_impl.cpp
  if (tune()) return construct_tune();
  if (litgpt()) return construct_litgpt();  // decoder_litgpt.cpp
  if (a.eager_core == EagerCore::where_buffer && s_.attention != HfAttention::eager)
    throw std::runtime_error("hf-gpt2: only model.attention eager is modelled (GPT2Attention._attn)");
  // prepare_model_for_kbit_training over a 16-bit load (graph/models/lora.h): from_pretrained
  // builds the model in the load dtype; the upcast before get_peft_model makes it elem (fp32).
  const uint64_t model_elem = s_.elem;
  if (s_.lora.upcast_from_elem > 0) {
    if (rt_.numeric != nullptr)
      throw std::runtime_error("lora.prepare_kbit: numeric mode does not model the fp32 upcast");
    s_.elem = s_.lora.upcast_from_elem;
  }
  const uint64_t e = s_.elem, D = s_.d_model, F = s_.d_ff, V = s_.vocab, P = s_.context_length;
  const uint64_t qD = s_.q_dim(), kvD = s_.kv_dim(), hd = s_.head_dim();
  const bool gpt2 = a.code == ModelCode::gpt2;
  rt_.ctx.module = Module::embedding;
  embed_ = rt_.add_parameter(V * D * e, gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight");
  if (a.positions == Positions::learned) wpe_ = rt_.add_parameter(P * D * e, "transformer.wpe.weight");
  rt_.parameters()[embed_].rows = V;  // shapes for Adafactor's factored state
  if (wpe_ >= 0) rt_.parameters()[wpe_].rows = P;
  layers_.resize(s_.layers);
  for (int32_t l = 0; l < s_.layers; ++l) {
    rt_.ctx.layer = l;
    LayerParams& p = layers_[l];
    if (gpt2) {
      // GPT2Block registers ln_1, attn (its buffers first), ln_2, mlp.
      const std::string pre = "transformer.h." + std::to_string(l) + ".";
      rt_.ctx.module = Module::norm;
      p.norm[kInputNorm] = add_norm(D, pre, "ln_1");
      rt_.ctx.module = Module::attention;
      // GPT2Attention's (P, P) bool causal `bias` and 0-d `masked_bias` buffers:
      // torch.tril(torch.ones((P, P), dtype=torch.bool)), the ones a temporary.
      Tensor ones = new_tensor(rt_, P * P, OpKind::fill, TensorKind::temporary);
      numeric_hint(rt_, NumericHint::causal_tril);  // numeric mode only (graph/numeric/numeric.h)
      p.causal_bias = new_tensor(rt_, P * P, OpKind::fill, TensorKind::other);
      ones.reset();
      p.masked_bias = rt_.alloc(e, TensorKind::other, OpKind::fill);
      p.qkv = add_proj(3 * D, D, pre, "attn.c_attn", a.qkv_bias, kCAttn);
      p.o = add_proj(D, D, pre, "attn.c_proj", a.o_bias, kAttnCProj);
      rt_.ctx.module = Module::norm;
      p.norm[kPostAttnNorm] = add_norm(D, pre, "ln_2");
      rt_.ctx.module = Module::mlp;
      p.up = add_proj(F, D, pre, "mlp.c_fc", a.mlp_bias, kCFc);
      p.down = add_proj(D, F, pre, "mlp.c_proj", a.mlp_bias, kMlpCProj);
      continue;
    }
    // Llama-lineage decoder layers register self_attn, mlp, then their norms.
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    rt_.ctx.module = Module::attention;
    if (a.mla.enabled()) {  // DeepseekV3Attention (decoder_mla.cpp)
      construct_mla(p, pre);
    } else if (a.fused_qkv) {  // Phi3Attention registers o_proj before qkv_proj
      p.o = add_proj(D, qD, pre, "self_attn.o_proj", a.o_bias, kOProj);
      p.qkv = add_proj(qD + 2 * kvD, D, pre, "self_attn.qkv_proj", a.qkv_bias, -1);
    } else {
      p.q = add_proj(qD, D, pre, "self_attn.q_proj", a.qkv_bias, kQProj);
      p.k = add_proj(kvD, D, pre, "self_attn.k_proj", a.qkv_bias, kKProj);
      p.v = add_proj(kvD, D, pre, "self_attn.v_proj", a.qkv_bias, kVProj);
      p.o = add_proj(D, qD, pre, "self_attn.o_proj", a.o_bias, kOProj);
    }
    if (a.qk_norm != QkNorm::none) {
      rt_.ctx.module = Module::norm;
      const bool head = a.qk_norm == QkNorm::head;
      p.q_norm = add_norm(head ? hd : qD, pre, "self_attn.q_norm");
      p.k_norm = add_norm(head ? hd : kvD, pre, "self_attn.k_norm");
      rt_.ctx.module = Module::attention;
    }
    if (a.rope == RopeAt::layer || a.attn_rope_buffer) p.inv_freq = add_inv_freq();
    rt_.ctx.module = Module::mlp;
    if (a.moe.layer_is_moe(l)) {
      construct_moe(p, pre);  // decoder_moe.cpp
    } else if (a.mlp == MlpKind::glu && a.fused_gate_up) {
      p.gate_up = add_proj(2 * F, D, pre, "mlp.gate_up_proj", a.mlp_bias, -1);
    } else if (a.mlp == MlpKind::glu) {
      p.gate = add_proj(F, D, pre, "mlp.gate_proj", a.mlp_bias, kGateProj);
      p.up = add_proj(F, D, pre, "mlp.up_proj", a.mlp_bias, kUpProj);
    } else {
      p.up = add_proj(F, D, pre, "mlp.fc1", a.mlp_bias, kUpProj);
    }
    if (!p.moe)
      p.down = add_proj(D, F, pre, a.mlp == MlpKind::glu ? "mlp.down_proj" : "mlp.fc2",
                        a.mlp_bias, kDownProj);
    rt_.ctx.module = Module::norm;
    switch (a.placement) {
      case NormPlacement::pre:
        p.norm[kInputNorm] = add_norm(D, pre, "input_layernorm");
        p.norm[kPostAttnNorm] = add_norm(D, pre, "post_attention_layernorm");
        break;
      case NormPlacement::post:
        p.norm[kPostAttnNorm] = add_norm(D, pre, "post_attention_layernorm");
        p.norm[kPostFfNorm] = add_norm(D, pre, "post_feedforward_layernorm");
        break;
      case NormPlacement::sandwich:
        p.norm[kInputNorm] = add_norm(D, pre, "input_layernorm");
        if (a.sandwich_order == SandwichOrder::gemma2) {
          p.norm[kPreFfNorm] = add_norm(D, pre, "pre_feedforward_layernorm");
          p.norm[kPostFfNorm] = add_norm(D, pre, "post_feedforward_layernorm");
          p.norm[kPostAttnNorm] = add_norm(D, pre, "post_attention_layernorm");
        } else {
          p.norm[kPostAttnNorm] = add_norm(D, pre, "post_attention_layernorm");
          p.norm[kPreFfNorm] = add_norm(D, pre, "pre_feedforward_layernorm");
          p.norm[kPostFfNorm] = add_norm(D, pre, "post_feedforward_layernorm");
        }
        break;
    }
  }
  rt_.ctx.layer = -1;
  rt_.ctx.module = Module::norm;
  final_norm_ = add_norm(D, gpt2 ? "transformer." : "model.", gpt2 ? "ln_f" : "norm");
  if (a.positions == Positions::rotary && a.rope == RopeAt::model) {
    inv_freq_ = add_inv_freq();
    if (a.rope_local) inv_freq_local_ = add_inv_freq();  // Gemma-3's rotary_emb_local
  }
  rt_.ctx.module = Module::head;
  if (!s_.tied) {
    lm_head_ = rt_.add_parameter(V * D * e, "lm_head.weight");
    rt_.parameters()[lm_head_].rows = V;
  }
  s_.elem = model_elem;
  lora_.prepare_kbit_upcast();  // no-op without lora.prepare_kbit over a 16-bit load
  if (lora_.enabled()) add_adapters();
  rt_.ctx.module = Module::none;
}

// get_peft_model: freeze the base model, then inject the adapters module by module.
void DecoderModel::add_adapters() {
  lora_.freeze_all();
  const bool gpt2 = arch().code == ModelCode::gpt2;
  for (int32_t l = 0; l < s_.layers; ++l) {
    rt_.ctx.layer = l;
    LayerParams& p = layers_[l];
    if (gpt2) {
      static const char* const kNames[kGpt2Linears] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                       "mlp.c_proj"};
      const Proj* proj[kGpt2Linears] = {&p.qkv, &p.o, &p.up, &p.down};
      const std::string pre = "transformer.h." + std::to_string(l) + ".";
      for (uint32_t m = 0; m < kGpt2Linears; ++m) {
        if (!lora_.targets(m)) continue;
        rt_.ctx.module = m < kCFc ? Module::attention : Module::mlp;
        p.ad[m] = lora_.add_adapter(proj[m]->out, proj[m]->in, pre + kNames[m]);
      }
      continue;
    }
    static const char* const kNames[kLlamaLinears] = {
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    const Proj* proj[kLlamaLinears] = {&p.q, &p.k, &p.v, &p.o, &p.gate, &p.up, &p.down};
    // A MoE layer's gate/up/down are its shared expert's (decoder_moe.cpp construct_moe).
    static const char* const kShared[3] = {"mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                                           "mlp.shared_expert.down_proj"};
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    // get_peft_model injects in named_modules() order: DeepseekV3Attention / V2's registers
    // q_proj or q_a_proj and q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj
    // (decoder_mla.cpp); the Llama lineage q/k/v/o.
    static const uint32_t kLlamaOrder[] = {kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj};
    static const uint32_t kMlaOrder[] = {kQProj, kQAProj, kQBProj, kKvAProj, kKvBProj, kOProj,
                                         kGateProj, kUpProj, kDownProj};
    static const char* const kMlaNames[] = {"self_attn.q_a_proj", "self_attn.q_b_proj",
                                            "self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj"};
    const bool mla = arch().mla.enabled();
    const Proj* mla_proj[] = {&p.q_a, &p.q_b, &p.kv_a, &p.kv_b};
    // DeepSeek's MoE block names its shared experts' module `shared_experts`.
    static const char* const kSharedDeepseek[3] = {"mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj",
                                                   "mlp.shared_experts.down_proj"};
    const bool deepseek_moe = arch().moe.code == MoeRouterCode::deepseek_v3 ||
                              arch().moe.code == MoeRouterCode::deepseek_v2;
    for (uint32_t m : mla ? std::vector<uint32_t>(std::begin(kMlaOrder), std::end(kMlaOrder))
                          : std::vector<uint32_t>(std::begin(kLlamaOrder), std::end(kLlamaOrder))) {
      // The experts module (lora.target_parameters) is registered before the shared expert:
      // its adapters come after the attention's and before the shared expert's.
      if (m == kGateProj && p.moe) add_experts_adapters(p, pre);
      const Proj* pr = m >= kQAProj ? mla_proj[m - kQAProj] : proj[m];
      if (!lora_.targets(m) || pr->w < 0) continue;
      rt_.ctx.module = m < kGateProj || m >= kQAProj ? Module::attention : Module::mlp;
      const char* name = m >= kQAProj ? kMlaNames[m - kQAProj]
                         : p.moe && m >= kGateProj ? (deepseek_moe ? kSharedDeepseek : kShared)[m - kGateProj]
                                                   : kNames[m];
      p.ad[m] = lora_.add_adapter(pr->out, pr->in, pre + name);
    }
  }
  rt_.ctx.layer = -1;
}

// --- Llama-lineage decoder layers --------------------------------------------------------

// The attention half: its norms and self_attn (a candidate checkpoint region).
// in = {x, causal_mask, cos, sin}.
Tensor DecoderModel::attn_half(int32_t l, const Inputs& in) {
  const LayerParams& p = layers_[l];
  switch (arch().placement) {
    case NormPlacement::pre: {
      Tensor h1 = norm(in[0], p.norm[kInputNorm], s_.rows(), s_.d_model);
      return attention(p, h1, in[1], in[2], in[3]);
    }
    case NormPlacement::post: {
      Tensor a = attention(p, in[0], in[1], in[2], in[3]);
      return norm(a, p.norm[kPostAttnNorm], s_.rows(), s_.d_model);
    }
    case NormPlacement::sandwich: {
      Tensor a;
      {
        Tensor h1 = norm(in[0], p.norm[kInputNorm], s_.rows(), s_.d_model);
        a = attention(p, h1, in[1], in[2], in[3]);
      }
      return norm(a, p.norm[kPostAttnNorm], s_.rows(), s_.d_model);
    }
  }
  return {};
}

// The MLP half: its norms and mlp (a candidate checkpoint region). in = {x}.
Tensor DecoderModel::mlp_half(int32_t l, const Inputs& in) {
  const LayerParams& p = layers_[l];
  switch (arch().placement) {
    case NormPlacement::pre: {
      Tensor h2 = norm(in[0], p.norm[kPostAttnNorm], s_.rows(), s_.d_model);
      return mlp(p, h2);
    }
    case NormPlacement::post: {
      Tensor m = mlp(p, in[0]);
      return norm(m, p.norm[kPostFfNorm], s_.rows(), s_.d_model);
    }
    case NormPlacement::sandwich: {
      Tensor m;
      {
        Tensor h2 = norm(in[0], p.norm[kPreFfNorm], s_.rows(), s_.d_model);
        m = mlp(p, h2);
      }
      return norm(m, p.norm[kPostFfNorm], s_.rows(), s_.d_model);
    }
  }
  return {};
}

// What a reentrant checkpoint of a whole layer keeps on its node's ctx until the graph dies
// (graph/checkpoint.h), as indices into the layer loop's extra inputs, in the order the
// ctx's death frees them.
//  - v4.45-v4.5x: checkpoint(decoder_layer.__call__, hidden_states, causal_mask,
//    position_ids, past_key_values, output_attentions, use_cache, cache_position,
//    position_embeddings): the tensors are saved for backward, the position_embeddings
//    tuple (cos, sin) stays in ctx.inputs. The list and the tuple are freed last item
//    first (CPython's list_dealloc / tupledealloc): sin, cos (Gemma-3's local tuple, the
//    later argument, before the global one).
//  - 5.x: GradientCheckpointingLayer.__call__ (src/transformers/modeling_layers.py,
//    transformers 00029cfa) runs checkpoint(partial(super().__call__, **kwargs), *args)
//    and the model passes only hidden_states positionally: the mask, position_embeddings,
//    position_ids (cache_position's slot) are the partial's keywords, kept in
//    ctx.run_function; a dict frees its values in insertion order (attention_mask,
//    position_embeddings, position_ids). Both masks stand in the list: each layer's
//    partial holds its own type's, and layer 0's ctx is the last to die.
static std::vector<uint8_t> layer_ctx_held(bool v5, bool rope_local, bool sliding) {
  if (v5) {
    std::vector<uint8_t> held = {0};
    if (sliding) held.push_back(static_cast<uint8_t>(rope_local ? 6 : 4));
    for (const uint8_t k : {3, 2, 1}) held.push_back(k);
    return held;
  }
  if (rope_local) return {5, 4, 3, 2};
  return {3, 2};
}

// One decoder layer; extra = {causal_mask, cache_position, cos, sin, cos_local,
// sin_local}. The two halves are candidate checkpoint regions (graph/checkpoint.h);
// their lambdas capture values only, because a checkpointed half is re-run during
// backward.
Tensor DecoderModel::layer(int32_t l, const Tensor& x, const Inputs& extra) {
  LayerScope layer_scope(rt_, l);
  const DecoderArch& a = arch();
  const bool slides = a.layer_slides(l);
  // Gemma-2/3's sliding layers mask their own copy, first thing in the layer:
  // tril(ones_like(mask, bool), -window) over the expanded (B,1,S,T) mask (all B copies
  // materialised), then where(sliding, min, mask) with a 0-d device scalar of the mask's
  // dtype. Both are locals of the layer's forward.
  Tensor mask = extra[0], sliding_mask, layer_mask;
  // (generate.cache_classes v5: 5.x's layers receive their type's mask and build nothing.)
  const bool v5_masks = (cache_ != nullptr && cache_->layered()) || uses_masking_utils(a);
  // transformers 5.x's training forward: a sliding layer takes the model's sliding mask
  // (forward_hidden appends it to extra when the model built both).
  const size_t sliding_slot = a.rope_local ? 6 : 4;
  if (uses_masking_utils(a) && slides && extra.size() > sliding_slot) mask = extra[sliding_slot];
  if (slides && a.sliding_at == SlidingAt::layer && mask.defined() && !v5_masks) {
    const uint64_t n = s_.batch * s_.seq * mask_keys();
    {
      Tensor ones = new_tensor(rt_, n, OpKind::fill, TensorKind::temporary);
      sliding_mask = new_tensor(rt_, n, OpKind::fill, TensorKind::temporary);  // tril
    }
    Tensor scalar = rt_.alloc(s_.elem, TensorKind::temporary, OpKind::scalar_tensor);
    layer_mask = new_tensor(rt_, n * s_.elem, OpKind::other, TensorKind::temporary);  // where
    scalar.reset();
    mask = layer_mask;
  }
  const bool local = slides && a.rope_local;
  const Tensor& cos = local ? extra[4] : extra[2];
  const Tensor& sin = local ? extra[5] : extra[3];
  Tensor weights;  // self_attn_weights (v4.50+): lives until the layer returns
  layer_weights_ = a.attn_function ? &weights : nullptr;
  // An attention that computes its own rotary tables takes position_ids (a view of
  // cache_position): a checkpointed half keeps it as an input.
  Inputs attn_in = {x, mask, cos, sin};
  if (a.rope == RopeAt::layer) attn_in.push_back(extra[1]);
  // A checkpointed attention half gets (cos, sin) as one position_embeddings tuple (the
  // CPU stand-ins' attn_half(hidden_states, attention_mask, position_embeddings)): a
  // reentrant ctx keeps it, sin freed first.
  Tensor h = run_region(rt_, RegionKind::attention, attn_in,
                        [this, l](const Inputs& in) { return attn_half(l, in); }, {3, 2});
  attn_in.clear();
  layer_weights_ = nullptr;
  if (a.residual_dropout) h = drop(h);  // Phi-3's resid_attn_dropout
  // Under autocast the attention/MLP outputs are low precision: the fp32 residual promotes.
  Tensor r1 = autocast_on() ? add(rt_, x, ac_->widen(h)) : add(rt_, x, h);
  if (autocast_on()) Autocast::promoted(rt_, r1, 1, h);
  // `hidden_states = residual + hidden_states` drops the attention output (StableLM keeps
  // it in `self_attn_output` until the layer returns).
  Tensor kept;
  // torchtune: the local attn_out; LitGPT: Block.forward's attention_output.
  if (a.attn_out_kept || tune() || litgpt()) kept = std::move(h);
  h.reset();
  h = run_region(rt_, RegionKind::mlp, {r1}, [this, l](const Inputs& in) { return mlp_half(l, in); });
  if (a.residual_dropout) h = drop(h);  // resid_mlp_dropout
  // A MoE block's output is already fp32 under autocast (index_add_ into zeros_like of the
  // fp32 input, decoder_moe.cpp): no promotion then.
  const bool low_mlp = autocast_on() && h.bytes < r1.bytes;
  Tensor out = low_mlp ? add(rt_, r1, ac_->widen(h)) : add(rt_, r1, h);
  if (low_mlp) Autocast::promoted(rt_, out, 1, h);
  // The layer's locals die as it returns, in the caller's context (the residual before
  // the MLP output, as the H100 traces were matched with), then the sliding masks (the
  // rebound attention_mask first).
  layer_scope.restore();
  r1.reset();
  h.reset();
  kept.reset();
  mask.reset();
  layer_mask.reset();
  sliding_mask.reset();
  weights.reset();
  return out;
}

// _update_causal_mask for eager attention, no padding mask, no cache: (S, T) in the
// model's dtype, T = S + 1 (S for Gemma-2/3), living until the model returns.
Tensor DecoderModel::causal_mask() {
  const DecoderArch& a = arch();
  const uint64_t e = s_.elem, S = s_.seq, T = mask_keys();
  Tensor causal;
  if (a.mask == MaskBuild::triu) {
    // _prepare_4d_causal_attention_mask_with_cache_position (Llama v4.45).
    {
      Tensor full = new_tensor(rt_, S * T * e, OpKind::fill, TensorKind::temporary);
      numeric_hint(rt_, NumericHint::causal_mask);
      causal = new_tensor(rt_, S * T * e, OpKind::fill);  // triu(full)
    }
    Tensor ar = new_tensor(rt_, T * 8, OpKind::arange, TensorKind::temporary);
    numeric_hint(rt_, NumericHint::unread);  // folded into causal_mask above
    Tensor gt = new_tensor(rt_, S * T, OpKind::compare, TensorKind::temporary);
    ar.reset();  // causal_mask *= (arange > cache_position): in place
    return causal;
  }
  // Mistral v4.45 / Qwen3 v4.51: full; exclude_mask = arange > cache_position (a local);
  // with a window folded in, exclude_mask |= arange <= cache_position - window; mul_.
  causal = new_tensor(rt_, S * T * e, OpKind::fill);
  Tensor exclude;
  {
    Tensor ar = new_tensor(rt_, T * 8, OpKind::arange, TensorKind::temporary);
    exclude = new_tensor(rt_, S * T, OpKind::compare, TensorKind::temporary);
  }
  Tensor window;
  if (a.sliding_window > 0 && a.sliding_at == SlidingAt::mask) {
    Tensor ar = new_tensor(rt_, T * 8, OpKind::arange, TensorKind::temporary);
    Tensor sub = new_tensor(rt_, S * 8, OpKind::other, TensorKind::temporary);
    window = new_tensor(rt_, S * T, OpKind::compare, TensorKind::temporary);  // le
    ar.reset();
    sub.reset();
    if (!a.mask_window_local) window.reset();  // a temporary of bitwise_or_ (Mistral)
  }
  exclude.reset();  // the builder returns; its locals die
  window.reset();
  return causal;
}

// (cos, sin) under no_grad, fp32, batch 1 of position ids: position_ids.float(),
// inv_freq @ positions, cat(freqs, freqs), cos, sin (times attention_scaling at model
// level), .to(dtype).
void DecoderModel::rope_tables(bool scaled, Tensor& cos, Tensor& sin) {
  // `cos.to(dtype=x.dtype)`: x is the hidden states (model level: fp32 under autocast) or
  // a layer's value states (per-layer rotary: v_proj's low output under autocast).
  const uint64_t e = !scaled && autocast_on() ? ac_->low_elem() : s_.elem;
  // Rows of position_ids: 1 in training, the batch in generate (hf_shape.h pos_batch).
  const uint64_t S = s_.seq * static_cast<uint64_t>(s_.pos_batch), rd = s_.rotary_dim();
  const bool was = rt_.grad_enabled;
  rt_.grad_enabled = false;
  // `self.inv_freq[None, :, None].float()`: a view of an fp32 buffer, a new fp32 copy of
  // a buffer FSDP's buffer_dtype made low-precision (cast_rotary_buffers).
  Tensor inv_freq32;
  if (inv_freq_elem_ != 4) {
    inv_freq32 = new_tensor(rt_, rd / 2 * 4, OpKind::to_copy, TensorKind::temporary);
    rt_.program().tensors[inv_freq32.storage].name = rt_.program().intern("rotary inv_freq.float()");
  }
  Tensor pos = new_tensor(rt_, S * 4, OpKind::to_copy, TensorKind::temporary);
  Tensor freqs = new_tensor(rt_, rd / 2 * S * 4, OpKind::bmm, TensorKind::temporary);
  // inv_freq @ position_ids is a cuBLAS matmul: the step's first one, so it is where
  // the forward thread's cuBLAS workspace is allocated (measured on an H100,
  // tests/data/cuda_runs.json), not at q_proj.
  rt_.note_gemm();
  Tensor emb = new_tensor(rt_, S * rd * 4, OpKind::other, TensorKind::temporary);
  Tensor cos32, sin32;
  if (scaled && arch().rope_mul_fused) {  // cos = emb.cos() * s; sin = emb.sin() * s
    cos32 = new_tensor(rt_, S * rd * 4, OpKind::other);
    numeric_hint(rt_, NumericHint::rope_cos);
    cos32 = new_tensor(rt_, S * rd * 4, OpKind::mul_scalar);
    sin32 = new_tensor(rt_, S * rd * 4, OpKind::other);
    numeric_hint(rt_, NumericHint::rope_sin);
    sin32 = new_tensor(rt_, S * rd * 4, OpKind::mul_scalar);
  } else {
    cos32 = new_tensor(rt_, S * rd * 4, OpKind::other);
    sin32 = new_tensor(rt_, S * rd * 4, OpKind::other);
    if (scaled) {
      numeric_hint(rt_, NumericHint::rope_cos);
      cos32 = new_tensor(rt_, S * rd * 4, OpKind::mul_scalar);  // * attention_scaling
      numeric_hint(rt_, NumericHint::rope_sin);
      sin32 = new_tensor(rt_, S * rd * 4, OpKind::mul_scalar);
    }
  }
  if (e != 4) {  // return cos.to(x.dtype), sin.to(x.dtype)
    cos = new_tensor(rt_, S * rd * e, OpKind::to_copy);
    sin = new_tensor(rt_, S * rd * e, OpKind::to_copy);
  } else {
    cos = std::move(cos32);
    sin = std::move(sin32);
  }
  // The frame's locals die in declaration order (H100 trace).
  inv_freq32.reset();
  pos.reset();
  freqs.reset();
  emb.reset();
  cos32.reset();
  sin32.reset();
  rt_.grad_enabled = was;
}

Tensor DecoderModel::forward(const Tensor& ids) {
  // Outside every decoder layer until run_layers enters one: the backward leaves ctx.layer
  // at its last node's layer, which is a block's when the embedding is frozen (LoRA).
  rt_.ctx.layer = -1;
  // LitGPT's GPT under Fabric: the compiled module's output is cast outside the graph
  // (decoder_litgpt.cpp opens its own region).
  if (litgpt()) return forward_litgpt(ids);
  // torch.compile(model) (graph/compile.h): the whole forward is one compiled region.
  if (rt_.compile != nullptr && rt_.compile->wants(CompileScope::model))
    return rt_.compile->run([this, &ids] { return forward(ids); });
  if (titan()) return forward_titan(ids);  // decoder_impl.cpp
  if (tune()) return forward_tune(ids);
  router_logits_.clear();  // a new forward records its own router outputs (MoE aux loss)
  Tensor head_w;
  Tensor hidden = forward_hidden(ids, head_w);
  rt_.ctx.module = Module::head;
  Tensor logits = arch().code == ModelCode::gpt2 ? gpt2_head(hidden, head_w, s_.rows())
                                                 : logits_head(hidden, head_w, s_.rows());
  hidden.reset();  // a local of forward: it dies when forward returns (H100 trace)
  rt_.ctx.module = Module::none;
  return logits;
}

Tensor DecoderModel::forward_hidden(const Tensor& ids, Tensor& head_w) {
  if (arch().code == ModelCode::gpt2) return gpt2_hidden(ids, head_w);
  const DecoderArch& a = arch();
  const uint64_t e = s_.elem, D = s_.d_model, S = s_.seq;
  rt_.ctx.module = Module::embedding;
  Tensor embed_w;
  if (s_.tied) {  // both grads meet in the weight's input buffer (ops_nn.h TiedWeight)
    TiedWeight tied(rt_, rt_.param(embed_));
    embed_w = tied.use(1);
    head_w = tied.use(0);
  } else {
    embed_w = rt_.param(embed_);
  }
  Tensor hidden;
  {
    Tensor inputs_embeds = embedding_nn(rt_, embed_w, ids, s_.rows() * D * e, D);
    embed_w.reset();
    // Gemma-3's scaled embedding module: `super().forward(ids) * embed_scale` (a Python
    // float); the raw embedding dies at once.
    if (a.embed_scale && a.embed_scale_at == EmbedScaleAt::embedding)
      inputs_embeds = mul_scalar(rt_, inputs_embeds);
    // PEFT's make_inputs_require_grad forward hook on the embedding module's output.
    if (s_.lora.input_require_grads && rt_.grad_enabled) rt_.requires_grad_(inputs_embeds);
    // transformers 5.x: position_ids = arange + past; masking_utils' masks (decoder_mask_v5.cpp).
    const bool v5 = uses_masking_utils(a);
    Tensor cache_position = v5 ? v5_position_ids(rt_, s_) : new_tensor(rt_, S * 8, OpKind::arange);
    Tensor mask, sliding_mask;
    if (v5)
      v5_masks(rt_, s_, mask, sliding_mask);
    else if (s_.attention == HfAttention::eager)
      mask = causal_mask();
    // Gemma/Gemma-2 v4.45: `hidden_states = inputs_embeds * normalizer`, a host 0-d
    // tensor (no device bytes); inputs_embeds stays bound until the model returns.
    Tensor h0 = inputs_embeds;
    if (a.embed_scale && a.embed_scale_at == EmbedScaleAt::model) h0 = mul_scalar(rt_, inputs_embeds);
    Tensor cos, sin, cos_local, sin_local;
    if (a.rope == RopeAt::model && a.mla.v2_code) {
      cos = rope_table_complex();  // DeepSeek-V2: one complex table (decoder_mla.cpp)
    } else if (a.rope == RopeAt::model) {
      rope_tables(true, cos, sin);
      if (a.rope_local) rope_tables(true, cos_local, sin_local);
    }
    // The decoder loop. With gradient checkpointing HF calls
    // checkpoint(decoder_layer.__call__, hidden_states, causal_mask, position_ids, ...,
    // cache_position, position_embeddings): the frame holds those tensors (position_ids
    // is a view of cache_position).
    Inputs extra = {mask, cache_position, cos, sin};
    if (a.rope_local) {
      extra.push_back(cos_local);
      extra.push_back(sin_local);
    }
    if (sliding_mask.defined()) extra.push_back(sliding_mask);  // 5.x: the sliding layers' mask
    Tensor h = run_layers(rt_, static_cast<int32_t>(s_.layers), std::move(h0), extra,
                          [this](int32_t l, const Tensor& in, const Inputs& ex) {
                            // torchtitan's per-block compile: each layer a region
                            return compile_region(
                                rt_, CompileScope::block, [&] { return layer(l, in, ex); }, l);
                          },
                          layer_ctx_held(v5, a.rope_local, sliding_mask.defined()));
    extra.clear();
    hidden = norm(h, final_norm_, s_.rows(), D);
    // LlamaModel.forward returns: its locals die in declaration order (H100 trace); 5.x's
    // position_ids are bound after the mask dict is (the H200 traces of tf_arch_*).
    inputs_embeds.reset();
    if (!v5) cache_position.reset();
    mask.reset();
    sliding_mask.reset();
    cache_position.reset();
    h.reset();
    cos.reset();
    sin.reset();
    cos_local.reset();
    sin_local.reset();
  }
  return hidden;
}

// lm_head on `rows` rows of hidden and final-logit soft-capping (the projection of
// LlamaForCausalLM / Gemma2ForCausalLM, also one chunk of forward_chunked).
Tensor DecoderModel::head_projection(const Tensor& hidden, const Tensor& head_w, uint64_t rows) {
  const uint64_t e = s_.elem, D = s_.d_model;
  Tensor logits;
  if (s_.tied) {
    logits = mm_linear(rt_, hidden, head_w, rows * s_.vocab * e,
                       2.0 * static_cast<double>(rows) * D * s_.vocab);
  } else {
    logits = lm_linear(hidden, lm_head_, D, s_.vocab, rows);
  }
  if (arch().final_softcap > 0.0) logits = softcap(std::move(logits));
  return logits;
}

// lm_head, final-logit soft-capping, logits.float() (LlamaForCausalLM / Gemma2ForCausalLM).
Tensor DecoderModel::logits_head(const Tensor& hidden, const Tensor& head_w, uint64_t rows) {
  const uint64_t e = s_.elem;
  Tensor logits = head_projection(hidden, head_w, rows);
  rt_.name(logits.storage, rt_.program().intern("logits"));  // program/tensor_names.h
  if (arch().logits_float != LogitsFloat::forward) return logits;
  if (autocast_on())
    logits = to_copy(rt_, logits, logits.bytes / ac_->low_elem() * 4);  // logits.float()
  else if (e != 4)
    logits = to_copy(rt_, logits, logits.bytes / e * 4);  // logits.float()
  else
    return logits;
  rt_.name(logits.storage, rt_.program().intern("logits.float()"));
  return logits;
}

// The causal-LM loss. v4.45: shift_logits = logits[..., :-1, :].contiguous(), shifted
// labels, CrossEntropyLoss (on the fp32 logits where the model upcasts them; GPT-2's in
// the logits' dtype, an fp32 copy inside CUDA autocast's cross_entropy). ForCausalLMLoss
// (v4.47+) upcasts first; from v4.49 it pads the labels and uses the logits whole.
Tensor DecoderModel::loss(const Tensor& logits_in, const Tensor& labels) {
  if (titan()) return loss_titan(logits_in, labels);  // decoder_impl.cpp
  if (tune()) return loss_tune(labels);  // the chunks the forward kept
  if (litgpt()) return loss_litgpt(logits_in);
  ModuleScope module_scope(rt_, Module::loss);
  const DecoderArch& a = arch();
  Tensor logits = logits_in;
  if (a.logits_float == LogitsFloat::loss) {  // `logits = logits.float()`: a copy unless fp32
    const uint64_t le = logits.bytes / (s_.rows() * s_.vocab);
    if (le != 4) {
      logits = to_copy(rt_, logits, logits.bytes / le * 4);
      rt_.name(logits.storage, rt_.program().intern("logits.float()"));
    }
  }
  // The logits' element size: fp32 after an upcast; else low precision under autocast
  // (also when the loss runs outside the region: precision.autocast_region forward).
  const uint64_t e = logits.bytes / (s_.rows() * s_.vocab);
  Tensor out;
  if (a.loss == CausalLoss::pad) {
    // labels = pad(labels, (0, 1), value=-100); shift_labels = labels[..., 1:].contiguous()
    Tensor padded = new_tensor(rt_, s_.batch * (s_.seq + 1) * 8, OpKind::other, TensorKind::temporary);
    Tensor shift_labels = new_tensor(rt_, s_.rows() * 8, OpKind::clone, TensorKind::temporary);
    Tensor logp = log_softmax(rt_, logits);  // logits.view(-1, V): a view
    out = nll_loss(rt_, logp, shift_labels, e);
    logp.reset();
    shift_labels.reset();
    padded.reset();
    return moe_aux_loss(out);  // MoE rows with output_router_logits (decoder_moe.cpp)
  }
  const uint64_t shifted_rows = static_cast<uint64_t>(s_.batch * (s_.seq - 1));
  Tensor shift_logits;
  {
    Tensor sl = slice_seq(rt_, logits, shifted_rows * s_.vocab * e);
    numeric_hint(rt_, NumericHint::shift_logits);
    shift_logits = clone(rt_, sl);  // .contiguous()
  }
  numeric_hint(rt_, NumericHint::shift_labels, labels);  // labels[..., 1:].contiguous()
  Tensor shift_labels = new_tensor(rt_, shifted_rows * 8, OpKind::clone, TensorKind::temporary);
  if (a.logits_float == LogitsFloat::none && autocast_on()) {
    out = torch_cross_entropy_autocast(*ac_, rt_, shift_logits, shift_labels);
  } else {
    Tensor logp = log_softmax(rt_, shift_logits);
    out = nll_loss(rt_, logp, shift_labels, e);
  }
  return moe_aux_loss(out);
}

// --- GPT-2 (GPT2Model / GPT2Block) ---------------------------------------------------------

// GPT2Block.forward: pre-norm residual blocks. The two halves are candidate checkpoint
// regions (graph/checkpoint.h); their lambdas capture values only (a checkpointed half
// is re-run during backward).
Tensor DecoderModel::block_gpt2(int32_t l, const Tensor& x) {
  LayerScope layer_scope(rt_, l);
  Tensor attn_output = run_region(rt_, RegionKind::attention, {x}, [this, l](const Inputs& in) {
    const LayerParams& p = layers_[l];
    Tensor h1 = norm(in[0], p.norm[kInputNorm], s_.rows(), s_.d_model);
    return attention_gpt2(p, h1);
  });
  // Under autocast the branch outputs are low precision: the fp32 residual promotes.
  Tensor r1 = autocast_on() ? add(rt_, ac_->widen(attn_output), x) : add(rt_, attn_output, x);
  if (autocast_on()) Autocast::promoted(rt_, r1, 0, attn_output);
  Tensor ff = run_region(rt_, RegionKind::mlp, {r1}, [this, l](const Inputs& in) {
    const LayerParams& p = layers_[l];
    Tensor h2 = norm(in[0], p.norm[kPostAttnNorm], s_.rows(), s_.d_model);
    return mlp(p, h2);
  });
  Tensor out = autocast_on() ? add(rt_, r1, ac_->widen(ff)) : add(rt_, r1, ff);
  if (autocast_on()) Autocast::promoted(rt_, out, 1, ff);
  attn_output.reset();
  ff.reset();
  r1.reset();
  return out;
}

Tensor DecoderModel::gpt2_hidden(const Tensor& ids, Tensor& head_w) {
  const uint64_t e = s_.elem, D = s_.d_model, S = s_.seq;
  rt_.ctx.module = Module::embedding;
  Tensor wte_w;
  if (s_.tied) {
    TiedWeight wte(rt_, rt_.param(embed_));
    wte_w = wte.use(1);
    head_w = wte.use(0);
    // Under autocast lm_head's grad reaches wte as a fresh fp32 copy (the cast's
    // backward), which the engine's InputBuffer then owns alone: PyTorch 2.x adds the
    // embedding's grad into it in place.
    if (autocast_on() && head_w.grad_fn >= 0) rt_.node(head_w.grad_fn).flags |= kTiedSumInPlace;
  } else {
    wte_w = rt_.param(embed_);
    head_w = rt_.param(lm_head_);
  }
  Tensor hidden;
  {
    Tensor position_ids = new_tensor(rt_, S * 8, OpKind::arange);
    Tensor inputs_embeds = embedding_nn(rt_, wte_w, ids, s_.rows() * D * e, D);
    // PEFT's make_inputs_require_grad hook on get_input_embeddings() (wte).
    if (s_.lora.input_require_grads && rt_.grad_enabled) rt_.requires_grad_(inputs_embeds);
    Tensor position_embeds = embedding_nn(rt_, rt_.param(wpe_), position_ids, S * D * e, D);
    Tensor h = add_bcast(rt_, inputs_embeds, position_embeds);
    h = drop(h);
    // The block loop; with gradient checkpointing HF calls
    // checkpoint(block.__call__, hidden_states, None, attention_mask (None), ...).
    h = run_layers(rt_, static_cast<int32_t>(s_.layers), h, {},
                   [this](int32_t l, const Tensor& in, const Inputs&) {
                     return compile_region(
                         rt_, CompileScope::block, [&] { return block_gpt2(l, in); }, l);
                   });
    rt_.ctx.module = Module::norm;
    hidden = norm(h, final_norm_, s_.rows(), D);
  }  // GPT2Model.forward returns: its locals (embeddings, position ids) die
  return hidden;
}

// GPT-2's lm_head on `rows` rows of hidden.
Tensor DecoderModel::gpt2_head(const Tensor& hidden, const Tensor& head_w, uint64_t rows) {
  const uint64_t e = s_.elem, D = s_.d_model;
  const double flops = 2.0 * static_cast<double>(rows) * D * s_.vocab;
  Tensor logits;
  if (autocast_on()) {  // F.linear casts W (cached; the tied handle), then x
    const int32_t w = s_.tied ? embed_ : lm_head_;
    Tensor wc = ac_->weight(w, /*grad_transposed=*/false, &head_w);
    const uint64_t low_in = rows * D * ac_->low_elem();
    Tensor xc = hidden.bytes == low_in ? hidden : ac_->cast(hidden, low_in);
    logits = mm_linear(rt_, xc, wc, rows * s_.vocab * ac_->low_elem(), flops);
  } else {
    logits = mm_linear(rt_, hidden, head_w, rows * s_.vocab * e, flops);
  }
  rt_.name(logits.storage, rt_.program().intern("logits"));  // program/tensor_names.h
  return logits;
}

}  // namespace memsim::graph
