#include "sim/modelled_features.h"

#include <string>

namespace memsim {

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
}  // namespace

void require_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  if (p.data != 1 || p.tensor != 1 || p.pipeline != 1 || p.zero != 0) {
    const char* key = p.data != 1 ? "parallel.data"
                      : p.tensor != 1 ? "parallel.tensor"
                      : p.pipeline != 1 ? "parallel.pipeline" : "parallel.zero";
    refuse(s, key,
           "multi-GPU memory (DDP buckets, ZeRO/FSDP sharding, tensor, sequence and pipeline "
           "parallelism) is not modelled yet; memsim simulates one GPU holding the whole "
           "model (set parallel.* to their defaults)");
  }
  if (s.precision.autocast.has_value()) {
    refuse(s, "precision.autocast",
           "autocast (its op dtype rules and weight-cast cache) is not modelled yet; use "
           "precision.autocast: none, or pure low-precision parameters with precision.params");
  }
  if (s.precision.master_weights && s.optimizer.impl == OptimizerImpl::cs336) {
    refuse(s, "precision.master_weights",
           "the CS336 staff AdamW updates the parameters themselves (no fp32 master copy); "
           "use optimizer.impl for-loop, foreach or fused");
  }
  if (s.optimizer.type == OptimizerType::adafactor && s.model.family != ModelFamily::hf_llama &&
      s.model.family != ModelFamily::hf_gpt2) {
    refuse(s, "optimizer.type",
           std::string("Adafactor's factored state needs the parameters' shapes, which memsim "
                       "records for hf-llama and hf-gpt2 only, not '") +
               to_string(s.model.family) + "'");
  }
  if ((s.optimizer.type == OptimizerType::adam8bit || s.optimizer.type == OptimizerType::adamw8bit) &&
      s.model.family == ModelFamily::megatron) {
    refuse(s, "optimizer.type",
           "Megatron-LM's optimizer is a fused fp32 Adam; bitsandbytes 8-bit Adam is modelled "
           "for cs336, hf-gpt2 and hf-llama");
  }
  if (s.lora.rank > 0 && s.checkpoint.policy != "none" && s.checkpoint.reentrant.value_or(false)) {
    refuse(s, "checkpoint.reentrant",
           "LoRA with reentrant checkpointing is not modelled: torch's CheckpointFunction sees "
           "no input that requires grad (the embedding is frozen), so the adapters would get "
           "no gradient unless model.enable_input_require_grads() is called; use "
           "checkpoint.reentrant: false (torch.utils.checkpoint(use_reentrant=False))");
  }
  if (s.model.family == ModelFamily::cs336 && s.model.dropout > 0.0) {
    refuse(s, "model.dropout",
           "the CS336 staff model has no dropout layers; use family hf-gpt2, hf-llama or "
           "megatron for a model with dropout");
  }
}

}  // namespace memsim
