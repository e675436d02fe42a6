#include "sim/parallel/fsdp2_checks.h"

#include <string>

namespace memsim {

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
}  // namespace

void require_fsdp2_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  // With context parallelism the shard group is data x context ranks (torchtitan's
  // dp_shard x cp mesh), so data 1 still shards.
  if (p.data * p.context == 1)
    refuse(s, "parallel.sharding",
           "FSDP2 on one GPU shards nothing (fully_shard's world-size-1 path), which is not "
           "modelled; set parallel.data > 1 or parallel.sharding: none");
  if (p.replicate == p.data * p.context)
    refuse(s, "parallel.replicate",
           "a replicate group as large as parallel.data leaves shard groups of one rank "
           "(DDP through fully_shard), which is not modelled; use parallel.sharding: none for "
           "DDP or a smaller parallel.replicate");
  if (p.fsdp_mixed_precision && s.precision.params != DType::fp32)
    refuse(s, "parallel.fsdp_mixed_precision",
           std::string("modelled for fp32 parameters cast to param_dtype; with precision.params ") +
               to_string(s.precision.params) + " use parallel.fsdp_mixed_precision: none");
  if (s.precision.autocast.has_value())
    refuse(s, "precision.autocast",
           "autocast over FSDP2's unsharded parameters is not modelled yet; use "
           "parallel.fsdp_mixed_precision (MixedPrecisionPolicy) or precision.autocast: none");
  if (s.precision.master_weights)
    refuse(s, "precision.master_weights",
           "fp32 master copies of FSDP2 shards are not modelled; FSDP2 keeps fp32 shards "
           "itself with parallel.fsdp_mixed_precision");
  switch (s.optimizer.type) {
    case OptimizerType::adam8bit:
    case OptimizerType::adamw8bit:
    case OptimizerType::adafactor:
      refuse(s, "optimizer.type",
             "8-bit optimizers and Adafactor over FSDP2's DTensor shards are not modelled; "
             "use adam, adamw or sgd");
    default: break;
  }
  if (s.optimizer.impl == OptimizerImpl::out_of_place)
    refuse(s, "optimizer.impl",
           "the out-of-place Adam creates its state for the module's parameters at "
           "construction; over FSDP2's shards it is not modelled");
  if (s.lora.rank > 0 && s.lora.base_nf4)
    refuse(s, "lora.base_dtype",
           "QLoRA (nf4 base weights) under FSDP2 is not modelled; use lora.base_dtype "
           "equal to precision.params");
  if (s.lora.rank > 0 && p.fsdp_mixed_precision)
    refuse(s, "parallel.fsdp_mixed_precision",
           "LoRA with FSDP2's MixedPrecisionPolicy is not modelled (adapters and base weights "
           "would be cast to param_dtype); use parallel.fsdp_mixed_precision: none");
}

}  // namespace memsim
