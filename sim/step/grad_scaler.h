// torch.amp.GradScaler in the training loop (precision.grad_scaler; docs/autocast.md
// "GradScaler"): the 0-d tensors a plain AMP script's
//
//   scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
//
// allocates and frees, each a 512-B small-pool block on CUDA. Read from
// torch/amp/grad_scaler.py (pytorch/pytorch @ 0202916b051677fea50852f1c3b856476f66b423, the
// same in cyyever/pytorch @ 0011014f6f68f6fbcab776ee96d38e79d4086fae; the GPU run of
// tools/gpu/measure_gscaler.py records the text of the 2.11 file it ran):
//
// * scale(loss) (scale()): the first call creates _scale = torch.full((), 2**16, float32)
//   and _growth_tracker = torch.full((), 0, int32) (_lazy_init_scale_growth_tracker), kept
//   for the run; then `outputs * self._scale.to(device)` (the .to is a no-op on the same
//   device): a new 0-d fp32 tensor whose MulBackward0 saves _scale (an alias). The caller
//   drops it after backward (the temporary of the `.backward()` statement). Its backward
//   is the engine's root ones_like (Runtime::backward) and MulBackward0's grad * _scale,
//   the loss's grad.
// * unscale(rt) (step() -> unscale_(), OptState.READY): inv_scale =
//   _scale.double().reciprocal().float() (three temporaries, each freed when the next
//   exists), found_inf = torch.full((), 0.0); _unscale_grads_ takes per-device copies
//   (_MultiDeviceReplicator.get: .to(copy=True)) of found_inf, then of inv_scale (the
//   argument order of torch._amp_foreach_non_finite_check_and_unscale_, which works in
//   place on the grads and allocates nothing); the inv_scale copy dies when
//   _unscale_grads_ returns, inv_scale and found_inf when unscale_ returns; the found_inf
//   copy stays in the optimizer's state. One copy per device, however many dtype groups.
//   _maybe_opt_step's .item() allocates nothing; then the caller's optimizer.step().
// * A fused optimizer (optimizer.impl fused: torch.optim Adam/AdamW/SGD set
//   _step_supports_amp_scaling) is not unscaled: step() runs _check_inf_per_device
//   (dummy_inv_scale = full 1.0, found_inf = full 0.0, _unscale_grads_'s two copies; the
//   inv copy dies at its return, dummy_inv_scale and found_inf at _check_inf_per_device's),
//   then found_inf = sum(copies) (0 + copy: a new tensor) and optimizer.grad_scale =
//   _scale * 1 (a new tensor), which the fused kernel reads; after optimizer.step()
//   `del optimizer.grad_scale` frees it and the summed found_inf dies when step() returns.
// * update(rt): `found_inf.to(device)` is the same tensor, _amp_update_scale_ works in
//   place; the state with the found_inf copy is dropped, so the copy dies.
//
// FSDP1's ShardedGradScaler (torch/distributed/fsdp/sharded_grad_scaler.py) makes the same
// tensors for GPU shard gradients and an fp32 loss: scale's `.type(outputs.dtype)` is a no-op,
// found_inf is (1,)-shaped (4 B as well) and all-reduced in place, update is GradScaler's.
//
// On Accelerate's FSDP1 fp16 path (MixedPrecision fp16 and autocast fp16, HF Trainer
// fp16=True: sim/parallel/accelerate_fsdp1_checks.h) the loss is fp32 as well, so the
// same tensors; Accelerate's clip_grad_norm_ runs unscale_ first (unscale_gradients).
//
// FSDP2 (parallel.sharding fsdp2; docs/autocast.md "Over FSDP2"): the plain GradScaler
// (Accelerate's get_fsdp2_grad_scaler, accelerate @ 16cb6eb8 utils/fsdp_utils.py; torch's
// test_fully_shard_grad_scaler.py) over DTensor grads. A DTensor's .device is its local
// tensor's, so _unscale_grads_ groups them as one device and takes the same copies; the
// kernel's DTensor dispatch is a custom handler (found_inf_reduce_handler,
// torch/distributed/tensor/_dispatch.py @ 00223c21f5b5, the same @ cf06dd72762d; the C++
// fast path of newer torch looks _custom_op_handlers up first): the local kernel on the local
// shards with the plain 0-d found_inf / inv_scale (no allocation), then found_inf wrapped as
// a Partial("max") DTensor and full_tensor()'d: Partial._reduce_value's funcol.all_reduce
// clones it (Functional.cpp) and reduces the clone, copy_ writes it back into the
// found_inf copy, and the clone dies when the handler returns. One such clone per dtype
// group (FSDP2's sharded grads are all fp32: one group), in unscale_ and in the fused
// path's _check_inf_per_device alike.
//
// Not modelled (refused by require_grad_scaler_modelled): ShardedGradScaler with
// CPU-offloaded shards, or MixedPrecision shards outside Accelerate's path, FSDP2 with
// CPUOffloadPolicy or a 2-byte output_dtype (a low-precision loss), DeepSpeed's
// own loss scaler, fp16 gradients (the source raises "Attempting to unscale FP16
// gradients."), Megatron, tensor / pipeline / context parallelism. Clipping
// (optimizer.max_grad_norm, sim/step/clip_grad.h) runs after before_step's unscale_.
#pragma once

#include <string>
#include <utility>

#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

class GradScalerSim {
 public:
  // fused: the optimizer has _step_supports_amp_scaling (optimizer.impl fused).
  // dtensor_grads: FSDP2's DTensor grads (found_inf_reduce_handler's clone per dtype group).
  // source: the scenario file, for scale()'s refusal of a loss that is not 4-byte.
  GradScalerSim(bool fused, bool dtensor_grads, std::string source)
      : fused_(fused), dtensor_grads_(dtensor_grads), source_(std::move(source)) {}
  // scaler.scale(loss): the scaled loss (its graph on top of loss's).
  graph::Tensor scale(graph::Runtime& rt, const graph::Tensor& loss);
  // scaler.step(opt) up to optimizer.step(): unscale_ (the found_inf copy stays), or for
  // a fused optimizer _check_inf_per_device and the grad_scale / found_inf it is handed.
  void before_step(graph::Runtime& rt);
  // scaler.step(opt) after optimizer.step() (fused: grad_scale, then the summed found_inf).
  void after_step(graph::Runtime& rt);
  // scaler.update(): the step's found_inf copy dies.
  void update(graph::Runtime& rt);

 private:
  void unscale(graph::Runtime& rt);
  void check_inf_per_device(graph::Runtime& rt);
  // _unscale_grads_: the per-device copies (found_inf's, then the inv scale's, which the
  // caller frees at its return) and, over DTensor grads, the handler's found_inf clone.
  graph::Tensor unscale_grads(graph::Runtime& rt);

  bool fused_;
  bool dtensor_grads_;
  std::string source_;
  graph::Tensor scale_, growth_tracker_;  // created by the first scale(), kept
  graph::Tensor found_inf_;               // per-device found_inf, from unscale_ to update
  graph::Tensor fused_found_inf_, fused_grad_scale_;  // fused: optimizer.found_inf / .grad_scale
};

// Throws ScenarioError naming precision.grad_scaler (or the clashing key) where the scaler
// is not modelled.
void require_grad_scaler_modelled(const Scenario& s);

}  // namespace memsim
