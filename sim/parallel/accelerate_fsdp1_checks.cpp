#include "sim/parallel/accelerate_fsdp1_checks.h"

#include <string>

#include "scenario/transformers_version.h"
#include "sim/parallel/accelerate_amp.h"
#include "sim/parallel/accelerate_step_checks.h"

namespace memsim {

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
}  // namespace

void require_accelerate_fsdp1_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  // FullyShardedDataParallelPlugin.set_mixed_precision (huggingface/accelerate @16cb6eb8
  // utils/dataclasses.py; the same since v0.34.0): for fsdp_version 1,
  // MixedPrecision(param_dtype=d, reduce_dtype=d, buffer_dtype=d), d the autocast dtype.
  if (*p.fsdp_mixed_precision != *s.precision.autocast)
    refuse(s, "parallel.fsdp_mixed_precision",
           "with precision.autocast under FSDP1, modelled as Accelerate sets it (HF Trainer "
           "bf16=True): param_dtype equal to the autocast dtype (bf16)");
  // Accelerator(mixed_precision="fp16") (HF Trainer fp16=True) on CUDA: native_amp and
  // self.scaler = get_grad_scaler(DistributedType.FSDP), torch's ShardedGradScaler
  // (accelerate @16cb6eb8 accelerator.py; utils/modeling.py get_grad_scaler); bf16 makes no
  // scaler. backward is scaler.scale(loss).backward(), clip_grad_norm_ unscales first,
  // AcceleratedOptimizer.step is scaler.step + scaler.update (sim/step/grad_scaler.h).
  const bool fp16 = *s.precision.autocast == DType::fp16;
  if (fp16 != s.precision.grad_scaler)
    refuse(s, "precision.grad_scaler",
           fp16 ? "Accelerate's FSDP1 fp16 path scales the loss with ShardedGradScaler: set "
                  "precision.grad_scaler: true"
                : "Accelerate's FSDP1 bf16 path makes no GradScaler: set "
                  "precision.grad_scaler: false");
  // fp16 over a 16-bit-loaded model: refused by require_grad_scaler_modelled
  // (precision.grad_scaler: fp32 parameters only), which runs first.
  if (fp16)
    require_accelerate_trainer_step(
        s, {"Accelerate's FSDP1 fp16 path", "autocast over fp16 parameter views",
            "docs/fsdp-accelerate.md \"fp16\"", ""});
  else
    require_accelerate_trainer_step(
        s, {"Accelerate's FSDP1 bf16 path", "autocast over bf16 parameter views",
            "docs/fsdp2.md \"Accelerate's FSDP2 bf16 path\"", ""});
  // A model loaded in 16 bits: Accelerate upcasts its shards after wrapping
  // (accelerate_amp.h accelerate_fsdp1_upcast). Modelled for bf16 (transformers 5.x's
  // dtype="auto" on a bf16 checkpoint); with use_orig_params the bf16 shard lives until
  // each unit's first post-forward reshard, which SHARD_GRAD_OP skips (it keeps the
  // unsharded views: _use_sharded_flat_param's skip_use_sharded_views): not modelled.
  if (s.precision.params != DType::fp32 && s.precision.params != DType::bf16)
    refuse(s, "precision.params",
           "Accelerate's FSDP1 upcast of a 16-bit model is modelled for a model loaded in "
           "bf16 (precision.params bf16) or fp32");
  if (s.precision.params != DType::fp32 && p.use_orig_params && !p.reshard_after_forward)
    refuse(s, "parallel.reshard_after_forward",
           "a bf16-loaded model under Accelerate's FSDP1 upcast with use_orig_params and "
           "SHARD_GRAD_OP (the original parameters keep viewing the bf16 shards past the "
           "forward) is not modelled; modelled with reshard_after_forward true (full_shard)");
  if (p.cpu_offload)
    refuse(s, "parallel.cpu_offload",
           "Accelerate's FSDP1 bf16 path with CPUOffload is not modelled");
  // transformers 4.x (v4.45's LlamaModel.forward) calls
  // self._gradient_checkpointing_func(decoder_layer.__call__, ...) on the FSDP-wrapped
  // layer, so the recompute re-enters FSDP's forward; 5.x's GradientCheckpointingLayer
  // checkpoints inside the wrapped module, as memsim's FSDP1 checkpointing does.
  if (s.checkpoint.policy != CheckpointPolicy::none &&
      !scenario_detail::has_v5_layout(s.model.arch))
    refuse(s, "checkpoint.policy",
           "Accelerate's FSDP1 bf16 path with activation checkpointing is modelled for "
           "transformers 5.x (model.transformers: 5: the checkpoint inside the FSDP unit); "
           "4.x checkpoints around the FSDP-wrapped layer, whose recompute runs FSDP's "
           "forward hooks in backward: not modelled");
}

void require_sync_module_states_modelled(const Scenario& s) {
  if (!s.parallel.fsdp_sync_module_states) return;
  if (s.model.family != ModelFamily::hf_llama || s.model.arch.impl != graph::ModelImpl::hf)
    refuse(s, "parallel.fsdp_sync_module_states",
           "the broadcast buckets are modelled for transformers' decoder rows (model.family "
           "hf-llama, model.implementation hf), whose only buffers are fp32 rotary tables; "
           "other models' buffers (GPT-2's bool masks, other stacks' caches) would make "
           "buckets of several dtypes, which is not modelled");
  // Buckets per dtype (sim/parallel/fsdp_sync_states.h) are checked for fp32 buffers with
  // bf16 parameters on Accelerate's FSDP1 upcast path (no adapters there).
  if ((s.precision.params != DType::fp32 && !accelerate_fsdp1_upcast(s)) ||
      (s.lora.rank > 0 && s.lora.adapter_dtype != DType::fp32))
    refuse(s, "parallel.fsdp_sync_module_states",
           "the broadcast buckets are modelled for fp32 parameters (and fp32 adapters), and "
           "for a bf16-loaded model on Accelerate's FSDP1 path (precision.autocast and "
           "parallel.fsdp_mixed_precision bf16)");
}

}  // namespace memsim
