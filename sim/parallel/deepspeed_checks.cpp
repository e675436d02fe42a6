#include "sim/parallel/deepspeed_checks.h"

#include <string>

#include "scenario/scenario_family.h"

namespace memsim {

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
}  // namespace

void require_deepspeed_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  const DeepSpeedConfig& c = s.deepspeed;
  if (!family_row(s.model.family).torch_data_parallel)
    refuse(s, "parallel.sharding", "DeepSpeed ZeRO is modelled for hf-llama, hf-gpt2 and cs336, not '" +
                                       std::string(to_string(s.model.family)) + "'");
  if (p.zero < 1 || p.zero > 3)
    refuse(s, "parallel.zero", "DeepSpeed ZeRO stages are 1, 2 and 3, got " + std::to_string(p.zero));
  if (p.data < 2) refuse(s, "parallel.data", "DeepSpeed ZeRO on one GPU partitions nothing; set parallel.data > 1");
  if (s.precision.master_weights)
    refuse(s, "precision.master_weights",
           "DeepSpeed ZeRO always keeps fp32 master partitions of 16-bit parameters; remove the key "
           "(precision.params bf16/fp16 is DeepSpeed's bf16/fp16 mode)");
  if (s.precision.autocast.has_value())
    refuse(s, "precision.autocast", "torch autocast with DeepSpeed (its torch_autocast mode) is not "
                                    "modelled; use precision.params bf16 (DeepSpeed's bf16 mode)");
  switch (s.optimizer.type) {
    case OptimizerType::adam8bit:
    case OptimizerType::adamw8bit:
    case OptimizerType::adafactor:
      refuse(s, "optimizer.type", "DeepSpeed ZeRO is modelled with Adam / AdamW (FusedAdam, CPUAdam or "
                                  "a torch optimizer) and SGD; not " + std::string(to_string(s.optimizer.type)));
    default: break;
  }
  if (s.optimizer.impl == OptimizerImpl::cs336 || s.optimizer.impl == OptimizerImpl::out_of_place)
    refuse(s, "optimizer.impl", "DeepSpeed steps its flat fp32 partitions with FusedAdam (fused) or a "
                                "torch.optim optimizer (foreach, for-loop); not " +
                                    std::string(to_string(s.optimizer.impl)));
  if (!c.contiguous_gradients)
    refuse(s, "deepspeed.contiguous_gradients",
           "false (gradients reduced through flattened copies) is not modelled; use true, the default");
  if (p.zero == 1 && c.offload_optimizer != DsOffload::none)
    refuse(s, "deepspeed.offload_optimizer", "ZeRO-Offload is modelled for stages 2 and 3; use parallel.zero 2");
  if (p.zero == 1 && c.overlap())
    refuse(s, "deepspeed.overlap_comm", "stage 1 with overlap_comm reduces gradients in the hooks, which "
                                        "is not modelled; use false (stage 1's default)");
  if (p.zero == 3 && s.precision.params == DType::fp32)
    refuse(s, "precision.params", "ZeRO-3 without bf16/fp16 (the fp32 master aliasing the partitions) is "
                                  "not modelled; use bf16 or fp16, or parallel.zero 1 or 2");
  if (s.lora.rank > 0) {
    if (s.lora.base_nf4) refuse(s, "lora.base_dtype", "QLoRA (NF4 base) with DeepSpeed is not modelled");
    if (s.lora.adapter_dtype != s.precision.params)
      refuse(s, "lora.adapter_dtype",
             std::string("DeepSpeed's ") + to_string(s.precision.params) +
                 " mode runs every parameter, the adapters too, in " + to_string(s.precision.params) +
                 "; set lora.adapter_dtype " + to_string(s.precision.params));
  }
}

}  // namespace memsim
