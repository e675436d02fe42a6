#include "scenario/scenario_lora.h"

#include <algorithm>

#include "scenario/scenario_family.h"
#include "scenario/yaml_fields.h"

namespace memsim {

namespace {
// PEFT matches target_modules by name suffix: GPT-2's "c_proj" is both attn.c_proj and
// mlp.c_proj; the qualified names pick one.
struct Alias {
  const char* name;
  uint32_t mask;
};
const std::vector<Alias>& aliases(ModelFamily family) {
  static const std::vector<Alias> llama = {
      {"q_proj", 1u << 0}, {"k_proj", 1u << 1}, {"v_proj", 1u << 2}, {"o_proj", 1u << 3},
      {"gate_proj", 1u << 4}, {"up_proj", 1u << 5}, {"down_proj", 1u << 6},
      // Multi-head latent attention (DeepSeek-V2 / V3; graph/models/lora.h MlaLinear): bits 9-12
      // (7-8 are lora.target_parameters').
      {"q_a_proj", 1u << 9}, {"q_b_proj", 1u << 10}, {"kv_a_proj_with_mqa", 1u << 11},
      {"kv_b_proj", 1u << 12}, {"all-linear", 0x7fu | 0x1e00u}};
  static const std::vector<Alias> gpt2 = {
      {"c_attn", 1u << 0}, {"c_proj", (1u << 1) | (1u << 3)}, {"attn.c_proj", 1u << 1},
      {"c_fc", 1u << 2}, {"mlp.c_proj", 1u << 3}, {"all-linear", 0xfu}};
  static const std::vector<Alias> none;
  switch (family) {
    case ModelFamily::hf_llama: return llama;
    case ModelFamily::hf_gpt2: return gpt2;
    default: return none;
  }
}
// lora.target_parameters (scenario/lora_target_parameters_key.h) stores its canonical names
// in LoraConfig::targets: bits 7 and 8 (graph::kExpertsGateUp, graph::kExpertsDown).
const std::vector<Alias> llama_params = {{"mlp.experts.gate_up_proj", 1u << 7},
                                         {"mlp.experts.down_proj", 1u << 8}};
}  // namespace

const std::vector<std::string>& lora_module_names(ModelFamily family) {
  static const std::vector<std::string> llama = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  static const std::vector<std::string> gpt2 = {"c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"};
  static const std::vector<std::string> none;
  return family == ModelFamily::hf_llama ? llama : family == ModelFamily::hf_gpt2 ? gpt2 : none;
}

uint32_t lora_target_mask(const LoraConfig& lora, ModelFamily family) {
  uint32_t mask = 0;
  for (const std::string& t : lora.targets) {
    for (const Alias& a : aliases(family))
      if (t == a.name) mask |= a.mask;
    if (family == ModelFamily::hf_llama)
      for (const Alias& a : llama_params)
        if (t == a.name) mask |= a.mask;
  }
  return mask;
}

namespace scenario_detail {

namespace {
// lora.dropout, base_dtype and adapter_dtype (after rank, alpha and targets).
LoraConfig read_lora_rest(const Doc& d, const PrecisionConfig& precision, LoraConfig c,
                          const ModelConfig& model) {
  if (const Field* f = d.find("lora.dropout")) {
    c.dropout = read_number(*f, "lora.dropout");
    if (c.dropout < 0.0 || c.dropout >= 1.0)
      fail(f->where, "lora.dropout", "expected a probability in [0, 1), got '" + f->node.Scalar() + "'");
  }
  if (const Field* f = d.find("lora.base_dtype")) {
    const std::string v = read_string(*f, "lora.base_dtype");
    if (v == "nf4") {
      c.base_nf4 = true;
    } else if (v != to_string(precision.params)) {
      fail(f->where, "lora.base_dtype",
           "expected nf4 (bitsandbytes 4-bit, QLoRA) or the precision.params dtype '" +
               std::string(to_string(precision.params)) + "', got '" + v + "'");
    }
  }
  if (const Field* f = d.find("lora.adapter_dtype")) {
    const std::vector<std::pair<std::string, DType>> dtypes = {
        {"fp32", DType::fp32}, {"bf16", DType::bf16}, {"fp16", DType::fp16}};
    c.adapter_dtype = read_enum(*f, "lora.adapter_dtype", dtypes);
  } else if (model.arch.impl == graph::ModelImpl::torchtune ||
             model.arch.impl == graph::ModelImpl::litgpt) {
    // torchtune builds the whole model, adapters included, under set_default_dtype(dtype)
    // (recipes/lora_finetune_single_device.py _setup_model), LitGPT under
    // fabric.init_module (finetune/lora.py main): the adapters are in precision.params (a
    // different lora.adapter_dtype is refused by check_implementation).
    c.adapter_dtype = precision.params;
  }
  return c;
}
}  // namespace

LoraConfig build_lora(const Doc& d, const ModelConfig& model, const PrecisionConfig& precision) {
  LoraConfig c;
  bool any = false;
  for (const auto& [key, field] : d.fields) any = any || key.rfind("lora.", 0) == 0;
  if (!any) return c;
  const Field* rank = d.find("lora.rank");
  if (rank == nullptr) fail(d.where_missing("lora"), "lora.rank", "required when a lora section is given");
  c.rank = read_int(*rank, "lora.rank", 1);
  c.alpha = 8.0;
  if (const Field* f = d.find("lora.alpha")) {
    c.alpha = read_number(*f, "lora.alpha");
    if (!(c.alpha > 0.0)) fail(f->where, "lora.alpha", "expected a number > 0, got '" + f->node.Scalar() + "'");
  }
  const Field* targets = d.find("lora.targets");
  // PEFT's LoraConfig takes target_parameters alone (target_modules None): lora.targets is
  // then optional (scenario/lora_target_parameters_key.h reads the parameters).
  if (targets == nullptr && d.find("lora.target_parameters") != nullptr) return read_lora_rest(d, precision, c, model);
  if (targets == nullptr)
    fail(d.where_missing("lora"), "lora.targets",
         "required when a lora section is given (module names such as q_proj, v_proj, or all-linear)");
  // A YAML list, or one string with commas ("q_proj,v_proj", as --set spells it).
  c.targets = read_name_list(*targets, "lora.targets");
  if (!family_row(model.family).lora) {
    fail(targets->where, "lora.targets",
         std::string("LoRA is modelled for the hf-llama and hf-gpt2 families, not '") +
             to_string(model.family) + "'");
  }
  std::vector<std::string> names;
  for (const Alias& a : aliases(model.family)) names.push_back(a.name);
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  if (c.targets.empty()) fail(targets->where, "lora.targets", "expected at least one of " + list);
  for (const std::string& t : c.targets) {
    bool known = false;
    for (const auto& n : names) known = known || n == t;
    if (!known)
      fail(targets->where, "lora.targets",
           std::string("'") + t + "' is not a linear module of " + to_string(model.family) +
               " (expected " + list + ")" + did_you_mean(t, names));
    // The latent attention's names exist only in DeepSeek-V2 / V3 (which names its own
    // attention has is checked by scenario/deepseek_keys.cpp).
    if (!model.arch.mla.enabled() && (t == "q_a_proj" || t == "q_b_proj" || t == "kv_a_proj_with_mqa" ||
                                      t == "kv_b_proj"))
      fail(targets->where, "lora.targets",
           "'" + t + "' is a projection of multi-head latent attention (DeepSeek-V2 / V3), which this "
           "model does not have");
  }
  return read_lora_rest(d, precision, c, model);
}

}  // namespace scenario_detail
}  // namespace memsim
