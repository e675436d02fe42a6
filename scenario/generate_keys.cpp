// The generate section and step.kind generate's refusals (scenario/generate_keys.h).
#include "scenario/generate_keys.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace memsim {

const char* to_string(GenerateCache cache) {
  switch (cache) {
    case GenerateCache::dynamic: return "dynamic";
    case GenerateCache::static_cache: return "static";
    case GenerateCache::quantized_int8: return "quantized:int8";
    case GenerateCache::quantized_int4: return "quantized:int4";
    case GenerateCache::quantized_int2: return "quantized:int2";
    case GenerateCache::offloaded: return "offloaded";
  }
  return "?";
}

namespace scenario_detail {
namespace {

const std::vector<std::pair<std::string, GenerateCache>> kCaches = {
    {"dynamic", GenerateCache::dynamic},
    {"static", GenerateCache::static_cache},
    {"quantized:int8", GenerateCache::quantized_int8},
    {"quantized:int4", GenerateCache::quantized_int4},
    {"quantized:int2", GenerateCache::quantized_int2},
    {"offloaded", GenerateCache::offloaded}};

// generate.cache_classes: which transformers release's cache_utils classes (false: v4.45).
const std::vector<std::pair<std::string, bool>> kCacheClasses = {{"v4.45", false}, {"v5", true}};

// Keys (or whole sections, "optimizer.") that a generation run does not use: a value given
// for one is refused rather than silently ignored.
struct Unused {
  const char* key;  // exact key, or a section prefix ending in '.'
  const char* why;
};
const Unused kUnused[] = {
    {"batch.seq_len", "with step.kind generate the lengths are generate.prompt_len and "
                      "generate.new_tokens (batch.seq_len becomes their sum); remove it"},
    {"batch.grad_accum", "generation has no gradient accumulation; remove it"},
    {"optimizer.", "generation builds no optimizer (model.generate() under no_grad); remove the "
                   "optimizer section"},
    {"loss.", "generation computes no loss; remove the loss section"},
    {"checkpoint.", "activation checkpointing recomputes in backward; generation runs no backward "
                    "(remove the checkpoint section)"},
    {"lora.", "generation with PEFT adapters is not modelled; remove the lora section"},
    {"deepspeed.", "DeepSpeed-Inference / ZeRO generation is not modelled; remove the deepspeed "
                   "section"},
    {"step.warmup_steps", "generate() runs once (no warm-up steps); remove it"},
    {"step.zero_grad", "generation has no gradients; remove it"},
    {"step.keep_output", "generate() returns the sequences only; remove it"},
    {"step.measure", "the peak of a generate run counts from the generate() call; remove it"},
    {"step.compile", "torch.compile of generate (static-cache CUDA graphs) is not modelled; remove it"},
    {"step.compile_scope", "torch.compile of generate is not modelled; remove it"},
    {"step.compile_memory_budget", "torch.compile of generate is not modelled; remove it"},
    {"precision.master_weights", "master weights are an optimizer setting; generation has none"},
    {"precision.autocast", "generate() runs the model in its weights' dtype (precision.params); "
                           "autocast generation is not modelled"},
    {"precision.autocast_region", "generate() runs no autocast region; remove it"},
    {"precision.autocast_cache", "generate() runs no autocast region; remove it"},
    {"precision.float8", "float8 training linears are not an inference setting here; remove it"},
    {"precision.float8_all_gather", "FSDP2's float8 all-gather is a training setting; remove it"},
    {"precision.float8_precompute_scale", "float8 weight scales are a training setting; remove it"},
    {"parallel.", "multi-GPU generation (tensor parallel, FSDP, DDP) is not modelled; remove the "
                  "parallel section"},
};

bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::char_traits<char>::length(prefix), prefix) == 0;
}

// The first given key matching `u` (nullptr when none).
const Field* given(const Doc& d, const Unused& u, std::string& key) {
  const std::string k = u.key;
  if (k.back() != '.') {
    key = k;
    return d.find(k);
  }
  for (const auto& [name, field] : d.fields)
    if (starts_with(name, u.key)) {
      key = name;
      return &field;
    }
  return nullptr;
}

}  // namespace

bool generate_requested(const Doc& d) {
  const Field* f = d.find("step.kind");
  return f != nullptr && !is_null(f->node) && f->node.IsScalar() && f->node.Scalar() == "generate";
}

void read_generate(const Doc& d, Scenario& s) {
  if (s.step.kind != StepKind::generate) {
    for (const auto& [name, field] : d.fields)
      if (starts_with(name, "generate."))
        fail(field.where, name, "applies to step.kind generate only (step.kind is " +
                                    std::string(to_string(s.step.kind)) + "); remove it");
    return;
  }
  GenerateConfig& g = s.generate;
  const std::string at = d.where_missing("generate");
  for (const char* key : {"generate.prompt_len", "generate.new_tokens"})
    if (d.find(key) == nullptr) fail(at, key, "required with step.kind generate");
  g.prompt_len = read_int(*d.find("generate.prompt_len"), "generate.prompt_len", 1);
  g.new_tokens = read_int(*d.find("generate.new_tokens"), "generate.new_tokens", 1);
  if (const Field* f = d.find("generate.cache")) g.cache = read_enum(*f, "generate.cache", kCaches);
  if (const Field* f = d.find("generate.logits_to_keep"))
    g.logits_to_keep = read_int(*f, "generate.logits_to_keep", 0);
  if (const Field* f = d.find("generate.cache_classes"))
    g.cache_classes_v5 = read_enum(*f, "generate.cache_classes", kCacheClasses);
  read_quantized_cache(d, s);  // generate.residual_length / q_group_size (generate_quant_keys.cpp)

  for (const Unused& u : kUnused) {
    std::string key;
    if (const Field* f = given(d, u, key)) fail(f->where, key, u.why);
  }
  const auto where = [&](const char* key, const char* section) {
    if (const Field* f = d.find(key)) return f->where;
    return d.where_missing(section);
  };
  if (s.model.family != ModelFamily::hf_llama)
    fail(where("model.family", "model"), "model.family",
         std::string("step.kind generate is modelled for the hf-llama family's rows only, not '") +
             to_string(s.model.family) +
             "' (GPT-2's v4.44 attention keeps a legacy tuple cache; cs336 and megatron have no "
             "generate())");
  if (s.model.arch.impl != graph::ModelImpl::hf)
    fail(where("model.implementation", "model"), "model.implementation",
         "step.kind generate runs transformers' generate(); only model.implementation hf");
  // generate()'s loop and cache classes are v4.45's (docs/generate.md "Versions": 5.x
  // copies the last logits to fp32 in _sample, allocates a StaticCache lazily, bounds
  // sliding-window layers); pairing them with 5.x model code is no real release.
  if (const Field* f = d.find("model.transformers"); f && f->node.IsScalar() && f->node.Scalar() == "5")
    fail(f->where, "model.transformers",
         "step.kind generate models transformers v4.45's generate() loop and model code; 5.x's "
         "(fp32 copy of the last logits in _sample, masking_utils masks) is not modelled: use 4 "
         "(5.x's cache classes, sliding-window layers bounded: generate.cache_classes: v5)");
  // The MoE rows are transformers 5.x's code (docs/moe.md: no 4.x MoE row), so pairing them
  // with v4.45's generate() loop would be the same non-release as model.transformers 5 above.
  if (s.model.arch.moe.experts > 0)
    fail(where("step.kind", "step"), "step.kind",
         "step.kind generate models transformers v4.45's generate() loop; memsim's MoE rows are "
         "transformers 5.x's code (its generate() and decode-stage experts dispatch are not "
         "modelled): use step.kind forward for a prefill, or memsim serve");
  if (s.model.arch.sliding_window > 0 && s.model.arch.sliding_at == graph::SlidingAt::layer &&
      !(g.cache_classes_v5 && g.cache != GenerateCache::static_cache))
    fail(where("model.architecture", "model"), "model.architecture",
         std::string("'") + s.model.arch.architecture +
             "' generates with HybridCache in v4.45, whose decoder layers build their sliding "
             "masks from the full one: not modelled; 5.x's DynamicCache (one mask per layer "
             "type) is: set generate.cache_classes: v5 with generate.cache dynamic or offloaded");
  if (g.cache_classes_v5) {
    const graph::DecoderArch& a = s.model.arch;
    bool slides = false;
    for (int64_t l = 0; l < s.model.layers; ++l) slides = slides || a.layer_slides(l);
    if (slides && a.sliding_window < 2)
      fail(where("generate.cache_classes", "generate"), "generate.cache_classes",
           "a DynamicSlidingWindowLayer of window " + std::to_string(a.sliding_window) +
               " keeps keys[-window + 1:] = every token; a window below 2 is not modelled");
    if (slides && s.model.attention != AttentionImpl::eager)
      fail(where("model.attention", "model"), "model.attention",
           "generate.cache_classes v5 with sliding-window layers under SDPA (5.x's sdpa_mask for "
           "the window) is not modelled; use model.attention eager");
    if (g.cache == GenerateCache::static_cache && slides)
      fail(where("generate.cache", "generate"), "generate.cache",
           "generate.cache static with cache_classes v5 and sliding-window layers "
           "(StaticSlidingWindowLayer: its window-sized buffer, roll and copy_, the full states "
           "returned at a prefill longer than the window) is not modelled; use dynamic");
    if (slides && (g.cache == GenerateCache::quantized_int4 || g.cache == GenerateCache::quantized_int2 ||
                   g.cache == GenerateCache::quantized_int8))
      fail(where("generate.cache", "generate"), "generate.cache",
           "5.x's QuantizedCache raises ValueError: \"`QuantizedCache` is only supported for "
           "models with only full attention layers\" (this model has sliding-window layers)");
  }
  switch (g.cache) {
    case GenerateCache::quantized_int8:
      // QuantizedCache's HQQ backend (graph/models/hqq_kv.h), modelled as 5.x's layers build it.
      if (!g.cache_classes_v5)
        fail(where("generate.cache", "generate"), "generate.cache",
             "quantized:int8 (QuantizedCache's HQQ backend) is modelled with transformers 5.x's "
             "layers only: v4.45's HQQQuantizedCache quantizes on QuantizedCacheConfig's device "
             "and compute_dtype (defaults \"cpu\" and float16, not the states'), which memsim "
             "does not model; set generate.cache_classes: v5");
      break;
    case GenerateCache::quantized_int4:
    case GenerateCache::quantized_int2: break;
    case GenerateCache::offloaded:
      if (!g.cache_classes_v5)
        fail(where("generate.cache", "generate"), "generate.cache",
             "v4.45's OffloadedCache is not modelled; 5.x's DynamicCache(offloading=True) is: set "
             "generate.cache_classes: v5");
      break;
    case GenerateCache::static_cache:
      if (s.model.attention != AttentionImpl::eager)
        fail(where("model.attention", "model"), "model.attention",
             "generate.cache static with SDPA passes a 4-D mask (the mem-efficient kernel, "
             "q/k/v .contiguous() copies), which is not modelled; use model.attention eager");
      break;
    case GenerateCache::dynamic: break;
  }
  const int64_t total = g.prompt_len + g.new_tokens;
  // The model sees prompt_len + new_tokens - 1 positions: the last token is sampled, never fed.
  const int64_t positions = total - 1;
  if (d.find("model.context_length") != nullptr && positions > s.model.context_length)
    fail(where("generate.new_tokens", "generate"), "generate.new_tokens",
         "prompt_len + new_tokens - 1 = " + std::to_string(positions) +
             " positions is longer than model.context_length " + std::to_string(s.model.context_length));
  if (d.find("model.context_length") == nullptr && s.model.context_length > 0 &&
      positions > s.model.context_length) {
    // As for batch.seq_len (scenario_build.cpp): a preset's or config.json's context length
    // is the model's; only an explicit model.context_length extends it.
    const char* from_key = d.find("model.preset") ? "model.preset" : "model.hf_config";
    fail(where("generate.new_tokens", "generate"), "generate.new_tokens",
         "prompt_len + new_tokens - 1 = " + std::to_string(positions) +
             " positions is longer than the model's context length " +
             std::to_string(s.model.context_length) +
             (d.find(from_key) ? " (that of " + std::string(from_key) + ")" : std::string()) +
             "; set model.context_length: " + std::to_string(positions) + " to extend the model");
  }
  s.batch.seq_len = total;
  s.model.context_length = std::max(s.model.context_length, total);
  s.model.dropout = 0.0;  // generate runs the model in eval mode
  s.optimizer.type = OptimizerType::none;  // no optimizer is built (reports say so)
  s.step.warmup_steps = 0;                 // generate() runs once
}

}  // namespace scenario_detail

void require_generate_modelled(const Scenario& s) {
  if (s.step.kind != StepKind::generate) return;
  auto refuse = [&](const char* key, const std::string& why) {
    throw ScenarioError(s.source + ": " + key + ": " + why);
  };
  if (s.checkpoint.policy != CheckpointPolicy::none)
    refuse("checkpoint.policy", "activation checkpointing recomputes in backward; generation runs "
                                "no backward (step.kind generate)");
  if (s.lora.rank > 0) refuse("lora.rank", "generation with PEFT adapters is not modelled");
  const ParallelConfig& p = s.parallel;
  if (p.data != 1 || p.tensor != 1 || p.pipeline != 1 || p.zero != 0 || p.sharding != Sharding::none)
    refuse("parallel.data", "multi-GPU generation is not modelled");
  if (s.precision.autocast || s.precision.master_weights)
    refuse("precision.autocast", "generate() runs the model in its weights' dtype; autocast / master "
                                 "weights are not modelled with step.kind generate");
  if (s.step.compile) refuse("step.compile", "torch.compile of generate is not modelled");
}

}  // namespace memsim
