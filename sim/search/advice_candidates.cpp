#include "sim/search/advice_candidates.h"

namespace memsim {

namespace {

bool hf_family(const Scenario& s) {
  return s.model.family == ModelFamily::hf_llama || s.model.family == ModelFamily::hf_gpt2;
}

bool has_backward(const Scenario& s) {
  return s.step.kind == StepKind::train || s.step.kind == StepKind::forward_backward;
}

bool adam(const Scenario& s) {
  return s.optimizer.type == OptimizerType::adam || s.optimizer.type == OptimizerType::adamw;
}

int64_t smallest_prime_factor(int64_t n) {
  for (int64_t p = 2; p * p <= n; ++p)
    if (n % p == 0) return p;
  return n;
}

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

std::vector<AdviceCandidate> advice_candidates(const Scenario& s) {
  std::vector<AdviceCandidate> out;
  const bool train = s.step.kind == StepKind::train;
  const bool generate = s.step.kind == StepKind::generate;

  // Optimizer: the fused kernel keeps no step temporaries (sim/optim/); 8-bit state is
  // 2.03 bytes per parameter instead of 8.
  if (train && adam(s) &&
      (s.optimizer.impl == OptimizerImpl::foreach || s.optimizer.impl == OptimizerImpl::for_loop))
    out.push_back({std::string("fused ") + to_string(s.optimizer.type) + " (torch.optim fused=True)",
                   {{"optimizer.impl", "fused"}}});
  if (train && adam(s) && s.model.family != ModelFamily::megatron) {
    const std::string type = s.optimizer.type == OptimizerType::adam ? "adam8bit" : "adamw8bit";
    out.push_back({"8-bit optimizer state (bitsandbytes " + type + ")", {{"optimizer.type", type}}});
  }

  // Activation checkpointing.
  if (has_backward(s)) {
    const CheckpointPolicy now = s.checkpoint.policy;
    if (now != CheckpointPolicy::full)
      out.push_back({"checkpoint every layer (checkpoint.policy full)", {{"checkpoint.policy", "full"}}});
    if (now == CheckpointPolicy::none)
      out.push_back({"selective activation checkpointing (checkpoint.policy selective)",
                     {{"checkpoint.policy", "selective"}}});
    if (now == CheckpointPolicy::none && hf_family(s))
      out.push_back({"torchtitan's op-level selective checkpointing (checkpoint.policy sac-op)",
                     {{"checkpoint.policy", "sac-op"}}});
  }

  // Smaller micro-batches, the same global batch.
  if (train && s.batch.micro_batch >= 2) {
    const int64_t p = smallest_prime_factor(s.batch.micro_batch);
    out.push_back({"micro-batch " + str(s.batch.micro_batch / p) + " x " +
                       str(s.batch.grad_accum * p) + " accumulation steps (same global batch)",
                   {{"batch.micro_batch", str(s.batch.micro_batch / p)},
                    {"batch.grad_accum", str(s.batch.grad_accum * p)}}});
  }

  // Loss without the full fp32 logits.
  if (!generate && hf_family(s)) {
    if (s.loss.impl != LossFunction::chunked)
      out.push_back({"chunked loss (torchtune's chunked output + CEWithChunkedOutputLoss, 8 chunks)",
                     {{"loss.impl", "chunked:8"}}});
    if (s.loss.impl != LossFunction::liger)
      out.push_back({"Liger fused linear cross-entropy (no logits)", {{"loss.impl", "liger"}}});
  }

  if (!s.allocator.expandable_segments)
    out.push_back({"expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
                   {{"allocator.expandable_segments", "true"}}});

  // FSDP / FSDP2 over a model built whole on the GPU: its freed segments stay reserved
  // (docs/moe.md "Reserved much larger than allocated"); built on the meta device or the
  // CPU only the shards are allocated.
  if ((s.parallel.sharding == Sharding::fsdp || s.parallel.sharding == Sharding::fsdp2) &&
      !s.parallel.fsdp_init_on_cpu)
    out.push_back({"build the model on the meta device or the CPU before sharding",
                   {{"parallel.fsdp_init", "cpu"}}});

  // Offload.
  if (has_backward(s))
    out.push_back({"offload saved activations to the host", {{"checkpoint.offload_activations", "true"}}});
  if ((s.parallel.sharding == Sharding::fsdp || s.parallel.sharding == Sharding::fsdp2) &&
      !s.parallel.cpu_offload)
    out.push_back({"FSDP CPU offload of parameters, gradients and optimizer",
                   {{"parallel.cpu_offload", "true"}}});
  if (s.parallel.sharding == Sharding::deepspeed && s.parallel.zero >= 2 &&
      s.deepspeed.offload_optimizer == DsOffload::none)
    out.push_back({"DeepSpeed optimizer offload to the CPU", {{"deepspeed.offload_optimizer", "cpu"}}});

  // More GPUs, sharded.
  if (train) {
    const int64_t d = s.parallel.data;
    const bool megatron = s.model.family == ModelFamily::megatron;
    if (!megatron && s.parallel.sharding == Sharding::none && s.parallel.zero == 0 && d > 1)
      out.push_back({"FSDP (FULL_SHARD, built on the CPU) over the same " + str(d) + " GPUs",
                     {{"parallel.sharding", "fsdp"}, {"parallel.fsdp_init", "cpu"}}});
    for (int64_t k : {2, 4, 8}) {
      AdviceCandidate c;
      c.sets.push_back({"parallel.data", str(d * k)});
      std::string how;
      if (megatron) {
        how = "Megatron's distributed optimizer";
        if (s.parallel.zero == 0) c.sets.push_back({"parallel.zero", "1"});
      } else if (s.parallel.sharding == Sharding::none) {
        // Built on the CPU and moved unit by unit (FSDP(device_id=...)), as a model that
        // does not fit one GPU must be: built on the GPU first, the whole model would be.
        how = "FSDP (FULL_SHARD, built on the CPU)";
        c.sets.push_back({"parallel.sharding", "fsdp"});
        c.sets.push_back({"parallel.fsdp_init", "cpu"});
      } else {
        how = s.parallel.sharding == Sharding::deepspeed ? "DeepSpeed ZeRO-" + str(s.parallel.zero)
              : s.parallel.sharding == Sharding::fsdp2   ? std::string("FSDP2")
                                                         : std::string("FSDP");
      }
      c.change = str(d * k) + " GPUs with " + how + " (global batch x" + str(k) + ")";
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace memsim
