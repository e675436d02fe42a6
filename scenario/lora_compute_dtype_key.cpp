// lora.compute_dtype: bitsandbytes' Linear4bit compute dtype (scenario/lora_compute_dtype_key.h).
#include "scenario/lora_compute_dtype_key.h"

#include <string>
#include <utility>
#include <vector>

#include "scenario/yaml_fields.h"

namespace memsim {

DType kbit_model_dtype(const Scenario& s) {
  return s.lora.base_nf4 && s.lora.prepare_kbit ? DType::fp32 : s.precision.params;
}

DType kbit_compute_dtype(const Scenario& s) {
  return s.lora.compute_dtype.value_or(s.precision.params);
}

namespace scenario_detail {

void read_lora_compute_dtype(const Doc& d, Scenario& s) {
  const Field* f = d.find("lora.compute_dtype");
  if (f != nullptr) {
    const std::vector<std::pair<std::string, DType>> dtypes = {
        {"bf16", DType::bf16}, {"fp16", DType::fp16}, {"fp32", DType::fp32}};
    s.lora.compute_dtype = read_enum(*f, "lora.compute_dtype", dtypes);
    if (s.lora.rank == 0 || !s.lora.base_nf4)
      fail(f->where, "lora.compute_dtype",
           "is bitsandbytes' Linear4bit compute dtype (bnb_4bit_compute_dtype): it needs "
           "lora.rank and lora.base_dtype: nf4");
  }
  if (!s.lora.base_nf4) return;
  // After prepare_model_for_kbit_training's upcast the attention's q/k/v are fp32 (each
  // projection casts back to its input's dtype): SDPA's flash and cuDNN kernels take 16-bit
  // inputs only, and transformers' flash_attention_2 casts fp32 q/k/v down first (a copy
  // memsim does not model).
  if (kbit_model_dtype(s) != s.precision.params &&
      (s.model.attention == AttentionImpl::flash || s.model.attention == AttentionImpl::cudnn)) {
    const Field* at = d.find("model.attention");
    fail(at != nullptr ? at->where : d.find("lora.prepare_kbit")->where, "model.attention",
         std::string("with lora.prepare_kbit over a ") + to_string(s.precision.params) +
             " load the hidden states and q/k/v are fp32, which the " +
             to_string(s.model.attention) +
             " kernel does not take (transformers' flash_attention_2 would cast them down: "
             "not modelled); use mem-efficient or eager");
  }
  // Linear4bit.forward: `if bias.dtype != x.dtype: bias.data = bias.data.to(x.dtype)`.
  const graph::DecoderArch& a = s.model.arch;
  if (!(a.qkv_bias || a.o_bias || a.mlp_bias)) return;
  if (kbit_model_dtype(s) == kbit_compute_dtype(s)) return;
  const Field* key = f != nullptr ? f : d.find("lora.prepare_kbit");
  const char* name = f != nullptr ? "lora.compute_dtype" : "lora.prepare_kbit";
  fail(key->where, name,
       std::string("this model's 4-bit linears have biases in ") + to_string(kbit_model_dtype(s)) +
           ", which Linear4bit.forward casts to the compute dtype " +
           to_string(kbit_compute_dtype(s)) +
           " on its first call (`bias.data = bias.data.to(x.dtype)`): not modelled; give a "
           "compute dtype equal to the model's");
}

}  // namespace scenario_detail
}  // namespace memsim
