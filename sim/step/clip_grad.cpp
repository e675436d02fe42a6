#include "sim/step/clip_grad.h"

#include <algorithm>
#include <string>
#include <vector>

#include "sim/optim/optimizer_step.h"
#include "sim/parallel/deepspeed_norm.h"
#include "sim/step/clip_grad_dtensor.h"
#include "sim/step/fsdp1_clip_grad.h"

namespace memsim {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

namespace {
constexpr uint64_t kChunkSize = 65536;    // ForeachReduceOp.cu / MultiTensorApply.cuh
constexpr uint64_t kGlobalOutput = 320;   // _foreach_tensor_norm_cuda_impl's zeros({320})
constexpr uint64_t kOpmath = 4;           // toOpMathType of fp32 / bf16 / fp16: float
constexpr uint64_t kSingleBlockLimit = 7681;  // stack norms below this: no global reduce

struct Group {
  uint64_t elem = 0;       // the grads' bytes per element (their dtype)
  uint64_t count = 0;      // N
  uint64_t max_numel = 0;  // the largest grad's elements
};

// _group_tensors_by_device_and_dtype: groups in the order each dtype first appears.
std::vector<Group> grad_groups(const Runtime& rt, uint64_t model_elem) {
  std::vector<Group> groups;
  for (const graph::Parameter& p : rt.parameters()) {
    if (p.grad == graph::kNoStorage) continue;
    const uint64_t e = elem_of(p, model_elem);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.elem == e; });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{e, 0, 0});
    ++it->count;
    it->max_numel = std::max(it->max_numel, p.bytes / e);
  }
  return groups;
}
}  // namespace

void ClipGradNormSim::clip(Runtime& rt) {
  const std::vector<Group> groups = grad_groups(rt, model_elem_);
  if (groups.empty()) {  // torch.tensor(0.0) on the CPU; nothing is clipped on the GPU
    if (keep_norm_) kept_norm_.reset();
    return;
  }
  auto temp = [&](uint64_t bytes, OpKind op) { return rt.alloc(bytes, TensorKind::temporary, op); };
  // _get_total_norm
  std::vector<Tensor> norms;
  uint64_t total = 0, stack_elem = 0;
  for (const Group& g : groups) total += g.count;
  norms.reserve(total);
  for (const Group& g : groups) {
    if (rt.kernel_scratch) {  // _foreach_tensor_norm_cuda_impl
      const uint64_t chunks = (g.max_numel + kChunkSize - 1) / kChunkSize;
      Tensor per_tensor = temp(g.count * chunks * kOpmath, OpKind::zeros);
      Tensor global_output = temp(kGlobalOutput * kOpmath, OpKind::zeros);
      for (uint64_t i = 0; i < g.count; ++i) norms.push_back(temp(g.elem, OpKind::reduce_sum));
      Tensor global_norm = temp(g.elem, OpKind::reduce_sum);
      global_output.reset();  // the impl's locals, last declared first
      per_tensor.reset();
      global_norm.reset();    // the returned pair's .second, after .first is taken
    } else {  // CPU: foreach_tensor_norm_slow, one linalg_vector_norm per tensor
      for (uint64_t i = 0; i < g.count; ++i) norms.push_back(temp(g.elem, OpKind::reduce_sum));
    }
    stack_elem = std::max(stack_elem, g.elem);
  }
  // torch.stack promotes: the widest dtype (fp16 with bf16 would be fp32; refused upstream
  // since every 2-byte grad here is the model's one dtype or the adapters' one).
  Tensor total_norm;
  {
    Tensor stacked = temp(total * stack_elem, OpKind::cat_n);
    // FSDP2: the stack is a _NormPartial DTensor, made Replicate before the local norm.
    total_norm = dtensor_grads_ ? dtensor_stack_norm(rt, total * stack_elem, stack_elem)
                                : temp(stack_elem, OpKind::reduce_sum);
  }  // the stack dies with the statement
  if (error_if_nonfinite_) {
    Tensor isnan = temp(1, OpKind::compare);
    Tensor isinf = temp(1, OpKind::compare);
    Tensor either = temp(1, OpKind::bitwise);
    isnan.reset();  // the call's arguments, first to last
    isinf.reset();
  }  // `either` dies once `if` has read it
  // _get_total_norm returns: `norms` dies (its items first to last: list_dealloc decrefs
  // from the end; same-size 512-B blocks, the order changes no block).
  for (auto it = norms.rbegin(); it != norms.rend(); ++it) it->reset();
  norms.clear();
  // _clip_grads_with_norm_
  {
    Tensor clip_coef;
    {
      // max_norm / (total_norm + 1e-6): the float's division is Tensor.__rtruediv__, which
      // is `self.reciprocal() * other` (torch/_tensor.py __rdiv__): the reciprocal dies when
      // __rdiv__ returns, the shifted norm when the expression ends.
      Tensor shifted = temp(stack_elem, OpKind::add_scalar);  // total_norm + 1e-6
      Tensor reciprocal = temp(stack_elem, OpKind::reciprocal);
      clip_coef = temp(stack_elem, OpKind::mul);
    }
    Tensor clamped = temp(stack_elem, OpKind::other);  // torch.clamp(clip_coef, max=1.0)
    // _foreach_mul_(grads, clamped.to(device)): in place, per group.
    clip_coef.reset();  // the function's locals at return
    clamped.reset();
  }
  // clip_grad_norm_ returns total_norm: bound (kept until the next step's clip returns,
  // the old one dying at the rebind) or dropped by the statement.
  if (keep_norm_) kept_norm_ = std::move(total_norm);
}

void require_clip_grad_modelled(const Scenario& s) {
  const OptimizerConfig& o = s.optimizer;
  if (!o.max_grad_norm) return;
  auto refuse = [&](const std::string& why) {
    throw ScenarioError(s.source + ": optimizer.max_grad_norm: " + why);
  };
  const ParallelConfig& p = s.parallel;
  // DeepSpeed clips inside its ZeRO optimizer's step (ds.json gradient_clipping, which
  // optimizer.max_grad_norm sets): its own checks (sim/parallel/deepspeed_norm.h).
  if (p.sharding == Sharding::deepspeed) return require_deepspeed_clip_modelled(s);
  if (!o.clip_foreach)
    throw ScenarioError(s.source + ": optimizer.clip_foreach: the per-gradient "
                        "torch.linalg.vector_norm path (its CUDA reduction's global-memory "
                        "staging, Reduce.cuh) is not modelled; use optimizer.clip_foreach: true "
                        "(torch's default on CUDA)");
  if (s.model.family == ModelFamily::megatron)
    refuse("Megatron-LM clips with its own clip_grad_norm_fp32 (--clip-grad), not "
           "torch.nn.utils.clip_grad_norm_; not modelled");
  // FSDP1: FullyShardedDataParallel.clip_grad_norm_ (sim/step/fsdp1_clip_grad.h).
  if (p.sharding == Sharding::fsdp) require_fsdp1_clip_modelled(s);
  if (p.sharding == Sharding::fsdp2) require_fsdp2_clip_modelled(s);  // sim/step/clip_grad_dtensor.h
  if (p.zero != 0 && p.sharding == Sharding::none)  // FSDP sets zero 3 itself
    refuse("clipping with ZeroRedundancyOptimizer (parallel.zero) is not modelled; use "
           "parallel.zero: 0");
  if (p.pipeline != 1 || p.tensor != 1 || p.context != 1)
    refuse("clipping is modelled on one GPU, with torch DDP, FSDP1, FSDP2 and DeepSpeed, "
           "without tensor, pipeline or context parallelism (parallel.tensor, "
           "parallel.pipeline and parallel.context 1)");
  if (s.step.kind != StepKind::train)
    refuse("clip_grad_norm_ runs between backward and optimizer.step; step.kind is not train");
  if (s.recipe.optimizer_in_backward)
    refuse("optimizer.in_backward steps from backward hooks, before any clipping (torchtune "
           "refuses clip_grad_norm with optimizer_in_bwd); use optimizer.in_backward: false");
  if (o.type == OptimizerType::none)
    refuse("clipping needs an optimizer step to precede; optimizer.type is none");
  if (s.precision.master_weights)
    refuse("clipping with precision.master_weights (which grads, the model's or the masters') "
           "is not modelled; use precision.master_weights: false");
  if (s.precision.grad_scaler && o.impl == OptimizerImpl::fused)
    refuse("with precision.grad_scaler a fused optimizer after an explicit scaler.unscale_ "
           "takes the grad_scale=None path, which is not modelled; use optimizer.impl foreach "
           "or for-loop");
  if (s.lora.rank > 0 && s.lora.adapter_dtype != s.precision.params &&
      dtype_bytes(s.lora.adapter_dtype) == 2 && dtype_bytes(s.precision.params) == 2)
    refuse("fp16 and bf16 gradients together (torch.stack promotes them to fp32) are not "
           "modelled; use one 2-byte dtype");
}

}  // namespace memsim
