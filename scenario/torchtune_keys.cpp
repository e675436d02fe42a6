// torchtune's recipe features: optimizer.in_backward and the lora.* mapping onto
// lora_llama3 (scenario/torchtune_keys.h).
//
// Sources: pytorch/torchtune v0.6.1 (a6290a5b40758f13bca61c386bc8756a49ef417e)
// recipes/full_finetune_single_device.py __init__ (optimizer_in_bwd with clip_grad_norm
// or gradient_accumulation_steps > 1 raises RuntimeError; enable_activation_offloading
// requires enable_activation_checkpointing), recipes/lora_finetune_single_device.py (no
// optimizer_in_bwd; adapters in the recipe dtype, validate_expected_param_dtype),
// torchtune/models/llama3/_component_builders.py lora_llama3 (lora_attn_modules
// q_proj/k_proj/v_proj/output_proj; apply_lora_to_mlp adapts w1, w2 and w3 together;
// apply_lora_to_output; quantize_base is torchao's NF4Tensor).
#include "scenario/torchtune_keys.h"

#include <algorithm>
#include <string>

#include "scenario/scenario_family.h"
#include "scenario/scenario_lora.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {
namespace {

// The bits of graph/models/lora.h LlamaLinear: gate_proj (w1), up_proj (w3), down_proj (w2).
constexpr uint32_t kMlpBits = (1u << 4) | (1u << 5) | (1u << 6);

}  // namespace

void read_recipe_features(const Doc& d, Scenario& s) {
  const Field* f = d.find("optimizer.in_backward");
  if (f == nullptr || !read_bool(*f, "optimizer.in_backward")) return;
  s.recipe.optimizer_in_backward = true;
  s.recipe.in_backward_where = f->where;
  // Where a refusal points: the other key's own line when it was given, else in_backward's.
  auto refuse = [&](const std::string& other, const std::string& why) {
    const Field* o = d.find(other);
    fail(o != nullptr ? o->where : f->where, other,
         "with optimizer.in_backward: true, " + why + " (docs/implementations.md)");
  };
  if (s.step.kind != StepKind::train)
    refuse("step.kind", "the optimizer steps inside a training step's backward (step.kind: train)");
  if (s.batch.grad_accum > 1)
    refuse("batch.grad_accum",
           "each gradient is freed by its optimizer step inside backward, so there is nothing "
           "to accumulate (torchtune raises: set gradient_accumulation_steps=1)");
  const FamilyRow& family = family_row(s.model.family);
  if (!family.hf && !family.staff_model)
    refuse("model.family", std::string("an optimizer per parameter stepped from its hook is modelled for "
                                       "the cs336 and Hugging Face families, not '") +
                               to_string(s.model.family) + "'");
  if (s.parallel.data > 1 || s.parallel.tensor > 1 || s.parallel.pipeline > 1 ||
      s.parallel.sharding != Sharding::none || s.parallel.zero != 0)
    refuse(s.parallel.sharding != Sharding::none ? "parallel.sharding"
           : s.parallel.zero != 0                ? "parallel.zero"
           : s.parallel.tensor > 1               ? "parallel.tensor"
           : s.parallel.pipeline > 1             ? "parallel.pipeline"
                                                 : "parallel.data",
           "only one GPU is modelled (torchtune's optimizer_in_bwd is a single-device recipe "
           "feature; DDP / FSDP reduce the gradients the hooks would free)");
  if (s.precision.master_weights)
    refuse("precision.master_weights", "fp32 master copies are not modelled with per-parameter steps");
  if (s.step.compile) refuse("step.compile", "torch.compile is not modelled with per-parameter steps");
  const OptimizerType t = s.optimizer.type;
  if (t != OptimizerType::adamw && t != OptimizerType::adam && t != OptimizerType::sgd)
    refuse("optimizer.type", "only torch.optim's Adam, AdamW and SGD are modelled per parameter");
  if (s.optimizer.impl != OptimizerImpl::foreach && s.optimizer.impl != OptimizerImpl::for_loop &&
      s.optimizer.impl != OptimizerImpl::fused)
    refuse("optimizer.impl", "only torch.optim's for-loop, foreach and fused implementations are "
                             "modelled per parameter");
  if (s.lora.rank > 0 && s.model.arch.impl == graph::ModelImpl::torchtune)
    refuse("lora.rank", "torchtune's lora_finetune_single_device has no optimizer_in_bwd");
}

void read_torchtune_sharding(const Doc& d, Scenario& s) {
  const Field* layers = d.find("parallel.custom_sharded_layers");
  const bool tune = s.model.arch.impl == graph::ModelImpl::torchtune;
  if (!tune || s.parallel.sharding != Sharding::fsdp2) {
    if (layers != nullptr)
      fail(layers->where, "parallel.custom_sharded_layers",
           "torchtune's custom_sharded_layers: only with model.implementation torchtune and "
           "parallel.sharding fsdp2");
    return;
  }
  // recipes/configs/llama3*/..._full.yaml: custom_sharded_layers: ['tok_embeddings', 'output'];
  // the LoRA configs (lora_finetune_distributed) leave it commented out: None, the root
  // keeps both (llama3/70B_lora.yaml line 81).
  const bool lora = s.lora.rank > 0;
  s.recipe.shard_tok_embeddings = !lora;
  s.recipe.shard_output = !lora;
  if (layers != nullptr) {
    s.recipe.shard_tok_embeddings = false;
    s.recipe.shard_output = false;
    for (const std::string& name : read_name_list(*layers, "parallel.custom_sharded_layers")) {
      if (name == "tok_embeddings") {
        s.recipe.shard_tok_embeddings = true;
      } else if (name == "output") {
        s.recipe.shard_output = true;
      } else if (name != "none") {
        fail(layers->where, "parallel.custom_sharded_layers",
             "'" + name + "': the modules shard_model can give a fully_shard of their own "
             "that are modelled are tok_embeddings and output (or none)");
      }
    }
  }
  const Field* impl = d.find("model.implementation");
  auto refuse = [&](const std::string& key, const std::string& why) {
    const Field* o = d.find(key);
    fail(o != nullptr ? o->where : impl->where, key,
         why + " (model.implementation torchtune with parallel.sharding fsdp2; "
               "docs/implementations.md)");
  };
  const ParallelConfig& p = s.parallel;
  if (p.fsdp_mixed_precision.has_value() || d.find("parallel.fsdp_mixed_precision"))
    refuse("parallel.fsdp_mixed_precision",
           "torchtune's shard_model passes no MixedPrecisionPolicy: the parameters are in the "
           "recipe dtype (precision.params)");
  if (p.reduce_dtype.has_value())
    refuse("parallel.reduce_dtype", "torchtune's shard_model passes no MixedPrecisionPolicy: "
                                    "gradients are reduced in the parameters' dtype");
  if (p.replicate > 1)
    refuse("parallel.replicate", lora ? "lora_finetune_distributed shards over one flat mesh "
                                        "(shard_model's dp_mesh None): no HSDP"
                                      : "full_finetune_distributed builds a (dp, tp) mesh: no HSDP");
  if (p.reshard_after_forward_ranks > 0)
    refuse("parallel.reshard_after_forward",
           "torchtune's fsdp_reshard_after_forward is a bool (true or false)");
  if (const Field* f = d.find("parallel.fsdp_init"); f != nullptr && !p.fsdp_init_on_cpu)
    refuse("parallel.fsdp_init", "the recipe builds the model on the meta device and loads the "
                                 "sharded state dict (fsdp_init: cpu, the default here)");
  if (p.context > 1)
    refuse("parallel.context", "torchtune v0.6.1's recipes have no context parallelism");
  if (s.precision.float8_all_gather)
    refuse("precision.float8_all_gather", "torchtune's recipe has no float8 all-gather");
  // load_from_full_model_state_dict keeps distribute_tensor's unpadded chunk and FSDP2
  // pads it at lazy init: modelled only where the shard group divides every dim 0.
  const int64_t ws = p.data;
  const int64_t hd = s.model.arch.head_dim > 0 ? s.model.arch.head_dim
                                               : s.model.d_model / std::max<int64_t>(1, s.model.heads);
  const int64_t kv = s.model.kv_heads > 0 ? s.model.kv_heads : s.model.heads;
  for (int64_t rows : {s.model.d_model, s.model.heads * hd, kv * hd, s.model.d_ff, s.model.vocab})
    if (ws > 0 && rows % ws != 0)
      refuse("parallel.data",
             "a parameter of " + std::to_string(rows) + " rows over " + std::to_string(ws) +
                 " ranks: uneven shards (distribute_tensor's unpadded chunk, padded by FSDP2's "
                 "lazy init) are not modelled with torchtune's state-dict load");
  s.parallel.fsdp_init_on_cpu = true;  // torch.device("meta") in _setup_model
}

void check_torchtune_lora(const Doc& d, const Scenario& s) {
  if (s.lora.rank <= 0) return;
  const Field* impl = d.find("model.implementation");
  auto refuse = [&](const std::string& key, const std::string& why) {
    const Field* o = d.find(key);
    fail(o != nullptr ? o->where : impl->where, key,
         why + " (model.implementation torchtune; docs/implementations.md)");
  };
  if (s.lora.base_nf4)
    refuse("lora.base_dtype",
           "torchtune's QLoRA (quantize_base: torchao's NF4Tensor and linear_nf4) is not "
           "modelled; give the precision.params dtype");
  if (s.lora.adapter_dtype != s.precision.params)
    refuse("lora.adapter_dtype",
           std::string("torchtune builds the adapters in the model's dtype (set_default_dtype; "
                       "validate_expected_param_dtype): use ") +
               to_string(s.precision.params));
  if (s.lora.input_require_grads.has_value())
    refuse("lora.input_require_grads",
           "PEFT's enable_input_require_grads has no torchtune counterpart (its checkpointing "
           "is non-reentrant)");
  const uint32_t mask = lora_target_mask(s.lora, s.model.family);
  if ((mask & kMlpBits) != 0 && (mask & kMlpBits) != kMlpBits)
    refuse("lora.targets",
           "torchtune's apply_lora_to_mlp adapts w1, w2 and w3 together: list gate_proj, "
           "up_proj and down_proj all or none (q_proj, k_proj, v_proj and o_proj = output_proj "
           "are lora_attn_modules, each on its own)");
}

}  // namespace memsim::scenario_detail
