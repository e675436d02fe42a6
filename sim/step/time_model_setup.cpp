#include "sim/step/time_model_setup.h"

#include <string>

#include "sim/optim/optimizer_step.h"
#include "sim/parallel/accelerate_amp.h"

namespace memsim {

namespace {

MathDtype math_of(DType d) {
  switch (d) {
    case DType::fp32: return MathDtype::fp32;
    case DType::bf16: return MathDtype::bf16;
    case DType::fp16: return MathDtype::fp16;
  }
  return MathDtype::fp32;
}

// HBM bytes per parameter element of one optimizer step, as (bytes per element of the
// parameter's dtype) x e + (bytes per element of the state's dtype) x s.
struct PerElement {
  double e = 0, s = 0;
};

// The kernels each implementation launches (reads + writes, per element):
//  torch.optim.Adam(W), foreach (_multi_tensor_adam) and for-loop (_single_tensor_adam),
//  torch/optim/adam.py v2.4: [AdamW: p.mul_(1 - lr*wd): 2e] exp_avg.lerp_(grad): e + 2s;
//  exp_avg_sq.mul_(b2): 2s; exp_avg_sq.addcmul_(grad, grad): e + 2s; sqrt(exp_avg_sq): 2s;
//  div_(bias_correction2_sqrt): 2s; add_(eps): 2s; p.addcdiv_(exp_avg, denom): 2e + 2s.
//  fused=True (_fused_adam, one kernel): reads p, grad, exp_avg, exp_avg_sq, writes p,
//  exp_avg, exp_avg_sq: 3e + 4s.
//  SGD without momentum: p.add_(grad): 3e; with momentum (foreach): buf.mul_(m): 2s,
//  buf.add_(grad): e + 2s, p.add_(buf): 2e + s.
//  CS336's AdamW (cs336-model.md §7), fp32 out-of-place ops: decay 5, two zeros_like 2,
//  m 7, v 9, update 12: 35e.
PerElement per_element(const OptimizerConfig& o) {
  const bool adamw = o.type == OptimizerType::adamw;
  switch (o.type) {
    case OptimizerType::adam:
    case OptimizerType::adamw:
      if (o.impl == OptimizerImpl::cs336) return {35, 0};
      if (o.impl == OptimizerImpl::fused) return {3, 4};
      return {adamw ? 6.0 : 4.0, 14};
    case OptimizerType::sgd:
      return o.momentum == 0.0 ? PerElement{3, 0} : PerElement{3, 5};
    default:
      return {};
  }
}

}  // namespace

void configure_time_model(graph::Runtime& rt, const Scenario& s) {
  rt.gemm_dtype = math_of(s.precision.autocast ? *s.precision.autocast : s.precision.params);
  StepCost& c = rt.program().cost;
  const ParallelConfig& p = s.parallel;
  if (p.tensor > 1)
    c.refuse("parallel.tensor: tensor-parallel collectives (all-reduces, sequence-parallel "
             "gathers) are not costed by the time model");
  if (p.pipeline > 1)
    c.refuse("parallel.pipeline: pipeline sends, receives and bubbles are not costed by the time model");
  if (p.sharding == Sharding::fsdp || p.sharding == Sharding::fsdp2)
    c.refuse("parallel.sharding: FSDP's all-gathers, reduce-scatters and sharded optimizer "
             "step are not costed by the time model");
  if (p.sharding == Sharding::deepspeed)
    c.refuse("parallel.sharding: DeepSpeed's collectives and offload are not costed by the time model");
  if (p.zero == 1 && p.sharding == Sharding::none && p.data > 1)
    c.refuse("parallel.zero: ZeroRedundancyOptimizer's sharded step and broadcasts are not "
             "costed by the time model");
  if (s.step.compile)
    c.refuse("step.compile: compiled regions fuse kernels; the time model costs eager ops only");
  if (s.model.family == ModelFamily::megatron && s.step.kind == StepKind::train && s.optimizer.type != OptimizerType::none)
    c.refuse("model.family: Megatron's optimizer step (fp32 main parameters and grads) is "
             "not costed by the time model");
  const PerElement pe = per_element(s.optimizer);
  if (s.step.kind == StepKind::train && s.optimizer.type != OptimizerType::none && pe.e == 0)
    c.refuse(std::string("optimizer.type: ") + to_string(s.optimizer.type) +
             " has no kernel sequence in the time model (torch Adam, AdamW, SGD and CS336's AdamW do)");
  if (s.optimizer.impl == OptimizerImpl::out_of_place)
    c.refuse("optimizer.impl: out_of_place has no kernel sequence in the time model");
}

void add_optimizer_cost(graph::Runtime& rt, const Scenario& s) {
  const PerElement pe = per_element(s.optimizer);
  const uint64_t model_elem = trained_param_elem(s);  // Accelerate's FSDP1 upcast: fp32
  const bool master = s.precision.master_weights;
  double bytes = 0;
  for (const graph::Parameter& p : rt.parameters()) {
    if (p.grad == graph::kNoStorage) continue;
    const double n = static_cast<double>(numel_of(p, model_elem));
    const double e = static_cast<double>(elem_of(p, model_elem));
    if (master) {
      // m.grad = p.grad.float(): e + 4; the step on fp32 masters; p.data.copy_(m): 4 + e.
      bytes += n * ((e + 4) + pe.e * 4 + pe.s * 4 + (4 + e));
    } else {
      bytes += n * (pe.e * e + pe.s * e);  // torch.optim state is zeros_like(param)
    }
  }
  rt.program().cost.traffic[static_cast<int>(CostPart::optimizer)] += bytes;
}

void add_ddp_all_reduce(graph::Runtime& rt, const std::vector<uint64_t>& bucket_bytes, int64_t ranks) {
  for (uint64_t b : bucket_bytes)
    rt.program().cost.add_collective(Collective::all_reduce, static_cast<int32_t>(ranks),
                                     static_cast<double>(b));
}

}  // namespace memsim
