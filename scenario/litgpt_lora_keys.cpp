// LitGPT's LoRA keys (scenario/litgpt_lora_keys.h). Sources: Lightning-AI/litgpt v0.5.13
// (26857050fe3ff627cd714fe92f5838f51a3d5efa) litgpt/lora.py (LoRALayer: nn.Dropout only
// when lora_dropout > 0; LoRALinear; LoRAQKVLinear.conv1d / zero_pad / lora_ind;
// create_lora_linear), litgpt/finetune/lora.py (setup's quantize -> BitsandbytesPrecision;
// fit: lm_head_chunk_size=128, logits[-1][..., :-1, :]), config_hub/finetune/*/lora.yaml.
#include "scenario/litgpt_lora_keys.h"

#include <string>

#include "scenario/scenario_lora.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {
namespace {

// graph/models/lora.h LlamaLinear bits.
constexpr uint32_t kQkvBits = (1u << 0) | (1u << 1) | (1u << 2);
constexpr uint32_t kMlpBits = (1u << 4) | (1u << 5) | (1u << 6);

}  // namespace

void check_litgpt_lora(const Doc& d, const Scenario& s) {
  if (s.lora.rank <= 0) return;
  const Field* impl = d.find("model.implementation");
  auto refuse = [&](const std::string& key, const std::string& why) {
    const Field* o = d.find(key);
    fail(o != nullptr ? o->where : impl->where, key,
         why + " (model.implementation litgpt; docs/implementations.md)");
  };
  const uint32_t mask = lora_target_mask(s.lora, s.model.family);
  if ((mask & kQkvBits) != 0)
    refuse("lora.targets",
           "litgpt's lora_query / lora_key / lora_value adapt the fused qkv through "
           "LoRAQKVLinear, whose lora_B runs as F.conv1d (cuDNN: contiguous copies and a "
           "workspace of the library's choosing) with zero_pad's index_copy_: not modelled; "
           "o_proj (lora_projection) and gate_proj, up_proj, down_proj (lora_mlp) are");
  if ((mask & kMlpBits) != 0 && (mask & kMlpBits) != kMlpBits)
    refuse("lora.targets",
           "litgpt's lora_mlp adapts fc_1, fc_2 and proj together: list gate_proj, up_proj "
           "and down_proj all or none");
  if (s.lora.base_nf4)
    refuse("lora.base_dtype",
           "litgpt's --quantize bnb.* (Fabric's BitsandbytesPrecision) is not modelled; give "
           "the precision.params dtype");
  if (s.lora.adapter_dtype != s.precision.params)
    refuse("lora.adapter_dtype",
           std::string("litgpt builds the adapters under fabric.init_module, in the model's "
                       "dtype: use ") + to_string(s.precision.params));
  if (s.lora.input_require_grads.has_value())
    refuse("lora.input_require_grads",
           "PEFT's enable_input_require_grads has no litgpt counterpart");
  if (s.batch.seq_len % 128 == 1)
    refuse("batch.seq_len",
           "with lm_head_chunk_size=128 the last logits chunk has one position, which "
           "finetune/lora.py's logits[-1][..., :-1, :] empties (zero-size tensors are not "
           "modelled)");
}

}  // namespace memsim::scenario_detail
