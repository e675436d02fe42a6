#include "sim/step/modelled_features.h"

#include <string>

#include "scenario/arch_checks.h"
#include "scenario/compile_keys.h"
#include "scenario/offload_keys.h"
#include "scenario/generate_keys.h"
#include "scenario/scenario_family.h"
#include "scenario/script_keys.h"
#include "sim/parallel/accelerate_amp.h"
#include "sim/parallel/accelerate_fsdp1_checks.h"
#include "sim/parallel/data_parallel.h"
#include "sim/parallel/fsdp_lora_checks.h"
#include "sim/step/clip_grad.h"
#include "sim/step/grad_scaler.h"
#include "sim/step/torchtitan_checkpoint.h"

namespace memsim {

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
// Autocast is modelled for the cs336 family, hf-llama (eager or SDPA attention, untied
// head, no dropout) and hf-gpt2 (eager attention, no dropout) with fp32 parameters
// (graph/autocast.h); with activation checkpointing when backward runs outside the
// region; everything else is refused by key.
void require_autocast_modelled(const Scenario& s) {
  const FamilyRow& family = family_row(s.model.family);
  if (!family.autocast) {
    refuse(s, "precision.autocast",
           std::string("autocast is modelled for the cs336, hf-llama and hf-gpt2 families only, "
                       "not '") +
               to_string(s.model.family) + "'; use precision.autocast: none");
  }
  // SDPA (flash / mem-efficient) under autocast: graph/models/decoder_attention.cpp
  // sdpa_kernel casts q/k/v to the low dtype (SDPA is on CUDA's lower-precision list).
  if (family.hf && s.model.dropout > 0.0) {
    refuse(s, "model.dropout",
           "dropout under autocast is not checked against torch yet for the hf families; "
           "use model.dropout: 0 or precision.autocast: none");
  }
  // PEFT LoRA under autocast (graph/models/lora_autocast.cpp, PEFT 0.21.0's Linear.forward):
  // fp32 adapters over the fp32 frozen base, identity dropout, one GPU or DDP. The rest of
  // what the adapter path would do there is not checked against torch: refused by key.
  if (s.lora.rank > 0) {
    if (s.lora.base_nf4)
      refuse(s, "lora.base_dtype",
             "QLoRA (an nf4 base) under precision.autocast is not modelled (bitsandbytes' "
             "dequantised weights and autocast's casts of them are not checked); use "
             "precision.autocast: none");
    if (s.lora.adapter_dtype != DType::fp32)
      refuse(s, "lora.adapter_dtype",
             "LoRA under precision.autocast is modelled for fp32 adapters only (PEFT's default "
             "over fp32 weights); use lora.adapter_dtype: fp32");
    if (s.lora.dropout > 0.0)
      refuse(s, "lora.dropout",
             "LoRA dropout under precision.autocast is not checked against torch yet; use "
             "lora.dropout: 0 or precision.autocast: none");
    if (s.parallel.sharding != Sharding::none || s.parallel.zero != 0)
      refuse(s, "lora.rank",
             "LoRA under precision.autocast is modelled on one GPU and with torch DDP, not with "
             "sharded data parallelism (FSDP, FSDP2, ZeRO, DeepSpeed) yet; use "
             "precision.autocast: none or parallel.sharding: none");
  }
  if (!family.autocast_tied_embeddings && s.model.tied_embeddings) {
    refuse(s, "model.tied_embeddings",
           "autocast with a tied embedding/lm_head weight is not modelled yet; use "
           "model.tied_embeddings: false or precision.autocast: none");
  }
  // (Accelerate's FSDP1 path over a bf16-loaded model: its shards are upcast to fp32 and
  // autocast sees bf16 views, as with an fp32 model: sim/parallel/accelerate_amp.h.)
  if (s.precision.params != DType::fp32 && !accelerate_fsdp1_upcast(s)) {
    refuse(s, "precision.autocast",
           "autocast casts fp32 parameters; with precision.params bf16/fp16 use "
           "precision.autocast: none");
  }
  if (s.checkpoint.policy != CheckpointPolicy::none && s.precision.autocast_region == AutocastRegion::whole_step) {
    // The recompute runs inside backward, i.e. inside the region: what it finds in the
    // weight-cast cache depends on torch's version (1.13: a per-thread cache, and CUDA's
    // backward runs on its own thread; 2.x: one cache, which the recompute's exit clears
    // for everyone). Not modelled.
    refuse(s, "precision.autocast_region",
           "whole-step autocast with activation checkpointing is not modelled (the recompute "
           "would run inside the region); use autocast_region forward-and-loss or forward");
  }
}
}  // namespace

void require_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  const FamilyRow& family = family_row(s.model.family);
  if (!family.staff_model) {
    // The other families call torch's softmax and build their masks their own way.
    const std::string why = std::string(" is a cs336-family option, not for family '") +
                            to_string(s.model.family) + "'; remove it";
    if (s.model.softmax != SoftmaxImpl::staff) refuse(s, "model.softmax", "model.softmax" + why);
    if (s.model.sdpa != SdpaImpl::staff) refuse(s, "model.sdpa", "model.sdpa" + why);
    if (s.model.swiglu != SwigluImpl::staff) refuse(s, "model.swiglu", "model.swiglu" + why);
  }
  // The megatron family models tensor and pipeline parallelism (sim/megatron/megatron_parallel.h
  // checks the rest).
  const bool tensor_modelled = family.tensor_parallel;
  if ((p.tensor != 1 || p.pipeline != 1) && !tensor_modelled) {
    const char* key = p.pipeline != 1 ? "parallel.pipeline" : "parallel.tensor";
    refuse(s, key,
           std::string("multi-GPU memory of tensor and pipeline parallelism is modelled for "
                       "model family 'megatron' only, not '") +
               to_string(s.model.family) + "' (set parallel.tensor and parallel.pipeline to 1)");
  }
  if (p.sequence && !tensor_modelled)
    refuse(s, "parallel.sequence", "sequence parallelism is modelled for model family 'megatron' only");
  require_arch_modelled(s);           // scenario/arch_checks.h: decoder knobs per setting
  require_data_parallel_modelled(s);  // sim/parallel/data_parallel.h
  require_script_keys_modelled(s);    // scenario/script_keys.h: loss.*, out-of-place, whole-run
  require_compile_modelled(s);        // scenario/compile_keys.h: step.compile's combinations
  require_offload_modelled(s);        // scenario/offload_keys.h: checkpoint.offload's
  require_generate_modelled(s);       // scenario/generate_keys.h: step.kind generate's (issue #17)
  require_torchtitan_modelled(s);     // sim/step/torchtitan_checkpoint.h: sac-op, sac-layer:N
  require_fsdp_lora_modelled(s);      // sim/parallel/fsdp_lora_checks.h: FSDP1 + LoRA, use_orig_params
  require_grad_scaler_modelled(s);    // sim/step/grad_scaler.h: precision.grad_scaler's
  require_clip_grad_modelled(s);      // sim/step/clip_grad.h: optimizer.max_grad_norm's
  // Data parallelism, LoRA and master weights were each checked alone; their
  // combinations change what is sharded or bucketed (FSDP flattens frozen and trainable
  // parameters together, DDP buckets only parameters that need a gradient, master copies
  // would be of shards) and are not modelled until they are checked too (DDP, FSDP2 and
  // FSDP1 with LoRA are: docs/fsdp-lora.md).
  // Autocast composes with torch DDP / ZeroRedundancyOptimizer (fp32 leaf parameters,
  // as on one GPU; tests/test_dp_autocast.cpp) and with FSDP, whose parameters are views
  // of the gathered flat parameter, which autocast's weight-cast cache skips
  // (graph/autocast.h set_params_are_views). With FSDP's own MixedPrecision as well it is
  // Accelerate's FSDP1 bf16 path (HF Trainer bf16=True, fsdp_version 1), and only that
  // (sim/parallel/accelerate_fsdp1_checks.h).
  if (p.sharding == Sharding::fsdp && s.precision.autocast.has_value() &&
      p.fsdp_mixed_precision.has_value() && family.torch_data_parallel &&
      s.lora.rank == 0 && !s.precision.master_weights)
    require_accelerate_fsdp1_modelled(s);
  require_sync_module_states_modelled(s);  // parallel.fsdp_sync_module_states
  // torch DDP composes with both (sim/parallel/data_parallel.h: the reducer buckets only the
  // parameters that require grad, in their dtype; tests/test_ddp_combos.cpp). FSDP and
  // ZeRO-1 do not yet.
  const bool sharded = p.sharding != Sharding::none || p.zero != 0;
  // DeepSpeed checks its own combinations (sim/parallel/deepspeed_checks.h).
  if (p.data > 1 && sharded && family.torch_data_parallel && p.sharding != Sharding::deepspeed) {
    // FSDP2 models LoRA (sim/parallel/fsdp2.h) and refuses master weights itself; FSDP1
    // models LoRA (sim/parallel/fsdp.h, checked by sim/parallel/fsdp_lora_checks.h).
    const bool lora_modelled = p.sharding == Sharding::fsdp2;
    const bool fsdp1_lora = p.sharding == Sharding::fsdp && s.lora.rank > 0;
    const char* key = (s.lora.rank > 0 && !lora_modelled && !fsdp1_lora) ? "lora"
                      : (s.precision.master_weights && !lora_modelled) ? "precision.master_weights"
                                                                         : nullptr;
    if (key != nullptr)
      refuse(s, key,
             std::string("is modelled with torch DDP (parallel.data > 1, parallel.sharding: "
                         "none, parallel.zero: 0) but not with ") +
                 (p.sharding == Sharding::fsdp ? "FSDP (parallel.sharding: fsdp)"
                                                : "ZeRO-1 (parallel.zero: 1)") +
                 " yet; use plain DDP, simulate one GPU, or drop this key");
  }
  if (s.precision.autocast.has_value()) require_autocast_modelled(s);  // below
  if (s.precision.master_weights && s.optimizer.impl == OptimizerImpl::cs336) {
    refuse(s, "precision.master_weights",
           "the CS336 staff AdamW updates the parameters themselves (no fp32 master copy); "
           "use optimizer.impl for-loop, foreach or fused");
  }
  if (s.optimizer.type == OptimizerType::adafactor && !family.adafactor) {
    refuse(s, "optimizer.type",
           std::string("Adafactor's factored state needs the parameters' shapes, which memsim "
                       "records for hf-llama and hf-gpt2 only, not '") +
               to_string(s.model.family) + "'");
  }
  if ((s.optimizer.type == OptimizerType::adam8bit || s.optimizer.type == OptimizerType::adamw8bit) &&
      !family.adam8bit) {
    refuse(s, "optimizer.type",
           "Megatron-LM's optimizer is a fused fp32 Adam; bitsandbytes 8-bit Adam is modelled "
           "for cs336, hf-gpt2 and hf-llama");
  }
  // LoRA with reentrant checkpointing: PEFT's enable_input_require_grads hook makes the
  // embedding output a leaf that requires grad (scenario/peft_input_grads_key.h; a false
  // lora.input_require_grads there is refused by the reader).
  if (!family.dropout && s.model.dropout > 0.0) {
    refuse(s, "model.dropout",
           "the CS336 staff model has no dropout layers; use family hf-gpt2, hf-llama or "
           "megatron for a model with dropout");
  }
}

}  // namespace memsim
