#include "scenario/context_parallel_keys.h"

#include <string>
#include <utility>
#include <vector>

namespace memsim::scenario_detail {

namespace {

// Named at the offending key where the file sets it, else at parallel.context.
[[noreturn]] void refuse(const Doc& d, const Field& cp, const char* key, const std::string& why) {
  const Field* k = d.find(key);
  fail(k != nullptr ? k->where : cp.where, key,
       "parallel.context > 1: " + why + " (docs/torchtitan-recipes.md, Context parallelism)");
}

}  // namespace

void read_context_parallel(const Doc& d, Scenario& s) {
  if (const Field* r = d.find("parallel.context_rotate")) {
    static const std::vector<std::pair<std::string, ContextRotate>> kRotate = {
        {"allgather", ContextRotate::allgather}, {"alltoall", ContextRotate::alltoall}};
    s.parallel.context_rotate = read_enum(*r, "parallel.context_rotate", kRotate);
  }
  const Field* f = d.find("parallel.context");
  if (f == nullptr) return;
  const int64_t n = read_int(*f, "parallel.context", 1);
  if (n == 1) return;  // torchtitan's default: no context parallelism
  // torchtitan's parallelize_llama asserts seq_len % (tp * 2 * cp) == 0: the causal
  // load balancer cuts the sequence into 2N chunks (rank i holds chunks i and 2N-1-i).
  const int64_t divisor = 2 * n * s.parallel.tensor;
  if (s.batch.seq_len % divisor != 0)
    fail(f->where, "parallel.context",
         "batch.seq_len " + std::to_string(s.batch.seq_len) + " is not divisible by 2 x " +
             std::to_string(n) + (s.parallel.tensor > 1 ? " x parallel.tensor " : "") +
             (s.parallel.tensor > 1 ? std::to_string(s.parallel.tensor) : "") +
             " (context parallelism's load-balanced sharding cuts it into 2N chunks)");
  if (s.model.attention == AttentionImpl::eager)
    fail(f->where, "parallel.context",
         "ring attention replaces the SDPA flash / mem-efficient kernels; model.attention "
         "eager has none to replace (use flash or mem-efficient)");
  if (s.parallel.sharding != Sharding::fsdp2) {
    const Field* sh = d.find("parallel.sharding");
    fail(sh != nullptr ? sh->where : f->where, "parallel.sharding",
         "parallel.context " + std::to_string(n) + " needs parallel.sharding: fsdp2 (torchtitan's "
         "parallelize_llama applies fully_shard over the dp_shard x cp mesh whenever context "
         "parallelism is on; without it the ranks of a context group would keep replicas)");
  }
  if (s.model.family != ModelFamily::hf_llama)
    refuse(d, *f, "model.family",
           std::string(to_string(s.model.family)) + " is not modelled; the hf-llama family is");
  const graph::DecoderArch& a = s.model.arch;
  if (a.impl != graph::ModelImpl::hf)
    refuse(d, *f, "model.implementation",
           "ring attention is modelled on transformers' Llama code under FSDP2 (the model of "
           "scenarios/llama3-8b-fsdp2-8xh100.yaml); ring attention over the torchtitan and "
           "torchtune rows' own attention code is not modelled");
  if (std::string(a.architecture) != "llama" || a.code != graph::ModelCode::llama)
    refuse(d, *f, "model.architecture",
           std::string(a.architecture) + " is not modelled; the llama row is");
  if (s.model.attention == AttentionImpl::mem_efficient)
    refuse(d, *f, "model.attention",
           "the ring over the mem-efficient kernel (its logsumexp padded to 32 rows) is not "
           "modelled; flash is");
  if (s.lora.rank > 0) refuse(d, *f, "lora.rank", "LoRA is not modelled with it");
  if (s.precision.autocast)
    refuse(d, *f, "precision.autocast",
           "autocast is not modelled with it; give bf16 compute through "
           "parallel.fsdp_mixed_precision or precision.params");
  if (s.step.compile) refuse(d, *f, "step.compile", "a compiled ring is not modelled");
  if (!s.checkpoint.offload.empty() || s.checkpoint.offload_all)
    refuse(d, *f, "checkpoint.offload", "activation offload is not modelled with it");
  const CheckpointPolicy p = s.checkpoint.policy;
  if (p != CheckpointPolicy::none && p != CheckpointPolicy::full && p != CheckpointPolicy::sac_layer)
    refuse(d, *f, "checkpoint.policy",
           "only none, full and sac-layer:N (whole blocks re-run, ring included) are modelled; "
           "op-level and per-module policies would cache or skip parts of the ring");
  if (s.loss.impl != LossFunction::automatic)
    refuse(d, *f, "loss.impl", "the model's own loss on the local tokens is modelled; loss.impl is not");
  if (s.parallel.tensor > 1) refuse(d, *f, "parallel.tensor", "tensor parallelism is not modelled with it");
  if (s.parallel.pipeline > 1)
    refuse(d, *f, "parallel.pipeline", "pipeline parallelism is not modelled with it");
  if (const Field* raf = d.find("parallel.reshard_after_forward");
      raf != nullptr && raf->node.IsScalar() && raf->node.Scalar() != "true" &&
      raf->node.Scalar() != "false")
    refuse(d, *f, "parallel.reshard_after_forward",
           "a reshard group of N ranks is checked against parallel.data alone; with context "
           "parallelism (a data x context shard group) use true or false");
  if (s.step.kind != StepKind::train && s.step.kind != StepKind::forward_backward)
    refuse(d, *f, "step.kind", "only train and forward-backward steps are modelled with it");
  s.parallel.context = n;
}

}  // namespace memsim::scenario_detail
