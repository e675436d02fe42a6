#include "sim/step/fsdp1_clip_grad.h"

#include <string>

#include "graph/ops/cuda_reduce.h"

namespace memsim {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

namespace {
constexpr uint64_t kF32 = 4;  // every norm is fp32 (dtype=torch.float32)
constexpr uint64_t kMaxInt32Numel = (uint64_t{1} << 31) - 1;
}  // namespace

void Fsdp1ClipGradNormSim::clip(Runtime& rt, const std::vector<int32_t>& order) {
  auto temp = [&](uint64_t bytes, OpKind op) { return rt.alloc(bytes, TensorKind::temporary, op); };
  // if self._zero_scalar is None: torch.tensor(0.0, device=self.compute_device)
  if (!zero_scalar_.defined()) zero_scalar_ = rt.alloc(kF32, TensorKind::other, OpKind::to_copy);
  std::vector<uint64_t> numels;
  numels.reserve(order.size());
  for (const int32_t id : order) {
    const graph::Parameter& p = rt.parameters()[static_cast<size_t>(id)];
    if (p.grad == graph::kNoStorage) continue;
    numels.push_back(p.bytes / kF32);  // fp32 grads (require_fsdp1_clip_modelled)
    if (numels.back() > kMaxInt32Numel)
      throw ScenarioError(source_ + ": optimizer.max_grad_norm: a sharded gradient of " +
                          std::to_string(numels.back()) +
                          " elements (2^31 or more: the CUDA reduction splits into 32-bit "
                          "sub-iterators with an accumulation buffer) is not modelled");
  }
  // vector_norm's CUDA launcher: buffer, then semaphores; freed in reverse at its return.
  auto staging = [&](uint64_t numel) {
    if (!rt.kernel_scratch) return;
    const graph::ReduceScratch s = graph::full_reduce_scratch(numel);
    if (s.global_bytes == 0) return;
    Tensor buffer = temp(s.global_bytes, OpKind::reduce_sum);
    Tensor semaphores = temp(s.semaphore_bytes, OpKind::reduce_sum);
    semaphores.reset();
    buffer.reset();
  };
  // _get_grad_norm(sharded_params, norm_type, zero, device); with no gradient it returns
  // `zero` (the kept scalar: nothing allocated, nothing freed at return).
  Tensor local_norm;
  if (!numels.empty()) {
    std::vector<Tensor> norms;
    norms.reserve(numels.size());
    for (const uint64_t n : numels) {
      norms.push_back(temp(kF32, OpKind::reduce_sum));  // the result, then the kernel
      staging(n);
    }
    Tensor stacked = temp(kF32 * numels.size(), OpKind::cat_n);
    // torch.stack returned: its argument list dies, its items from the last.
    for (auto it = norms.rbegin(); it != norms.rend(); ++it) it->reset();
    local_norm = temp(kF32, OpKind::reduce_sum);
    staging(numels.size());
    stacked.reset();  // the statement ends
  }
  // total_norm = local_sharded_norm ** norm_type; all_reduce in place;
  // total_norm = total_norm ** (1.0 / norm_type): the squared one dies at the rebind.
  Tensor total_norm = temp(kF32, OpKind::pow2);
  {
    Tensor root = temp(kF32, OpKind::pow2);
    total_norm = std::move(root);
  }
  // clip_coef = max_norm / (total_norm + 1e-6): the add, __rtruediv__'s reciprocal and
  // product; the reciprocal dies when __rdiv__ returns, the shifted norm after the statement.
  Tensor clip_coef;
  {
    Tensor shifted = temp(kF32, OpKind::add_scalar);
    Tensor reciprocal = temp(kF32, OpKind::reciprocal);
    clip_coef = temp(kF32, OpKind::mul);
    reciprocal.reset();
    shifted.reset();
  }
  Tensor clamped = temp(kF32, OpKind::other);  // torch.clamp(clip_coef, max=1.0)
  // grad.mul_(clamped.to(grad.device, grad.dtype)) per grad: in place, fp32 (no cast).
  // The frame's locals in co_varnames order; total_norm is the return value.
  local_norm.reset();
  clip_coef.reset();
  clamped.reset();
  if (keep_norm_) kept_norm_ = std::move(total_norm);
}

void require_fsdp1_clip_modelled(const Scenario& s) {
  auto refuse = [&](const char* key, const std::string& why) {
    throw ScenarioError(s.source + ": " + key + ": " + why);
  };
  const ParallelConfig& p = s.parallel;
  if (p.cpu_offload)
    refuse("parallel.cpu_offload",
           "FSDP1's clip_grad_norm_ with CPUOffload (CPU gradients, the total norm moved to "
           "the CPU) is not modelled; use parallel.cpu_offload: false");
  if (s.lora.rank > 0)
    refuse("lora.rank",
           "FSDP1's clip_grad_norm_ over flat parameters holding frozen and trainable "
           "parameters is not modelled; modelled for full fine-tuning");
  if (s.optimizer.clip_error_if_nonfinite)
    refuse("optimizer.clip_error_if_nonfinite",
           "FullyShardedDataParallel.clip_grad_norm_(max_norm, norm_type) has no "
           "error_if_nonfinite argument; leave it false");
  if (s.precision.params != DType::fp32 &&
      !(s.precision.params == DType::bf16 && s.precision.autocast &&
        s.parallel.fsdp_mixed_precision))  // Accelerate's upcast: fp32 shards
    refuse("precision.params",
           "FSDP1's clip_grad_norm_ is modelled for fp32 sharded gradients (fp32 parameters, "
           "or Accelerate's upcast of a bf16-loaded model); low-precision gradients make "
           "each norm's dtype=float32 a cast and the coefficient a cast per gradient");
  if (s.precision.master_weights)
    refuse("precision.master_weights",
           "FSDP1's clip_grad_norm_ with master weights is not modelled");
}

}  // namespace memsim
