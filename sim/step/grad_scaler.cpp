#include "sim/step/grad_scaler.h"

#include <string>

#include "graph/ops/ops.h"

namespace memsim {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

namespace {
constexpr uint64_t kF32 = 4, kF64 = 8, kI32 = 4;  // the 0-d tensors' bytes
}  // namespace

Tensor GradScalerSim::scale(Runtime& rt, const Tensor& loss) {
  if (!scale_.defined()) {  // _lazy_init_scale_growth_tracker: _scale, then _growth_tracker
    scale_ = rt.alloc(kF32, TensorKind::other, OpKind::full);
    growth_tracker_ = rt.alloc(kI32, TensorKind::other, OpKind::full);
  }
  // outputs * _scale: a new 0-d tensor; MulBackward0 saves _scale (loss needs a grad).
  return graph::mul(rt, loss, scale_);
}

void GradScalerSim::unscale(Runtime& rt) {
  // unscale_: inv_scale = _scale.double().reciprocal().float(); each temporary of the
  // chain dies once the next op's result exists (CPython drops it after the call).
  Tensor inv_scale;
  {
    Tensor as_double = rt.alloc(kF64, TensorKind::temporary, OpKind::to_copy);
    Tensor reciprocal = rt.alloc(kF64, TensorKind::temporary, OpKind::reciprocal);
    as_double.reset();
    inv_scale = rt.alloc(kF32, TensorKind::temporary, OpKind::to_copy);
  }  // reciprocal dies here
  Tensor found_inf = rt.alloc(kF32, TensorKind::temporary, OpKind::full);
  // _unscale_grads_: per_device_found_inf.get(device), then per_device_inv_scale.get(device)
  // (.to(copy=True) each); _amp_foreach_non_finite_check_and_unscale_ runs in place.
  found_inf_ = rt.alloc(kF32, TensorKind::temporary, OpKind::to_copy);
  Tensor inv_copy = rt.alloc(kF32, TensorKind::temporary, OpKind::to_copy);
  // _unscale_grads_ returns: its replicator of inv_scale (holding the copy) dies; then
  // unscale_'s locals in order: inv_scale, found_inf.
  inv_copy.reset();
  inv_scale.reset();
  found_inf.reset();
}

void GradScalerSim::update(Runtime&) {
  // _amp_update_scale_ in place; _per_optimizer_states is reset, the found_inf copy dies
  // (at the latest when update()'s locals go).
  found_inf_.reset();
}

void require_grad_scaler_modelled(const Scenario& s) {
  if (!s.precision.grad_scaler) return;
  auto refuse = [&](const std::string& why) {
    throw ScenarioError(s.source + ": precision.grad_scaler: " + why);
  };
  const ParallelConfig& p = s.parallel;
  if (s.model.family == ModelFamily::megatron)
    refuse("Megatron-LM scales the loss with its own grad scaler, not torch.amp.GradScaler; "
           "use precision.grad_scaler: false");
  if (p.sharding == Sharding::deepspeed)
    refuse("DeepSpeed scales fp16 losses with its own loss scaler (its fp16 config), not "
           "torch.amp.GradScaler; use precision.grad_scaler: false");
  if (p.sharding == Sharding::fsdp || p.sharding == Sharding::fsdp2)
    refuse("FSDP's ShardedGradScaler (and GradScaler over FSDP2's DTensor grads) is not "
           "modelled; modelled on one GPU and with torch DDP (parallel.sharding: none)");
  if (p.zero != 0)
    refuse("GradScaler with ZeroRedundancyOptimizer (parallel.zero) is not modelled; "
           "use parallel.zero: 0");
  if (p.pipeline != 1 || p.tensor != 1 || p.context != 1)
    refuse("GradScaler is modelled on one GPU and with torch DDP only (parallel.tensor, "
           "parallel.pipeline and parallel.context 1)");
  if (s.step.kind != StepKind::train)
    refuse("GradScaler scales the loss of a training step; step.kind is not train");
  if (s.recipe.optimizer_in_backward)
    refuse("optimizer.in_backward steps from backward hooks, which scaler.step does not "
           "unscale for; use optimizer.in_backward: false");
  if (s.optimizer.type == OptimizerType::none)
    refuse("scaler.step needs an optimizer; optimizer.type is none");
  if (s.optimizer.impl == OptimizerImpl::fused)
    refuse("a fused optimizer has _step_supports_amp_scaling: scaler.step hands it grad_scale "
           "and found_inf tensors instead of unscaling (not modelled); use optimizer.impl "
           "foreach or for-loop");
  if (s.precision.params != DType::fp32 || s.precision.master_weights)
    refuse("modelled with fp32 parameters (fp32 grads) only: fp16 grads make unscale_ raise "
           "\"Attempting to unscale FP16 gradients.\" and master copies are not modelled with "
           "it; use precision.params: fp32");
  if (s.lora.rank > 0 && s.lora.adapter_dtype == DType::fp16)
    refuse("fp16 LoRA adapters have fp16 grads, which unscale_ refuses (\"Attempting to "
           "unscale FP16 gradients.\"); use lora.adapter_dtype: fp32");
  if (s.precision.autocast && s.precision.autocast_region == AutocastRegion::forward)
    refuse("with autocast_region forward the loss is low precision and its scaled grad is "
           "cast back (not checked); use autocast_region forward-and-loss");
}

}  // namespace memsim
