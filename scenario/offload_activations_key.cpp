// checkpoint.offload_activations: read and refused combinations (scenario/offload_activations_key.h).
// Sources: pytorch/torchtune v0.6.1 (a6290a5b40758f13bca61c386bc8756a49ef417e)
// recipes/full_finetune_single_device.py __init__ ("enable_activation_offloading should only
// be True when enable_activation_checkpointing is True"), _setup_model
// (set_activation_checkpointing with auto_wrap_policy {TransformerSelfAttentionLayer}),
// torchtune/training/activations.py (CheckpointImpl.NO_REENTRANT),
// torchtune/training/_activation_offloading.py get_act_offloading_ctx_manager (model.output).
#include "scenario/offload_activations_key.h"

#include <string>

#include "scenario/offload_keys.h"
#include "scenario/scenario_doc.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

bool read_offload_activations(const Doc& d, const Scenario& s) {
  const char* key = kOffloadActivationsKey;
  const Field* f = d.find(key);
  if (f == nullptr || !read_bool(*f, key)) return false;
  // A refusal points at the other key's line when it was given, else at this key's.
  auto refuse = [&](const std::string& other, const std::string& why) {
    const Field* o = d.find(other);
    fail(o != nullptr ? o->where : f->where, other,
         "with checkpoint.offload_activations: true, " + why + " (docs/offload.md)");
  };
  if (s.model.arch.impl != graph::ModelImpl::torchtune)
    refuse("model.implementation",
           "torchtune's OffloadActivations is modelled with torchtune's model code only (its "
           "NoOpManager keeps model.output's saves on the device; another model's head would "
           "be offloaded): use model.implementation: torchtune");
  if (s.checkpoint.policy != CheckpointPolicy::full)
    refuse("checkpoint.policy",
           "the recipes raise unless enable_activation_checkpointing is on (checkpoint.policy: "
           "full)");
  if (s.checkpoint.reentrant.value_or(false))
    refuse("checkpoint.reentrant", "torchtune's checkpoint_wrapper is non-reentrant");
  if (offloads(s.checkpoint))
    refuse("checkpoint.offload",
           "save_on_cpu around layers as well is not a torchtune recipe and not modelled");
  if (s.precision.params == DType::fp32)
    refuse("precision.params",
           "fp32 is not modelled: RMSNorm's x.float() is x, so the checkpoint's re-run saves a "
           "view of the unpacked input and OffloadActivations falls back to record_stream, "
           "whose free depends on GPU progress; use bf16 (torchtune's dtype)");
  if (s.step.kind != StepKind::train)
    refuse("step.kind", "the hooks pack in a training forward and unpack in its backward");
  if (s.step.compile)
    refuse("step.compile", "torch.compile decides what is saved; not modelled with offloading");
  // One GPU (the single-device recipes) or torchtune's FSDP2 (full_finetune_distributed /
  // lora_finetune_distributed: the same `with self.activations_handling_ctx:` around the
  // sharded model's forward; scenario/torchtune_keys.h refuses the rest of their settings).
  if ((s.parallel.data > 1 || s.parallel.sharding != Sharding::none) &&
      s.parallel.sharding != Sharding::fsdp2)
    refuse(s.parallel.sharding != Sharding::none ? "parallel.sharding" : "parallel.data",
           "one GPU (full_finetune_single_device / lora_finetune_single_device) or "
           "torchtune's FSDP2 (parallel.sharding: fsdp2) only");
  return true;
}

}  // namespace memsim::scenario_detail

namespace memsim {

bool offloads_activations(const Scenario& s) { return s.recipe.offload_activations; }

}  // namespace memsim
