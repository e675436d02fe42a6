// Doc -> Scenario: presets first, explicit keys over them, then the checks that need
// several keys at once (divisibility, lengths, 64-bit products).
#include <algorithm>
#include <array>
#include <charconv>
#include <optional>
#include <cstdint>
#include <limits>
#include <string>

#include "allocator/units.h"
#include "scenario/scenario_lora.h"
#include "scenario/scenario_implementation.h"
#include "scenario/torchtune_keys.h"
#include "scenario/torchtitan_fsdp2_keys.h"
#include "scenario/offload_activations_key.h"
#include "scenario/scenario_checkpoint.h"
#include "scenario/deepspeed_keys.h"
#include "scenario/compile_keys.h"
#include "scenario/offload_keys.h"
#include "scenario/serve_keys.h"
#include "scenario/fsdp_keys.h"
#include "scenario/scenario_family.h"
#include "scenario/pipeline_keys.h"
#include "scenario/context_parallel_keys.h"
#include "scenario/torchtitan_keys.h"
#include "scenario/scenario_arch.h"
#include "scenario/device_defaults.h"
#include "scenario/deepseek_keys.h"
#include "scenario/megatron_arch_keys.h"
#include "scenario/megatron_moe_keys.h"
#include "scenario/moe_keys.h"
#include "scenario/scenario_doc.h"
#include "scenario/script_keys.h"
#include "scenario/step_output_key.h"
#include "scenario/lora_target_parameters_key.h"
#include "scenario/peft_input_grads_key.h"
#include "scenario/peft_kbit_key.h"
#include "scenario/lora_compute_dtype_key.h"
#include "scenario/device_rate_keys.h"
#include "scenario/generate_keys.h"
#include "scenario/loop_limits.h"
#include "scenario/sdpa_kernel_keys.h"

namespace memsim::scenario_detail {
namespace {

const std::vector<std::pair<std::string, AttentionImpl>> kAttention = {
    {"eager", AttentionImpl::eager}, {"flash", AttentionImpl::flash},
    {"mem-efficient", AttentionImpl::mem_efficient}, {"cudnn", AttentionImpl::cudnn}};
const std::vector<std::pair<std::string, SoftmaxImpl>> kSoftmax = {
    {"staff", SoftmaxImpl::staff}, {"exp-twice", SoftmaxImpl::exp_twice}};
const std::vector<std::pair<std::string, SdpaImpl>> kSdpa = {
    {"staff", SdpaImpl::staff}, {"masked-fill", SdpaImpl::masked_fill}};
const std::vector<std::pair<std::string, SwigluImpl>> kSwiglu = {
    {"staff", SwigluImpl::staff}, {"projections-first", SwigluImpl::projections_first}};
const std::vector<std::pair<std::string, DType>> kDTypes = {
    {"fp32", DType::fp32}, {"bf16", DType::bf16}, {"fp16", DType::fp16}};
const std::vector<std::pair<std::string, std::optional<DType>>> kAutocast = {
    {"none", std::nullopt}, {"bf16", DType::bf16}, {"fp16", DType::fp16}};
const std::vector<std::pair<std::string, AutocastRegion>> kAutocastRegions = {
    {"forward", AutocastRegion::forward},
    {"forward-and-loss", AutocastRegion::forward_and_loss},
    {"whole-step", AutocastRegion::whole_step},
    {"whole-run", AutocastRegion::whole_run}};
const std::vector<std::pair<std::string, OptimizerType>> kOptimizers = {
    {"adamw", OptimizerType::adamw}, {"adam", OptimizerType::adam},
    {"sgd", OptimizerType::sgd}, {"none", OptimizerType::none},
    {"adam8bit", OptimizerType::adam8bit}, {"adamw8bit", OptimizerType::adamw8bit},
    {"adafactor", OptimizerType::adafactor}};
const std::vector<std::pair<std::string, OptimizerImpl>> kImpls = {
    {"for-loop", OptimizerImpl::for_loop}, {"foreach", OptimizerImpl::foreach},
    {"fused", OptimizerImpl::fused}, {"cs336", OptimizerImpl::cs336},
    {"out-of-place", OptimizerImpl::out_of_place}};
const std::vector<std::pair<std::string, StepKind>> kSteps = {
    {"train", StepKind::train}, {"forward", StepKind::forward},
    {"forward-no-grad", StepKind::forward_no_grad},
    {"forward-backward", StepKind::forward_backward},
    {"generate", StepKind::generate}};  // issue #17 (scenario/generate_keys.h)
const std::vector<std::pair<std::string, bool>> kZeroGrad = {{"set_to_none", true},
                                                             {"zeros", false}};

// Where a value that may have come from a preset was decided: its own line, else the
// preset's, else its section's.
std::string origin(const Doc& d, const std::string& key, const std::string& section) {
  if (const Field* f = d.find(key)) return f->where;
  if (const Field* p = d.find(section + ".preset")) return p->where;
  if (const Field* h = d.find(section + ".hf_config")) return h->where;
  return d.where_missing(section);
}

template <typename T, typename Read>
void read_if(const Doc& d, const std::string& key, T& out, Read read) {
  if (const Field* f = d.find(key)) out = read(*f, key);
}

// The model section; `config_params` receives model.hf_config's torch_dtype (the
// default of precision.params).
ModelConfig build_model(const Doc& d, std::optional<DType>& config_params) {
  const ModelBase base = read_model_base(d);  // model.preset / model.hf_config
  ModelConfig m = base.model;
  const ModelConfig* preset = base.given ? &base.model : nullptr;
  config_params = base.params;
  read_if(d, "model.family", m.family,
          [](const Field& f, const std::string& k) { return read_enum(f, k, family_spellings()); });
  for (auto [key, out] : {std::pair{"model.layers", &m.layers}, {"model.d_model", &m.d_model},
                          {"model.heads", &m.heads}, {"model.d_ff", &m.d_ff},
                          {"model.vocab", &m.vocab}}) {
    if (const Field* f = d.find(key)) {
      *out = read_int(*f, key, 1);
    } else if (!preset) {
      fail(d.where_missing("model"), key, "required when no model.preset or model.hf_config is given");
    }
  }
  // An MHA preset keeps kv_heads == heads when only heads is changed; a GQA preset
  // keeps its KV head count.
  if (const Field* f = d.find("model.kv_heads")) {
    m.kv_heads = read_int(*f, "model.kv_heads", 1);
  } else if (!preset || preset->kv_heads == preset->heads) {
    m.kv_heads = m.heads;
  }
  read_if(d, "model.context_length", m.context_length,
          [](const Field& f, const std::string& k) { return read_int(f, k, 1); });
  read_if(d, "model.tied_embeddings", m.tied_embeddings, read_bool);
  read_if(d, "model.attention", m.attention,
          [](const Field& f, const std::string& k) { return read_enum(f, k, kAttention); });
  read_if(d, "model.softmax", m.softmax,
          [](const Field& f, const std::string& k) { return read_enum(f, k, kSoftmax); });
  read_if(d, "model.sdpa", m.sdpa,
          [](const Field& f, const std::string& k) { return read_enum(f, k, kSdpa); });
  read_if(d, "model.swiglu", m.swiglu,
          [](const Field& f, const std::string& k) { return read_enum(f, k, kSwiglu); });
  if (const Field* f = d.find("model.dropout")) {
    m.dropout = read_number(*f, "model.dropout");
    if (m.dropout < 0.0 || m.dropout >= 1.0) {
      fail(f->where, "model.dropout", "expected a probability in [0, 1), got '" + f->node.Scalar() + "'");
    }
  }
  read_architecture(d, base, m);  // model.architecture and the knobs (scenario/scenario_arch.h)
  read_moe(d, m);                 // model.moe (scenario/moe_keys.h)
  return m;
}

void check_model(const Doc& d, const ModelConfig& m) {
  // An explicit head_dim (Gemma, Qwen3) need not be d_model / heads.
  if (m.arch.head_dim == 0 && m.d_model % m.heads != 0) {
    fail(origin(d, "model.heads", "model"), "model.heads",
         std::to_string(m.heads) + " heads do not divide d_model " + std::to_string(m.d_model));
  }
  if (m.kv_heads > m.heads || m.heads % m.kv_heads != 0) {
    fail(origin(d, "model.kv_heads", "model"), "model.kv_heads",
         std::to_string(m.kv_heads) + " KV heads do not divide " + std::to_string(m.heads) + " heads");
  }
  const bool rope = family_row(m.family).rope;
  if (rope && head_dim(m) % 2 != 0) {
    const char* key = m.arch.head_dim > 0 ? "model.head_dim" : "model.heads";
    fail(origin(d, key, "model"), key,
         "RoPE needs an even head size, " +
             std::string(m.arch.head_dim > 0 ? "head_dim = " : "d_model/heads = ") +
             std::to_string(head_dim(m)));
  }
  check_architecture(d, m);  // scenario/scenario_arch.h
}

BatchConfig build_batch(const Doc& d, ModelConfig& m) {
  BatchConfig b;
  auto positive = [](const Field& f, const std::string& k) { return read_int(f, k, 1); };
  read_if(d, "batch.micro_batch", b.micro_batch, positive);
  read_if(d, "batch.grad_accum", b.grad_accum,  // bounded: scenario/loop_limits.h
          [](const Field& f, const std::string& k) { return read_loop_count(f, k, 1); });
  if (const Field* f = d.find("batch.seq_len")) {
    b.seq_len = read_int(*f, "batch.seq_len", 1);
  } else if (generate_requested(d)) {
    b.seq_len = 0;  // step.kind generate: prompt_len + new_tokens (scenario/generate_keys.h)
    return b;
  } else if (m.context_length > 0) {
    b.seq_len = m.context_length;  // a fixed-context preset runs at its full length
  } else {
    fail(d.where_missing("batch"), "batch.seq_len", "required (the model has no context length to default to)");
  }
  if (d.find("model.context_length")) {
    if (b.seq_len > m.context_length) {
      fail(origin(d, "batch.seq_len", "batch"), "batch.seq_len",
           std::to_string(b.seq_len) + " is longer than model.context_length " +
               std::to_string(m.context_length));
    }
  } else if (m.context_length > 0 && b.seq_len > m.context_length) {
    // A preset's (or config.json's) context length is the model's: GPT-2's position table
    // has 1024 rows, and a longer sequence is an index error in PyTorch. Growing it is a
    // different model, so only an explicit model.context_length extends it.
    const char* from_key = d.find("model.preset") ? "model.preset" : "model.hf_config";
    const Field* from = d.find(from_key);
    fail(origin(d, "batch.seq_len", "batch"), "batch.seq_len",
         std::to_string(b.seq_len) + " is longer than the model's context length " +
             std::to_string(m.context_length) +
             (from ? " (that of " + std::string(from_key) + " " + describe(from->node) + ")" : std::string()) +
             "; set model.context_length: " + std::to_string(b.seq_len) +
             " to extend the model (a larger position table or RoPE cache)");
  } else {
    m.context_length = std::max(m.context_length, b.seq_len);
  }
  return b;
}

PrecisionConfig build_precision(const Doc& d, std::optional<DType> params_default) {
  PrecisionConfig p;
  p.params = params_default.value_or(DType::fp32);  // model.hf_config's torch_dtype
  read_if(d, "precision.params", p.params,
          [](const Field& f, const std::string& k) { return read_enum(f, k, kDTypes); });
  if (const Field* f = d.find("precision.autocast"); f && !is_null(f->node)) {
    p.autocast = read_enum(*f, "precision.autocast", kAutocast);  // null reads as none
  }
  read_if(d, "precision.autocast_region", p.autocast_region,
          [](const Field& f, const std::string& k) { return read_enum(f, k, kAutocastRegions); });
  if (const Field* f = d.find("precision.autocast_cache")) {  // docs/autocast.md
    p.autocast_cache = read_bool(*f, "precision.autocast_cache");
    if (!p.autocast)
      fail(f->where, "precision.autocast_cache",
           "torch.autocast's cache_enabled only applies with precision.autocast bf16 or fp16");
  }
  if (const Field* f = d.find("precision.grad_scaler"))  // sim/step/grad_scaler.h
    p.grad_scaler = read_bool(*f, "precision.grad_scaler");
  if (const Field* f = d.find("precision.master_weights")) {
    p.master_weights = read_bool(*f, "precision.master_weights");
    if (p.master_weights && p.params == DType::fp32) {
      fail(f->where, "precision.master_weights",
           "an fp32 master copy needs bf16 or fp16 params, but precision.params is fp32");
    }
  }
  return p;
}

OptimizerConfig build_optimizer(const Doc& d) {
  OptimizerConfig o;
  read_if(d, "optimizer.type", o.type,
          [](const Field& f, const std::string& k) { return read_enum(f, k, kOptimizers); });
  read_if(d, "optimizer.impl", o.impl,
          [](const Field& f, const std::string& k) { return read_enum(f, k, kImpls); });
  if (o.impl == OptimizerImpl::cs336 && o.type != OptimizerType::adamw &&
      o.type != OptimizerType::none) {
    fail(origin(d, "optimizer.impl", "optimizer"), "optimizer.impl",
         std::string("cs336 is the CS336 staff AdamW, but optimizer.type is ") + to_string(o.type));
  }
  if ((o.type == OptimizerType::adam8bit || o.type == OptimizerType::adamw8bit) &&
      o.impl != OptimizerImpl::foreach && d.find("optimizer.impl")) {
    fail(origin(d, "optimizer.impl", "optimizer"), "optimizer.impl",
         std::string(to_string(o.type)) + " is bitsandbytes' fused 8-bit kernel, which has no "
         "torch.optim implementation variants; leave optimizer.impl out");
  }
  if (o.type == OptimizerType::adafactor && o.impl != OptimizerImpl::foreach && d.find("optimizer.impl")) {
    fail(origin(d, "optimizer.impl", "optimizer"), "optimizer.impl",
         "adafactor is transformers.optimization.Adafactor, a per-parameter loop with no "
         "implementation variants; leave optimizer.impl out");
  }
  if (const Field* f = d.find("optimizer.momentum")) {
    o.momentum = read_number(*f, "optimizer.momentum");
    if (o.momentum < 0.0) fail(f->where, "optimizer.momentum", "expected a number >= 0, got '" + f->node.Scalar() + "'");
    if (o.momentum != 0.0 && o.type != OptimizerType::sgd) {
      fail(f->where, "optimizer.momentum", std::string("applies to sgd only, but optimizer.type is ") + to_string(o.type));
    }
  }
  // Gradient clipping (sim/step/clip_grad.h). null, none or 0 = off (HF Trainer clips only
  // when max_grad_norm > 0).
  if (const Field* f = d.find("optimizer.max_grad_norm")) {
    const bool off = is_null(f->node) || f->node.Scalar() == "none";
    if (!off) {
      const double v = read_number(*f, "optimizer.max_grad_norm");
      if (!(v >= 0.0))
        fail(f->where, "optimizer.max_grad_norm", "expected a number >= 0 (0 or null: no clipping), got '" + f->node.Scalar() + "'");
      if (v > 0.0) o.max_grad_norm = v;
    }
  }
  const bool clipping = o.max_grad_norm.has_value();
  for (const char* key : {"optimizer.clip_foreach", "optimizer.clip_error_if_nonfinite", "optimizer.clip_keep_norm"}) {
    const Field* f = d.find(key);
    if (f == nullptr) continue;
    const bool v = read_bool(*f, key);
    if (v && !clipping && std::string_view(key) != "optimizer.clip_foreach")
      fail(f->where, key, "applies to gradient clipping, but optimizer.max_grad_norm is not set");
    if (std::string_view(key) == "optimizer.clip_foreach") o.clip_foreach = v;
    else if (std::string_view(key) == "optimizer.clip_error_if_nonfinite") o.clip_error_if_nonfinite = v;
    else o.clip_keep_norm = v;
  }
  return o;
}

StepConfig build_step(const Doc& d) {
  StepConfig s;
  read_if(d, "step.kind", s.kind,
          [](const Field& f, const std::string& k) { return read_enum(f, k, kSteps); });
  read_if(d, "step.warmup_steps", s.warmup_steps,  // bounded: scenario/loop_limits.h
          [](const Field& f, const std::string& k) { return read_loop_count(f, k, 0); });
  read_if(d, "step.zero_grad", s.zero_grad_set_to_none,
          [](const Field& f, const std::string& k) { return read_enum(f, k, kZeroGrad); });
  read_compile(d, s);  // scenario/compile_keys.cpp
  return s;
}

CheckpointConfig build_checkpoint(const Doc& d, const ModelConfig& m) {
  CheckpointConfig c;
  if (const Field* f = d.find("checkpoint.policy")) {
    const std::string text = read_string(*f, "checkpoint.policy");
    if (text.find(':') == std::string::npos) {
      c.policy = read_enum(*f, "checkpoint.policy", checkpoint_policy_spellings());
      if (c.policy == CheckpointPolicy::sac_layer)
        fail(f->where, "checkpoint.policy",
             "expected sac-layer:N (torchtitan's selective_ac_option N: every N-th layer "
             "checkpointed whole)");
    } else {
      // The short form `compare --policies` takes ("uniform:2", "custom:0,3.mlp"), so a
      // policy can be written, and --set, the same way everywhere.
      CheckpointConfig spec;
      try {
        spec = parse_policy(text);
      } catch (const PolicyError& e) {
        fail(f->where, "checkpoint.policy", e.what());
      }
      for (const char* key : {"checkpoint.layers_per_segment", "checkpoint.custom"})
        if (d.find(key))
          fail(f->where, "checkpoint.policy",
               "'" + text + "' already gives its argument; leave " + key + " out");
      c.policy = spec.policy;
      c.layers_per_segment = spec.layers_per_segment;
      c.custom = spec.custom;
    }
  }
  if (const Field* f = d.find("checkpoint.layers_per_segment"))
    c.layers_per_segment = read_int(*f, "checkpoint.layers_per_segment", 1);
  if (const Field* f = d.find("checkpoint.custom"))
    c.custom = read_string_list(*f, "checkpoint.custom");
  // Checked after both spellings are read, naming the key that gave the value.
  if (c.layers_per_segment > m.layers) {
    const char* key = d.find("checkpoint.layers_per_segment") ? "checkpoint.layers_per_segment"
                                                              : "checkpoint.policy";
    fail(origin(d, key, "checkpoint"), key,
         std::to_string(c.layers_per_segment) + " is more than the model's " +
             std::to_string(m.layers) + " layers");
  }
  for (const auto& item : c.custom) {
    // A plain number is a layer index; anything else names modules.
    if (!item.empty() && item.find_first_not_of("0123456789") == std::string::npos &&
        (item.size() > 18 || std::stoll(item) >= m.layers)) {
      const char* key = d.find("checkpoint.custom") ? "checkpoint.custom" : "checkpoint.policy";
      fail(origin(d, key, "checkpoint"), key,
           "layer " + item + " does not exist (the model has " + std::to_string(m.layers) +
               " layers, 0-based)");
    }
  }
  if (const Field* f = d.find("checkpoint.early_stop"))
    c.early_stop = read_bool(*f, "checkpoint.early_stop");
  if (const Field* f = d.find("checkpoint.reentrant")) {
    c.reentrant = read_bool(*f, "checkpoint.reentrant");
    // Megatron's tensor_parallel.checkpoint is reentrant; it has no other mode.
    if (!*c.reentrant && family_row(m.family).reentrant_checkpoint_only)
      fail(f->where, "checkpoint.reentrant",
           "Megatron-LM recomputes with its own reentrant CheckpointFunction; false is not "
           "a Megatron setting (leave the key out)");
  }
  // torch.utils.checkpoint's early_stop applies to a non-reentrant region only; with no
  // region, a reentrant one or Megatron's CheckpointFunction the key would change nothing.
  if (const Field* f = d.find("checkpoint.early_stop")) {
    if (c.policy == CheckpointPolicy::none)
      fail(f->where, "checkpoint.early_stop",
           "checkpoint.policy is none: no checkpoint region to stop early (remove the key)");
    if (c.reentrant.value_or(false) || family_row(m.family).reentrant_checkpoint_only)
      fail(f->where, "checkpoint.early_stop",
           "early_stop is an option of non-reentrant checkpointing only (use_reentrant=False); "
           "a reentrant re-run always runs the whole region (remove the key)");
  }
  // The list says what to checkpoint for "custom" (layers or modules) and may narrow
  // "modules" to named modules; any other policy would silently ignore it.
  if (c.policy == CheckpointPolicy::custom && c.custom.empty()) {
    fail(origin(d, "checkpoint.policy", "checkpoint"), "checkpoint.policy",
         "policy custom needs checkpoint.custom (layer indices or module names)");
  }
  read_offload(d, m, c);  // checkpoint.offload (scenario/offload_keys.h)
  if (c.policy != CheckpointPolicy::custom && c.policy != CheckpointPolicy::modules &&
      !c.custom.empty()) {
    fail(d.find("checkpoint.custom")->where, "checkpoint.custom",
         std::string("only used with checkpoint.policy custom or modules, but the policy is ") +
             to_string(c.policy));
  }
  return c;
}

ParallelConfig build_parallel(const Doc& d, const ModelConfig& m) {
  ParallelConfig p;
  auto positive = [](const Field& f, const std::string& k) { return read_int(f, k, 1); };
  read_if(d, "parallel.data", p.data, positive);
  read_if(d, "parallel.tensor", p.tensor, positive);
  read_if(d, "parallel.pipeline", p.pipeline, positive);
  if (const Field* f = d.find("parallel.zero")) {
    p.zero = read_int(*f, "parallel.zero", 0);
    if (p.zero > 3) fail(f->where, "parallel.zero", "expected a ZeRO stage 0-3, got '" + f->node.Scalar() + "'");
  }
  read_sharding(d, p);  // scenario/fsdp_keys.cpp
  if (const Field* f = d.find("parallel.sequence")) p.sequence = read_bool(*f, "parallel.sequence");
  // Tensor parallelism splits heads (and KV groups) across ranks; pipeline stages take
  // whole layers, as Megatron requires.
  if (m.heads % p.tensor != 0 || m.kv_heads % p.tensor != 0) {
    fail(origin(d, "parallel.tensor", "parallel"), "parallel.tensor",
         std::to_string(p.tensor) + " ranks do not divide " + std::to_string(m.heads) +
             " heads / " + std::to_string(m.kv_heads) + " KV heads");
  }
  read_pipeline_schedule(d, p);  // scenario/pipeline_keys.cpp
  read_pipeline_split(d, m, p);   // whole layers per stage, as Megatron splits them
  return p;
}

DeviceConfig build_device(const Doc& d) {
  // No device at all means the design's reference GPU, an H100 80GB. A capacity with no
  // preset describes a device by hand: the measured H100 CUDA context unless
  // device.cuda_context says otherwise (scenario/device_defaults.h), and the default
  // (non-sm_90) cuBLAS workspace.
  std::string name = d.find("device.capacity") ? "" : "h100-80gb";
  const Field* preset_field = d.find("device.preset");
  if (preset_field) name = read_string(*preset_field, "device.preset");
  DeviceConfig dev;
  if (!name.empty()) {
    const DeviceConfig* preset = find_device_preset(name);
    if (!preset) {
      std::vector<std::string> names;
      for (const auto& p : device_presets()) names.push_back(p.name);
      fail(preset_field->where, "device.preset",
           "unknown device preset '" + name + "'" + did_you_mean(name, names) +
               " (`memsim presets` lists them)");
    }
    dev = *preset;
  }
  read_if(d, "device.capacity", dev.capacity, read_size);
  if (name.empty() && !d.find("device.cuda_context")) dev.cuda_context = kDefaultCudaContext;
  read_if(d, "device.cuda_context", dev.cuda_context, read_size);
  read_if(d, "device.cublas_workspace", dev.cublas_workspace, read_size);
  read_if(d, "device.kernel_scratch", dev.kernel_scratch, read_bool);
  read_device_rates(d, dev);  // the time model's rates (scenario/device_rate_keys.h)
  if (dev.capacity == 0) fail(origin(d, "device.capacity", "device"), "device.capacity", "must be more than 0 bytes");
  if (name.empty() && !d.find("device.cuda_context") && dev.cuda_context >= dev.capacity) {
    fail(origin(d, "device.capacity", "device"), "device.capacity",
         human_bytes(dev.capacity) + " is not more than the " + human_bytes(dev.cuda_context) +
             " CUDA context memsim assumes for a device without device.preset (measured on an "
             "H100); set device.cuda_context (0 for none) or a device.preset");
  }
  if (dev.cuda_context >= dev.capacity) {
    fail(origin(d, "device.cuda_context", "device"), "device.cuda_context",
         human_bytes(dev.cuda_context) + " leaves nothing of the " + human_bytes(dev.capacity) + " capacity");
  }
  return dev;
}

// Products of scenario numbers that tensor sizes are made of must fit in int64 bytes
// (every size downstream is int64_t). Blames the largest factor the user wrote.
struct Factor {
  const char* key;
  int64_t value;
};
void check_product(const Doc& d, const std::string& what, std::initializer_list<Factor> factors,
                   int64_t scale) {
  int64_t product = scale;
  bool overflow = false;
  for (const Factor& f : factors) overflow = overflow || __builtin_mul_overflow(product, f.value, &product);
  if (!overflow) return;
  const Factor* blamed = nullptr;
  for (const Factor& f : factors) {
    if (d.find(f.key) && (!blamed || f.value > blamed->value)) blamed = &f;
  }
  const char* key = blamed ? blamed->key : factors.begin()->key;
  const std::string section = std::string(key).substr(0, std::string(key).find('.'));
  fail(origin(d, key, section), key, what + " overflows 64 bits");
}

void check_products(const Doc& d, const Scenario& s) {
  const ModelConfig& m = s.model;
  const int64_t B = s.batch.micro_batch, S = s.batch.seq_len;
  // 4 bytes: the widest dtype a tensor of the step can have.
  check_product(d, "micro_batch*seq_len*d_model*4 bytes",
                {{"batch.micro_batch", B}, {"batch.seq_len", S}, {"model.d_model", m.d_model}}, 4);
  check_product(d, "micro_batch*seq_len*d_ff*4 bytes",
                {{"batch.micro_batch", B}, {"batch.seq_len", S}, {"model.d_ff", m.d_ff}}, 4);
  check_product(d, "micro_batch*seq_len*vocab*4 bytes (logits)",
                {{"batch.micro_batch", B}, {"batch.seq_len", S}, {"model.vocab", m.vocab}}, 4);
  check_product(d, "micro_batch*heads*seq_len^2*4 bytes (attention scores)",
                {{"batch.micro_batch", B}, {"model.heads", m.heads}, {"batch.seq_len", S},
                 {"batch.seq_len", S}},
                4);
  check_product(d, "context_length*d_model*4 bytes",
                {{"model.context_length", m.context_length}, {"model.d_model", m.d_model}}, 4);
  check_product(d, "vocab*d_model*16 bytes (embedding with grads and Adam state)",
                {{"model.vocab", m.vocab}, {"model.d_model", m.d_model}}, 16);
  // Per layer 4 d_model^2 (attention) + 3 d_model*d_ff (FFN) parameters; 16 bytes each
  // with gradients and Adam state. 7*max(d_model, d_ff) bounds 4 d + 3 f.
  check_product(d, "layers*d_model*(4*d_model+3*d_ff)*16 bytes (parameters, grads, Adam state)",
                {{"model.layers", m.layers}, {"model.d_model", m.d_model},
                 {"model.d_ff", std::max(m.d_model, m.d_ff)}},
                7 * 16);
}

bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// roundup_power2_divisions as a {K: D} map (K in MiB or ">") or as PyTorch's "[K:D,...]"
// text; both become PyTorch's syntax so that AllocatorConfig::parse owns its semantics.
std::array<uint32_t, 16> read_roundup(const Field& f, const std::string& key) {
  std::string conf;
  if (f.node.IsMap()) {
    for (auto it = f.node.begin(); it != f.node.end(); ++it) {
      const std::string k = it->first.IsScalar() ? it->first.Scalar() : "";
      if (k != ">") {
        const int64_t mib = read_int(Field{it->first, f.where}, key, 1);
        if (!is_power_of_two(mib)) fail(f.where, key, "interval " + k + " MiB is not a power of 2");
      }
      const int64_t div = read_int(Field{it->second, f.where}, key, 0);
      if (div != 0 && !is_power_of_two(div)) {
        fail(f.where, key, "divisions " + std::to_string(div) + " is not a power of 2 (or 0)");
      }
      conf += (conf.empty() ? "" : ",") + k + ":" + std::to_string(div);
    }
    conf = "[" + conf + "]";
  } else {
    conf = read_string(f, key);
    if (conf.empty() || conf.front() != '[') {
      int64_t div = 0;
      const char* end = conf.data() + conf.size();
      const auto [ptr, ec] = std::from_chars(conf.data(), end, div);
      if (ec != std::errc() || ptr != end || !is_power_of_two(div) || div > (1 << 30)) {
        fail(f.where, key,
             "expected a power of 2, a {MiB: divisions} mapping or PyTorch's \"[256:1,>:8]\", got '" +
                 conf + "'");
      }
      std::array<uint32_t, 16> all{};
      all.fill(static_cast<uint32_t>(div));
      return all;
    }
  }
  try {
    return AllocatorConfig::parse("roundup_power2_divisions:" + conf).roundup_power2_divisions;
  } catch (const std::exception& e) {
    fail(f.where, key, e.what());
  }
}

uint64_t read_mb_over_20(const Field& f, const std::string& key) {
  const int64_t mb = read_int(f, key, 0);
  if (mb <= 20) fail(f.where, key, "must be more than 20 (PyTorch's minimum), got '" + f.node.Scalar() + "'");
  if (mb > std::numeric_limits<int64_t>::max() >> 20) fail(f.where, key, "overflows 64 bits in bytes");
  return static_cast<uint64_t>(mb) << 20;
}

double read_open_fraction(const Field& f, const std::string& key, bool one_allowed) {
  const double v = read_number(f, key);
  if (v <= 0.0 || v > 1.0 || (!one_allowed && v == 1.0)) {
    fail(f.where, key, std::string("expected a number in (0, 1") + (one_allowed ? "]" : ")") +
                           ", got '" + f.node.Scalar() + "'");
  }
  return v;
}

}  // namespace

AllocatorConfig build_allocator(const Doc& d, AllocatorConfig c) {
  if (const Field* f = d.find("allocator.conf"); f && !is_null(f->node)) {
    try {
      c = AllocatorConfig::parse(read_string(*f, "allocator.conf"));
    } catch (const ScenarioError&) {
      throw;
    } catch (const std::exception& e) {
      fail(f->where, "allocator.conf", e.what());
    }
  }
  read_if(d, "allocator.expandable_segments", c.expandable_segments, read_bool);
  if (const Field* f = d.find("allocator.max_split_size_mb")) {
    c.max_split_size = is_null(f->node) ? AllocatorConfig::kUnlimited : read_mb_over_20(*f, "allocator.max_split_size_mb");
  }
  if (const Field* f = d.find("allocator.max_non_split_rounding_mb")) {
    c.max_non_split_rounding = is_null(f->node) ? 20 * MiB : read_mb_over_20(*f, "allocator.max_non_split_rounding_mb");
  }
  if (const Field* f = d.find("allocator.garbage_collection_threshold")) {
    c.garbage_collection_threshold =
        is_null(f->node) ? 0.0 : read_open_fraction(*f, "allocator.garbage_collection_threshold", false);
  }
  if (const Field* f = d.find("allocator.memory_fraction")) {
    c.memory_fraction = is_null(f->node) ? std::nullopt
                                         : std::optional(read_open_fraction(*f, "allocator.memory_fraction", true));
  }
  if (const Field* f = d.find("allocator.roundup_power2_divisions")) {
    c.roundup_power2_divisions = is_null(f->node) ? std::array<uint32_t, 16>{}
                                                  : read_roundup(*f, "allocator.roundup_power2_divisions");
  }
  return c;
}

Scenario build_scenario(const Doc& d) {
  Scenario s;
  if (const Field* f = d.find("name")) s.name = read_string(*f, "name");
  std::optional<DType> config_params;
  s.model = build_model(d, config_params);
  check_model(d, s.model);
  s.batch = build_batch(d, s.model);
  s.precision = build_precision(d, config_params);
  s.optimizer = build_optimizer(d);
  check_script_optimizer(d, s.optimizer);  // scenario/script_keys.cpp
  s.loss = build_loss(d, s.model);         // scenario/script_keys.cpp
  s.step = build_step(d);
  read_step_measure(d, s.step);            // scenario/script_keys.cpp
  read_step_keep_output(d, s.model, s.step);  // scenario/step_output_key.cpp
  s.checkpoint = build_checkpoint(d, s.model);
  s.lora = build_lora(d, s.model, s.precision);  // scenario/scenario_lora.h
  read_lora_prepare_kbit(d, s);  // scenario/peft_kbit_key.h: may default checkpoint.*
  read_lora_compute_dtype(d, s);  // scenario/lora_compute_dtype_key.h (issue #15 item 5)
  read_lora_target_parameters(d, s);  // scenario/lora_target_parameters_key.h (issue #15)
  read_lora_input_require_grads(d, s);            // scenario/peft_input_grads_key.h
  check_torchtitan_keys(d, s);             // scenario/torchtitan_keys.h: float8
  s.parallel = build_parallel(d, s.model);
  read_context_parallel(d, s);             // scenario/context_parallel_keys.h: parallel.context
  read_deepspeed(d, s);  // scenario/deepspeed_keys.h (after batch, precision, optimizer, parallel)
  s.device = build_device(d);
  s.allocator = build_allocator(d, AllocatorConfig{});
  read_serve(d, s);  // scenario/serve_keys.h (issue #17): after the model
  read_generate(d, s);  // scenario/generate_keys.h (issue #17): generate.*, its refusals
  check_products(d, s);
  check_implementation(d, s);  // model.implementation (scenario/scenario_implementation.h)
  read_megatron_moe(d, s);     // Megatron-Core MoE keys (scenario/megatron_moe_keys.h)
  read_megatron_arch(d, s);    // --swiglu, biases, GQA (scenario/megatron_arch_keys.h)
  read_recipe_features(d, s);  // optimizer.in_backward (scenario/torchtune_keys.h)
  // torchtune's OffloadActivations (scenario/offload_activations_key.h)
  s.recipe.offload_activations = read_offload_activations(d, s);
  read_torchtune_sharding(d, s);  // torchtune + FSDP2 (scenario/torchtune_keys.h)
  read_torchtitan_sharding(d, s);  // torchtitan + FSDP2 (scenario/torchtitan_fsdp2_keys.h)
  check_moe(d, s);             // model.moe's routing and settings (scenario/moe_keys.h)
  check_lora_target_parameters(d, s);  // after parallel.* and step.compile
  check_deepseek(d, s);        // DeepSeek-V3: MLA and router refusals (scenario/deepseek_keys.h)
  check_sdpa_kernel(d, s);     // model.attention cudnn, 5.x's enable_gqa (scenario/sdpa_kernel_keys.h)
  s.key_where.reserve(d.fields.size());
  for (const auto& [key, field] : d.fields)
    s.key_where.emplace_back(key, field.where);
  return s;
}

}  // namespace memsim::scenario_detail
