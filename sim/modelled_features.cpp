#include "sim/modelled_features.h"

#include <string>

namespace memsim {

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
// Autocast is modelled for the cs336 family and hf-llama (eager attention, untied head)
// with fp32 parameters and no activation checkpointing (graph/autocast.h); everything
// else is refused by key.
void require_autocast_modelled(const Scenario& s) {
  if (s.model.family != ModelFamily::cs336 && s.model.family != ModelFamily::hf_llama) {
    refuse(s, "precision.autocast",
           std::string("autocast is modelled for the cs336 and hf-llama families only, not '") +
               to_string(s.model.family) + "'; use precision.autocast: none");
  }
  if (s.model.family == ModelFamily::hf_llama && s.model.attention != AttentionImpl::eager) {
    refuse(s, "model.attention",
           "autocast is modelled for hf-llama's eager attention only (the fused SDPA kernels' "
           "low-precision inputs are not); use model.attention: eager or precision.autocast: none");
  }
  if (s.model.family == ModelFamily::hf_llama && s.model.dropout > 0.0) {
    refuse(s, "model.dropout",
           "attention dropout under autocast is not checked against torch yet for hf-llama; "
           "use model.dropout: 0 or precision.autocast: none");
  }
  if (s.model.family == ModelFamily::hf_llama && s.model.tied_embeddings) {
    refuse(s, "model.tied_embeddings",
           "autocast with a tied embedding/lm_head weight is not modelled yet; use "
           "model.tied_embeddings: false or precision.autocast: none");
  }
  if (s.precision.params != DType::fp32) {
    refuse(s, "precision.autocast",
           "autocast casts fp32 parameters; with precision.params bf16/fp16 use "
           "precision.autocast: none");
  }
  if (s.checkpoint.policy != "none") {
    refuse(s, "checkpoint.policy",
           "activation checkpointing under precision.autocast is not modelled yet; use "
           "checkpoint.policy: none or precision.autocast: none");
  }
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
  if (s.precision.autocast.has_value()) require_autocast_modelled(s);  // below
  if (s.precision.master_weights && s.model.family != ModelFamily::megatron) {
    refuse(s, "precision.master_weights",
           std::string("fp32 master weights are modelled for the megatron family only, not '") +
               to_string(s.model.family) + "'");
  }
  if (s.model.family == ModelFamily::cs336 && s.model.dropout > 0.0) {
    refuse(s, "model.dropout",
           "the CS336 staff model has no dropout layers; use family hf-gpt2, hf-llama or "
           "megatron for a model with dropout");
  }
}

}  // namespace memsim
