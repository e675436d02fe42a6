#include "scenario/sdpa_kernel_keys.h"

#include <string>

#include "scenario/model_architecture.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

namespace {

// The key's own line when the file (or --set) gives it, else model.attention's, else the
// model section's.
std::string at(const Doc& d, const char* key) {
  if (const Field* f = d.find(key)) return f->where;
  if (const Field* f = d.find("model.attention")) return f->where;
  return d.where_missing("model");
}

[[noreturn]] void refuse(const Doc& d, const char* key, const std::string& why) {
  fail(at(d, key), key, why + " (docs/sdpa-gqa.md)");
}

// Whether attention's q/k/v arrive in fp32: fp32 parameters, no autocast, and no FSDP
// mixed-precision policy that gathers the parameters in a 16-bit dtype (FSDP1's
// MixedPrecision / FSDP2's MixedPrecisionPolicy param_dtype: the blocks then compute in it).
bool fp32_compute(const Scenario& s) {
  if (s.precision.params != DType::fp32 || s.precision.autocast) return false;
  const ParallelConfig& p = s.parallel;
  const bool fsdp = p.sharding == Sharding::fsdp || p.sharding == Sharding::fsdp2;
  return !(fsdp && p.fsdp_mixed_precision && *p.fsdp_mixed_precision != DType::fp32);
}

void check_cudnn(const Doc& d, const Scenario& s) {
  const ModelConfig& m = s.model;
  if (fp32_compute(s))
    fail(at(d, "model.attention"), "model.attention",
         "cudnn with fp32 compute (precision.params fp32, no precision.autocast): cuDNN "
         "attention takes fp16/bf16 only, PyTorch runs mem-efficient or math for fp32");
  if (m.family != ModelFamily::hf_llama)
    refuse(d, "model.family", std::string("cuDNN attention is modelled for hf-llama's rows; the family is ") +
                                  to_string(m.family));
  if (m.arch.impl != graph::ModelImpl::hf)
    refuse(d, "model.implementation",
           "cuDNN attention is modelled on transformers' code (model.implementation hf); the "
           "torchtitan / torchtune / litgpt rows model flash and mem-efficient");
  if (m.dropout > 0.0)
    refuse(d, "model.dropout", "attention dropout on the cuDNN kernel is not measured; use 0");
  const int64_t hd = head_dim(m);
  if (hd > 256 || hd % 8 != 0)
    refuse(d, "model.attention",
           "cuDNN attention takes head sizes up to 256 in multiples of 8 (head size " +
               std::to_string(hd) + "); PyTorch would pick another kernel");
  if (s.parallel.context > 1)
    refuse(d, "parallel.context", "ring attention is modelled over the flash kernel; use model.attention flash");
  if (s.step.compile) refuse(d, "step.compile", "a compiled cuDNN attention is not modelled");
  if (s.step.kind == StepKind::generate)
    refuse(d, "step.kind", "generation with cuDNN attention is not modelled; use model.attention eager");
  const CheckpointPolicy p = s.checkpoint.policy;
  if (p != CheckpointPolicy::none && p != CheckpointPolicy::full)
    refuse(d, "checkpoint.policy",
           "with cuDNN attention only none and full are modelled (a policy that caches or "
           "skips the attention op would keep its seed/offset outputs, not checked)");
}

}  // namespace

void check_sdpa_kernel(const Doc& d, const Scenario& s) {
  const ModelConfig& m = s.model;
  if (m.attention == AttentionImpl::cudnn) check_cudnn(d, s);
  const bool grouped = m.arch.sdpa_gqa && m.kv_heads < m.heads && head_dim(m) <= 256 &&
                       m.attention != AttentionImpl::eager;
  if (!grouped) return;
  if (m.attention == AttentionImpl::mem_efficient)
    refuse(d, "model.attention",
           "mem-efficient with grouped KV heads under model.transformers 5: transformers 5.x "
           "calls SDPA with enable_gqa=True, which torch 2.11's mem-efficient kernel rejects, "
           "so SDPA runs its math kernel (S x S scores), which is not modelled; use eager, or "
           "flash / cudnn in fp16/bf16");
  if (s.parallel.context > 1)
    refuse(d, "parallel.context",
           "ring attention over transformers 5.x's enable_gqa SDPA call is not modelled");
}

}  // namespace memsim::scenario_detail
