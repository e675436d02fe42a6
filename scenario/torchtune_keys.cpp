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
