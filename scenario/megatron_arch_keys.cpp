#include "scenario/megatron_arch_keys.h"

#include <string>

#include "scenario/model_architecture.h"

namespace memsim::scenario_detail {

namespace {

const char* const kKnobs[] = {"model.mlp", "model.activation", "model.qkv_bias", "model.o_bias",
                              "model.mlp_bias"};

std::string at(const Doc& d, const std::string& key, const std::string& fallback) {
  if (const Field* f = d.find(key)) return f->where;
  if (const Field* f = d.find(fallback)) return f->where;
  return d.where_missing("model");
}

}  // namespace

bool is_megatron_arch_knob(const std::string& key) {
  for (const char* k : kKnobs)
    if (key == k) return true;
  return false;
}

void read_megatron_arch(const Doc& d, Scenario& s) {
  if (s.model.family != ModelFamily::megatron) return;
  MegatronArchConfig& c = s.megatron_arch;
  graph::MlpKind mlp = graph::MlpKind::plain;
  graph::Activation act = graph::Activation::gelu;
  if (const Field* f = d.find("model.mlp")) mlp = read_enum(*f, "model.mlp", mlp_names());
  if (const Field* f = d.find("model.activation")) act = read_enum(*f, "model.activation", activation_names());
  if (mlp == graph::MlpKind::glu) {
    if (act != graph::Activation::silu)
      fail(at(d, "model.activation", "model.mlp"), "model.activation",
           "a gated MLP in Megatron is --swiglu (silu); other gated activations (--quick-geglu, "
           "a GeGLU) are not modelled: use silu");
    c.swiglu = true;
  } else if (act != graph::Activation::gelu) {
    fail(at(d, "model.activation", "model.mlp"), "model.activation",
         "Megatron's plain MLP is modelled with its default F.gelu only (--squared-relu and "
         "the others are not); use gelu, or model.mlp glu with silu for --swiglu");
  }
  bool qkv = true, o = true, m = true;
  if (const Field* f = d.find("model.qkv_bias")) qkv = read_bool(*f, "model.qkv_bias");
  if (const Field* f = d.find("model.o_bias")) o = read_bool(*f, "model.o_bias");
  if (const Field* f = d.find("model.mlp_bias")) m = read_bool(*f, "model.mlp_bias");
  if (o != m)
    fail(at(d, o ? "model.mlp_bias" : "model.o_bias", "model"), o ? "model.mlp_bias" : "model.o_bias",
         "Megatron has one flag for the projection and MLP biases (--disable-bias-linear): "
         "model.o_bias and model.mlp_bias must be equal");
  if (o && !qkv)
    fail(at(d, "model.qkv_bias", "model"), "model.qkv_bias",
         "with linear biases on (add_bias_linear) Megatron always adds the QKV bias "
         "(arguments.py: add_qkv_bias = True); set model.o_bias / model.mlp_bias false too");
  c.bias_linear = o;
  c.qkv_bias = qkv;
  // The same, resolved, in the model's knobs when they are not Megatron's defaults (the
  // GeLU GPT with biases; a default scenario keeps its knobs untouched, which numeric mode's
  // and the stacks' checks read): sim/analysis/parameter_count.cpp counts from them.
  if (c.swiglu || !c.bias_linear || !c.qkv_bias) {
    s.model.arch.mlp = mlp;
    s.model.arch.act = act;
    s.model.arch.qkv_bias = qkv;
    s.model.arch.o_bias = o;
    s.model.arch.mlp_bias = m;
    s.model.arch.architecture = kMegatronArchitecture;
  }

  const ModelConfig& mc = s.model;
  if (mc.kv_heads != 0 && mc.kv_heads != mc.heads && mc.attention == AttentionImpl::eager)
    fail(at(d, "model.kv_heads", "model.attention"), "model.kv_heads",
         "grouped-query attention is modelled with fused attention only (model.attention flash: "
         "Transformer Engine on the query copy and the key / value views); the local "
         "DotProductAttention's repeat_interleave of keys and values is not");
  if (c.swiglu && c.bias_linear && mc.arch.moe.experts > 0)
    fail(at(d, "model.mlp_bias", "model.mlp"), "model.mlp_bias",
         "a SwiGLU expert with a bias raises in Megatron (weighted_bias_swiglu_impl: \"Bias is "
         "not supported for weighted swiglu fusion\"); set model.o_bias and model.mlp_bias false "
         "(--disable-bias-linear)");
}

}  // namespace memsim::scenario_detail
