#include "sim/parallel/data_parallel.h"

#include <stdexcept>
#include <string>

#include "sim/parallel/accelerate_amp.h"
#include "sim/parallel/fsdp2_checks.h"
#include "sim/parallel/deepspeed_checks.h"
#include "sim/parallel/zero_sharding.h"
#include "scenario/scenario_family.h"

namespace memsim {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

void require_data_parallel_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  const FamilyRow& family = family_row(s.model.family);
  if (p.gradient_as_bucket_view &&
      (!family.torch_data_parallel || p.sharding != Sharding::none || p.data == 1))
    throw ScenarioError(s.source + ": parallel.gradient_as_bucket_view: applies to torch "
                        "DistributedDataParallel only (cs336 / hf-* with parallel.data > 1 and "
                        "parallel.sharding: none); megatron's gradients always live in its "
                        "grad buffer");
  if (!family.torch_data_parallel) {
    if (p.sharding != Sharding::none)
      throw ScenarioError(s.source + ": parallel.sharding: the megatron family shards with "
                          "its distributed optimizer (parallel.zero: 1), not FSDP / DeepSpeed; "
                          "use parallel.sharding: none");
    return;  // build_megatron_program checks parallel.zero
  }
  if (p.sharding == Sharding::fsdp2) return require_fsdp2_modelled(s);  // sim/parallel/fsdp2_checks.h
  if (p.sharding == Sharding::fsdp && p.data == 1)
    throw ScenarioError(s.source + ": parallel.sharding: FSDP on one GPU switches to NO_SHARD "
                        "(nothing to shard), which is not modelled; set parallel.data > 1 or "
                        "parallel.sharding: none");
  if (p.sharding == Sharding::deepspeed) {  // sim/parallel/deepspeed_checks.h
    require_deepspeed_modelled(s);
    return;
  }
  // Accelerate's FSDP1 path upcasts a 16-bit model's shards itself (accelerate_amp.h
  // accelerate_fsdp1_upcast; sim/parallel/accelerate_fsdp1_checks.h admits bf16).
  if (p.fsdp_mixed_precision && s.precision.params != DType::fp32 && !accelerate_fsdp1_amp(s))
    throw ScenarioError(s.source + ": parallel.fsdp_mixed_precision: FSDP MixedPrecision casts "
                        "fp32 parameters for compute; with precision.params " +
                        std::string(to_string(s.precision.params)) +
                        " use parallel.fsdp_mixed_precision: none");
  if (p.cpu_offload && (s.optimizer.type == OptimizerType::adam8bit ||
                        s.optimizer.type == OptimizerType::adamw8bit))
    throw ScenarioError(s.source + ": optimizer.type: bitsandbytes 8-bit optimizers run CUDA "
                        "kernels and cannot step FSDP's CPU-offloaded shards "
                        "(parallel.cpu_offload); use adam/adamw/sgd/adafactor or "
                        "parallel.cpu_offload: false");
  if (p.zero == 1 && p.sharding == Sharding::none) {  // sim/parallel/zero_redundancy.h
    if (p.data == 1)
      throw ScenarioError(s.source + ": parallel.zero: ZeRO stage 1 on one GPU partitions "
                          "nothing (ZeroRedundancyOptimizer over a world of 1); set "
                          "parallel.data > 1 or parallel.zero: 0");
    return;
  }
  if (p.zero != 0 && p.sharding != Sharding::fsdp)
    throw ScenarioError(s.source + ": parallel.zero: ZeRO stage " + std::to_string(p.zero) +
                        " for '" + to_string(s.model.family) +
                        "' needs a sharding implementation: set parallel.sharding: fsdp "
                        "(zero 3 = FULL_SHARD, zero 2 = SHARD_GRAD_OP); zero 1 is torch's "
                        "ZeroRedundancyOptimizer with DDP (parallel.sharding: none)");
}

void require_megatron_data_parallel_modelled(const Scenario& s) {
  if (s.parallel.zero >= 2)
    throw std::runtime_error(
        "model family 'megatron': parallel.zero " + std::to_string(s.parallel.zero) +
        " is not modelled: Megatron-LM's distributed optimizer is ZeRO stage 1 (sharded fp32 "
        "main params and Adam state; parallel.zero: 1); sharded gradients / parameters "
        "(ZeRO-2/3, Megatron-FSDP) are not modelled yet");
}

RankInfo data_parallel_rank(const Scenario& s) {
  RankInfo r;
  const ParallelConfig& p = s.parallel;
  r.data = static_cast<int>(p.data);
  r.tensor = static_cast<int>(p.tensor);
  r.pipeline = static_cast<int>(p.pipeline);
  // Context parallelism multiplies the ranks (each context group of N shares one batch).
  r.world_size = static_cast<int>(p.data * p.tensor * p.pipeline * p.context);
  r.index = 0;
  if (p.context > 1 && p.sharding == Sharding::fsdp2)  // scenario/context_parallel_keys.h
    r.why = "FSDP2 shards each parameter on dim 0 over " +
            std::to_string(p.data / p.replicate * p.context) + " ranks (data " +
            std::to_string(p.data / p.replicate) + " x context " + std::to_string(p.context) + ")" +
            (p.replicate > 1 ? " (HSDP, " + std::to_string(p.replicate) + " replicas)" : "") +
            "; rank 0 holds the padded chunk 0 of each and, in its context group, sequence "
            "chunks 0 and " + std::to_string(2 * p.context - 1) + " of " +
            std::to_string(2 * p.context) + "; it is reported";
  else if (p.data > 1 && p.zero == 0)
    r.why = "data-parallel replicas hold the same memory; rank 0 stands for all " +
            std::to_string(p.data);
  else if (p.data > 1 && p.sharding == Sharding::fsdp2)
    r.why = "FSDP2 shards each parameter on dim 0 over " + std::to_string(p.data / p.replicate) +
            " ranks" + (p.replicate > 1 ? " (HSDP, " + std::to_string(p.replicate) + " replicas)" : "") +
            "; rank 0 holds the padded chunk 0 of each and is reported" +
            (p.cpu_offload ? "; shards, their gradients and the optimizer state live on the "
                             "CPU (CPUOffloadPolicy)" : "");
  else if (p.data > 1 && p.sharding == Sharding::deepspeed)
    r.why = "DeepSpeed ZeRO stage " + std::to_string(p.zero) +
            ": rank 0 is reported (its partitions are the largest: only the last rank's are "
            "padded)";
  else if (p.data > 1)
    r.why = std::string(p.sharding == Sharding::fsdp ? "FSDP" : "ZeRO") + " stage " +
            std::to_string(p.zero) + " shards are equal-sized (padded to a multiple of " +
            std::to_string(p.data) + "); rank 0's shard is reported" +
            (p.cpu_offload ? "; shards, their gradients and the optimizer state live on the "
                             "CPU (CPUOffload)" : "");
  return r;
}

std::vector<uint64_t> megatron_owned_numel(const Runtime& rt, uint64_t elem, const Scenario& s) {
  std::vector<uint64_t> numel;
  numel.reserve(rt.parameters().size());
  for (const graph::Parameter& p : rt.parameters()) numel.push_back(p.bytes / elem);
  return megatron_shard_numel(numel, s.parallel.data, 0);
}

std::vector<std::vector<int32_t>> ddp_bucket_assignment(const std::vector<uint64_t>& bytes,
                                                        const std::vector<int32_t>& order,
                                                        const std::vector<uint64_t>& limits) {
  if (limits.empty()) throw std::invalid_argument("ddp_bucket_assignment: no size limits");
  std::vector<std::vector<int32_t>> buckets;
  std::vector<int32_t> cur;
  uint64_t size = 0;
  size_t limit = 0;
  for (int32_t i : order) {
    cur.push_back(i);
    size += bytes[static_cast<size_t>(i)];
    if (size >= limits[limit]) {  // the bucket is full once it reaches its limit
      buckets.push_back(std::move(cur));
      cur.clear();
      size = 0;
      if (limit + 1 < limits.size()) ++limit;
    }
  }
  if (!cur.empty()) buckets.push_back(std::move(cur));
  return buckets;
}

TorchDdp::TorchDdp(Runtime& rt, bool gradient_as_bucket_view)
    : rt_(&rt), view_(gradient_as_bucket_view) {
  bucket_of_param_.assign(rt.parameters().size(), graph::kNoStorage);
  // _build_params_for_reducer: only parameters that require grad (a LoRA model's
  // adapters; its frozen base weights get no bucket and no .grad).
  // find_unused_parameters=False: bucket_size_limits = [sys.maxsize], one bucket.
  std::vector<int32_t> trainable;
  uint64_t elem = 0;
  for (size_t i = 0; i < rt.parameters().size(); ++i) {
    const graph::Parameter& p = rt.parameters()[i];
    if (p.frozen) continue;
    // compute_bucket_assignment_by_size keys buckets by dtype; every modelled trainable
    // set has one (the adapters' lora.adapter_dtype, or the model's precision.params).
    if (!trainable.empty() && p.elem != elem)
      throw std::logic_error("TorchDdp: trainable parameters of mixed dtypes are not modelled");
    elem = p.elem;
    trainable.push_back(static_cast<int32_t>(i));
  }
  if (trainable.empty())  // DistributedDataParallel.__init__ raises the same
    throw std::logic_error("TorchDdp: no parameter requires a gradient");
  allocate(rt, {trainable});
  rt.hooks = this;
}

TorchDdp::~TorchDdp() {
  if (rt_->hooks == this) rt_->hooks = nullptr;
}

void TorchDdp::allocate(Runtime& rt, const std::vector<std::vector<int32_t>>& buckets) {
  const graph::OpContext saved = rt.ctx;
  rt.ctx.layer = -1;
  rt.ctx.module = graph::Module::none;
  buffers_.clear();  // initialize_buckets: buckets_.clear() frees the old buffers first
  sizes_.clear();
  for (const std::vector<int32_t>& b : buckets) {
    uint64_t bytes = 0;
    for (int32_t i : b) bytes += rt.parameters()[static_cast<size_t>(i)].bytes;
    Tensor t = rt.alloc(bytes, TensorKind::gradient, OpKind::other);
    rt.program().tensors[t.storage].name = rt.program().intern("ddp.reducer.bucket");
    for (int32_t i : b) {
      const size_t k = static_cast<size_t>(i);
      graph::Parameter& p = rt.parameters()[k];
      // gradient_as_bucket_view: a .grad that views the old bucket is copied into its
      // view of the new one (initialize_bucket_views); the old bucket dies with it.
      if (view_ && p.grad != graph::kNoStorage && p.grad == bucket_of_param_[k]) {
        rt.retain(t.storage);
        rt.release(p.grad);
        p.grad = t.storage;
      }
      bucket_of_param_[k] = t.storage;
    }
    buffers_.push_back(std::move(t));
    sizes_.push_back(bytes);
  }
  rt.ctx = saved;
}

void TorchDdp::pre_forward(Runtime& rt, bool grad_enabled) {
  if (rebuilt_ || !grad_enabled || ready_log_.empty()) return;
  // rebuilt_params_: the order parameters became ready (a parameter's last AccumulateGrad
  // run: a tied weight is ready once all its uses have delivered their grads).
  const size_t n = rt.parameters().size();
  std::vector<size_t> last(n, SIZE_MAX);
  for (size_t k = 0; k < ready_log_.size(); ++k) last[static_cast<size_t>(ready_log_[k])] = k;
  std::vector<int32_t> order;
  for (size_t k = 0; k < ready_log_.size(); ++k)
    if (last[static_cast<size_t>(ready_log_[k])] == k) order.push_back(ready_log_[k]);
  std::vector<uint64_t> bytes;
  for (const graph::Parameter& p : rt.parameters()) bytes.push_back(p.bytes);
  allocate(rt, ddp_bucket_assignment(bytes, order, {kDdpFirstBucketBytes, kDdpBucketCapBytes}));
  rebuilt_ = true;
  if (!view_ && rt.hooks == this) rt.hooks = nullptr;  // nothing more to learn
  ready_log_.clear();
  ready_log_.shrink_to_fit();
}

std::vector<uint64_t> TorchDdp::bucket_bytes() const { return sizes_; }

void TorchDdp::grad_ready(Runtime& rt, int32_t param) {
  if (!rebuilt_) ready_log_.push_back(param);
  if (!view_) return;
  // gradient_as_bucket_view: the reducer's autograd hook copies a fresh .grad into the
  // parameter's bucket view and makes the view the .grad; the fresh tensor dies.
  const size_t k = static_cast<size_t>(param);
  graph::Parameter& p = rt.parameters()[k];
  const uint32_t bucket = bucket_of_param_[k];
  if (p.grad == bucket || p.grad == graph::kNoStorage) return;
  rt.retain(bucket);
  const uint32_t fresh = p.grad;
  p.grad = bucket;
  rt.release(fresh);
}

}  // namespace memsim
