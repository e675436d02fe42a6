#include "sim/step/grad_scaler.h"

#include <string>

#include "graph/ops/ops.h"
#include "sim/parallel/accelerate_amp.h"

namespace memsim {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

namespace {
constexpr uint64_t kF32 = 4, kF64 = 8, kI32 = 4;  // the 0-d tensors' bytes
}  // namespace

Tensor GradScalerSim::scale(Runtime& rt, const Tensor& loss) {
  // A 2-byte loss (an fp16 output_dtype cast, a forward-only autocast region) times the fp32
  // _scale is an fp32 0-d tensor whose grad the engine casts back to the loss's dtype: not
  // modelled. The scenario checks refuse the known cases by key; this catches the rest.
  if (loss.bytes != kF32)
    throw ScenarioError(source_ + ": precision.grad_scaler: the loss is not fp32 (" +
                        std::to_string(loss.bytes) + "-byte), so scale()'s product and its "
                        "grad's cast back are not modelled; compute the loss in fp32");
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
  Tensor inv_copy = unscale_grads(rt);
  // _unscale_grads_ returns: its replicator of inv_scale (holding the copy) dies; then
  // unscale_'s locals in order: inv_scale, found_inf.
  inv_copy.reset();
  inv_scale.reset();
  found_inf.reset();
}

Tensor GradScalerSim::unscale_grads(Runtime& rt) {
  // per_device_found_inf.get(device), then per_device_inv_scale.get(device) (.to(copy=True)
  // each, the argument order); _amp_foreach_non_finite_check_and_unscale_ runs in place.
  found_inf_ = rt.alloc(kF32, TensorKind::temporary, OpKind::to_copy);
  Tensor inv_copy = rt.alloc(kF32, TensorKind::temporary, OpKind::to_copy);
  if (dtensor_grads_) {
    // DTensor grads: found_inf_reduce_handler after the local kernel: the Partial("max")
    // found_inf's full_tensor() all-reduces a clone (funcol.all_reduce), copy_ writes it
    // into the found_inf copy, and the clone dies at the handler's return. One dtype group:
    // FSDP2's sharded grads are fp32 (precision.params fp32, fp32 adapters).
    Tensor reduced = rt.alloc(kF32, TensorKind::temporary, OpKind::clone);
  }
  return inv_copy;
}

void GradScalerSim::check_inf_per_device(Runtime& rt) {
  // dummy_inv_scale = full((), 1.0), found_inf = full((), 0.0); _unscale_grads_(...,
  // allow_fp16=True) takes the same per-device copies as unscale_ (found_inf's, then the
  // inv scale's) and the kernel multiplies by 1.0 in place.
  Tensor dummy_inv_scale = rt.alloc(kF32, TensorKind::temporary, OpKind::full);
  Tensor found_inf = rt.alloc(kF32, TensorKind::temporary, OpKind::full);
  Tensor inv_copy = unscale_grads(rt);
  inv_copy.reset();         // _unscale_grads_ returns
  dummy_inv_scale.reset();  // _check_inf_per_device returns: its locals in order
  found_inf.reset();
}

void GradScalerSim::before_step(Runtime& rt) {
  if (!fused_) return unscale(rt);
  check_inf_per_device(rt);
  // found_inf = sum(t.to(device) for t in found_inf_per_device.values()): 0 + copy, new;
  // optimizer.grad_scale = scaler * getattr(optimizer, "grad_scale", 1): new.
  fused_found_inf_ = rt.alloc(kF32, TensorKind::temporary, OpKind::add);
  fused_grad_scale_ = rt.alloc(kF32, TensorKind::temporary, OpKind::mul);
}

void GradScalerSim::after_step(Runtime&) {
  // del optimizer.grad_scale; del optimizer.found_inf (step()'s local keeps it until return).
  fused_grad_scale_.reset();
  fused_found_inf_.reset();
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
    refuse("DeepSpeed scales fp16 losses with its own loss scaler (ds.json fp16, modelled "
           "without this key), not torch.amp.GradScaler; use precision.grad_scaler: false");
  // FSDP1 (torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler, or GradScaler on
  // the flat parameters): the same tensors for GPU shards and an fp32 loss (its
  // `.type(outputs.dtype)` is then a no-op, found_inf's all_reduce is in place).
  if (p.sharding == Sharding::fsdp && p.cpu_offload)
    throw ScenarioError(s.source + ": parallel.cpu_offload: ShardedGradScaler with CPU shard "
                        "gradients (found_inf copies to the CPU and back for the all_reduce) is not "
                        "modelled with precision.grad_scaler; use parallel.cpu_offload: false");
  // Accelerate's FSDP1 fp16 path (sim/parallel/accelerate_fsdp1_checks.h) computes the
  // loss in fp32 (transformers' logits.float(), FSDP1 casts no output): ShardedGradScaler's
  // `.type(outputs.dtype)` is a no-op there, as without MixedPrecision.
  if (p.sharding == Sharding::fsdp && p.fsdp_mixed_precision && !accelerate_fsdp1_amp(s))
    throw ScenarioError(s.source + ": parallel.fsdp_mixed_precision: ShardedGradScaler's scaled "
                        "loss is cast back to the low-precision loss dtype (a copy, and its grad cast) "
                        "which is not modelled with precision.grad_scaler; use precision.autocast "
                        "under FSDP instead, or fsdp_mixed_precision: none");
  // FSDP2: the plain GradScaler over DTensor grads (the header; docs/autocast.md "Over FSDP2").
  if (p.sharding == Sharding::fsdp2) {
    if (p.cpu_offload)
      throw ScenarioError(s.source + ": parallel.cpu_offload: GradScaler over FSDP2's "
                          "CPUOffloadPolicy (CPU DTensor grads: a second device group, found_inf "
                          "copies on the CPU) is not modelled with precision.grad_scaler; use "
                          "parallel.cpu_offload: false");
    if (p.fsdp_output_dtype.has_value() && dtype_bytes(*p.fsdp_output_dtype) == 2)
      throw ScenarioError(s.source + ": parallel.fsdp_output_dtype: with precision.grad_scaler "
                          "the root's output cast makes the loss 2-byte (Accelerate's fp16 "
                          "policy): scale()'s fp32 product and its grad's cast back to the "
                          "loss dtype are not modelled; leave fsdp_output_dtype out (an fp32 loss)");
    if (p.fsdp_mixed_precision.has_value() && s.precision.autocast.has_value())
      throw ScenarioError(s.source + ": precision.autocast: Accelerate's FSDP2 autocast path "
                          "(autocast over MixedPrecisionPolicy's parameters) is not modelled with "
                          "precision.grad_scaler; use the policy alone or autocast over fp32 "
                          "parameters");
    if (s.precision.float8_all_gather)
      refuse("torchao's float8 all-gather with the scaler over FSDP2 is not modelled; use "
             "precision.float8_all_gather: false");
  }
  if (p.zero != 0 && p.sharding == Sharding::none)  // FSDP sets zero 3 itself
    refuse("GradScaler with ZeroRedundancyOptimizer (parallel.zero) is not modelled; "
           "use parallel.zero: 0");
  if (p.pipeline != 1 || p.tensor != 1 || p.context != 1)
    refuse("GradScaler is modelled on one GPU, with torch DDP, FSDP1 and FSDP2 only "
           "(parallel.tensor, parallel.pipeline and parallel.context 1)");
  if (s.step.kind != StepKind::train)
    refuse("GradScaler scales the loss of a training step; step.kind is not train");
  if (s.recipe.optimizer_in_backward)
    refuse("optimizer.in_backward steps from backward hooks, which scaler.step does not "
           "unscale for; use optimizer.in_backward: false");
  if (s.optimizer.type == OptimizerType::none)
    refuse("scaler.step needs an optimizer; optimizer.type is none");
  if (s.optimizer.impl == OptimizerImpl::fused && s.optimizer.type != OptimizerType::adam &&
      s.optimizer.type != OptimizerType::adamw && s.optimizer.type != OptimizerType::sgd)
    refuse("a fused optimizer other than torch.optim Adam / AdamW / SGD is not modelled with "
           "the scaler; use optimizer.impl foreach or for-loop");
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
