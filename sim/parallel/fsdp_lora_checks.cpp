#include "sim/parallel/fsdp_lora_checks.h"

#include <string>

namespace memsim {

namespace {
// "FILE:LINE: KEY: why" ("FILE: KEY" for a key left at its default, "--set KEY").
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.key_prefix(key) + ": " + why);
}
}  // namespace

void require_fsdp_lora_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  if (p.sharding != Sharding::fsdp) return;
  const bool lora = s.lora.rank > 0;
  if (p.fsdp_wrap == FsdpWrap::peft && !lora)
    refuse(s, "parallel.fsdp_wrap",
           "peft (PEFT's fsdp_auto_wrap_policy) is for PEFT models: without LoRA it makes every "
           "trainable leaf module (each Linear, norm and embedding) its own FSDP unit, which is "
           "not modelled; use parallel.fsdp_wrap: block");
  if (p.use_orig_params && p.cpu_offload)
    refuse(s, "parallel.cpu_offload",
           "CPUOffload with use_orig_params=True (the optimizer stepping CPU views of the "
           "shards) is not modelled; use parallel.use_orig_params: false");
  if (!lora) return;
  if (p.fsdp_wrap == FsdpWrap::block && !p.use_orig_params)
    refuse(s, "parallel.use_orig_params",
           "false with lora and parallel.fsdp_wrap: block cannot run: each block's "
           "FlatParameter would hold the frozen base weights and the trainable adapters, and "
           "FSDP refuses that (\"Must flatten tensors with uniform `requires_grad` when "
           "`use_orig_params=False`\"); set parallel.use_orig_params: true, or "
           "parallel.fsdp_wrap: peft (PEFT's policy, the adapters in units of their own)");
  if (s.lora.base_nf4)
    refuse(s, "lora.base_dtype",
           "QLoRA (nf4 base weights, bnb_4bit_quant_storage) under FSDP1 is not modelled; use "
           "lora.base_dtype as precision.params");
  if (s.lora.adapter_dtype != s.precision.params)
    refuse(s, "lora.adapter_dtype",
           std::string("adapters in ") + to_string(s.lora.adapter_dtype) + " next to " +
               to_string(s.precision.params) +
               " base weights are not modelled under FSDP1 (a FlatParameter holds one dtype: "
               "\"Must flatten tensors with uniform dtype\"); set lora.adapter_dtype " +
               to_string(s.precision.params) + " (PEFT's autocast_adapter_dtype=False)");
  if (p.fsdp_mixed_precision.has_value())
    refuse(s, "parallel.fsdp_mixed_precision",
           "FSDP1's MixedPrecision with LoRA is not modelled (the adapters would compute in "
           "param_dtype as views of the low-precision flat parameter); use "
           "parallel.fsdp_mixed_precision: none with lora");
  if (s.precision.autocast.has_value())
    refuse(s, "precision.autocast",
           "autocast over FSDP1's LoRA views is not modelled (the casts of the adapters' "
           "and base weights' views at every use); use precision.autocast: none with lora "
           "under parallel.sharding: fsdp");
}

}  // namespace memsim
