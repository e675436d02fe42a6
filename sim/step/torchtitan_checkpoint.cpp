#include "sim/step/torchtitan_checkpoint.h"

#include <string>

#include "scenario/scenario_family.h"

namespace memsim {

graph::SelectivePolicy torchtitan_op_sac_policy() {
  using graph::OpKind;
  using graph::SacRule;
  graph::SelectivePolicy p;
  auto set = [&p](OpKind k, SacRule r) { p.rule[static_cast<size_t>(k)] = r; };
  // aten.mm.default: saved unless it is the block's 2nd, 4th, ... mm.
  set(OpKind::mm_linear, SacRule::save_odd);
  // aten._scaled_dot_product_flash_attention / _efficient_attention: all outputs saved.
  set(OpKind::sdpa_flash, SacRule::save);
  set(OpKind::sdpa_efficient, SacRule::save);
  return p;
}

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
}  // namespace

void require_torchtitan_modelled(const Scenario& s) {
  const CheckpointPolicy policy = s.checkpoint.policy;
  if (policy != CheckpointPolicy::sac_op && policy != CheckpointPolicy::sac_layer) return;
  const char* name = policy == CheckpointPolicy::sac_op ? "sac-op" : "sac-layer";
  const FamilyRow& family = family_row(s.model.family);
  if (family.reentrant_checkpoint_only)
    refuse(s, "checkpoint.policy",
           std::string(name) + " is torchtitan's (torch.utils.checkpoint without reentrant); "
           "Megatron-LM recomputes with its own reentrant CheckpointFunction (use full, "
           "selective, uniform:K or block:N)");
  if (s.checkpoint.reentrant.value_or(false))
    refuse(s, "checkpoint.reentrant",
           std::string(name) + " is torchtitan's ptd_checkpoint_wrapper, which is "
           "non-reentrant (selective contexts need use_reentrant=False); leave "
           "checkpoint.reentrant out or set it false");
  if (policy != CheckpointPolicy::sac_op) return;
  // The policy decides per aten op; memsim knows which of its ops are aten.mm and the SDPA
  // kernels in the Hugging Face decoders. The staff model's einsum linears and a LoRA
  // layer's inner matmuls (PEFT's lora_A/B, bitsandbytes' MatMul4Bit) are not mapped.
  if (!family.hf)
    refuse(s, "checkpoint.policy",
           std::string("sac-op is modelled for the hf-* families (their linears are aten.mm / "
                       "addmm, their attention kernels named), not '") +
               to_string(s.model.family) + "'; use full or sac-layer:N");
  if (s.lora.rank > 0)
    refuse(s, "lora.rank",
           "sac-op with LoRA adapters is not modelled (the adapters' and the 4-bit base's "
           "inner aten.mm calls would shift torchtitan's every-other-mm count); use "
           "lora.rank: 0 or checkpoint.policy full");
}

}  // namespace memsim
