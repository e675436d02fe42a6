// torch.amp.GradScaler in the training loop (precision.grad_scaler; docs/autocast.md
// "GradScaler"): the 0-d tensors a plain AMP script's
//
//   scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
//
// allocates and frees, each a 512-B small-pool block on CUDA. Read from
// torch/amp/grad_scaler.py (pytorch/pytorch @ 0202916b051677fea50852f1c3b856476f66b423; the
// GPU run of tools/gpu/measure_gscaler.py records the text of the 2.11 file it ran):
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
// * update(rt): `found_inf.to(device)` is the same tensor, _amp_update_scale_ works in
//   place; the state with the found_inf copy is dropped, so the copy dies.
//
// Not modelled (refused by require_grad_scaler_modelled): optimizers with
// _step_supports_amp_scaling (fused Adam/AdamW/SGD take grad_scale / found_inf tensors
// instead), FSDP's ShardedGradScaler, DeepSpeed's own loss scaler, fp16 gradients (the
// source raises "Attempting to unscale FP16 gradients."), Megatron, pipelines, clipping.
#pragma once

#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

class GradScalerSim {
 public:
  // scaler.scale(loss): the scaled loss (its graph on top of loss's).
  graph::Tensor scale(graph::Runtime& rt, const graph::Tensor& loss);
  // scaler.step(opt) up to optimizer.step(): unscale_ (the found_inf copy stays).
  void unscale(graph::Runtime& rt);
  // scaler.update(): the step's found_inf copy dies.
  void update(graph::Runtime& rt);

 private:
  graph::Tensor scale_, growth_tracker_;  // created by the first scale(), kept
  graph::Tensor found_inf_;               // per-device found_inf, from unscale_ to update
};

// Throws ScenarioError naming precision.grad_scaler (or the clashing key) where the scaler
// is not modelled.
void require_grad_scaler_modelled(const Scenario& s);

}  // namespace memsim
