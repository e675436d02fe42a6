#include "scenario/lora_target_parameters_key.h"

#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

void refuse_lora_target_parameters(const Doc& d, const Scenario& s) {
  const Field* f = d.find("lora.target_parameters");
  if (f == nullptr) return;
  if (s.model.arch.moe.experts <= 0)
    fail(f->where, "lora.target_parameters",
         "PEFT's target_parameters wraps nn.Parameters such as the 3-D routed experts of a "
         "mixture-of-experts model; this model has none (model.moe) and memsim does not model "
         "it: use lora.targets (nn.Linear modules)");
  fail(f->where, "lora.target_parameters",
       "LoRA on the routed experts (PEFT >= 0.17 ParamWrapper: one lora_A (r*E, in) and lora_B "
       "(out, r*E) per 3-D parameter, the merged weight W + einsum(B, A) * scaling materialised "
       "per layer on every forward and kept by the experts' saved select views) is not modelled "
       "yet (docs/moe.md); use lora.targets on attention, dense MLPs and shared experts");
}

}  // namespace memsim::scenario_detail
