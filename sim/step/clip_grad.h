// torch.nn.utils.clip_grad_norm_(params, max_norm) between backward and optimizer.step
// (optimizer.max_grad_norm; docs/clip-grad.md): the tensors it allocates on CUDA and their
// lifetimes. Read from torch/nn/utils/clip_grad.py (pytorch/pytorch @
// 01a57d87bd4826d1f528b2dc47360a8087b34f5a, the 2.6+ split into _get_total_norm and
// _clip_grads_with_norm_; 2.1-2.5 inline the same statements) and
// aten/src/ATen/native/cuda/ForeachReduceOp.cu (@ 0124626f435bc454e10b6362acbd352dde4617d3):
//
// * grads = [p.grad ...]; _group_tensors_by_device_and_dtype: one group per grad dtype, in
//   the order each dtype first appears (no memory).
// * per group, torch._foreach_norm(grads, 2.0) (foreach=None on CUDA plain tensors takes
//   it): _foreach_tensor_norm_cuda_impl allocates output_per_tensor = zeros(N x max_chunks)
//   and global_output = zeros(320), both opmath (fp32 for fp32/bf16/fp16 grads;
//   kChunkSize 65536 elements), then N 0-d results in the grads' dtype, then a 0-d
//   global_norm; at return its locals die (global_output, output_per_tensor), then the
//   returned pair's global_norm. The N results stay in `norms` until _get_total_norm returns.
// * norm.to(first_device) is a no-op; torch.stack(norms): [N] in the promoted dtype;
//   total_norm = torch.linalg.vector_norm(stack, 2.0): 0-d (a single-block reduction for
//   N < 7681: no Reduce.cuh global-memory staging); the stack dies with the statement.
// * error_if_nonfinite: isnan, isinf, logical_or (0-d bool each); the first two die after
//   the call, the third once `if` has read it.
// * _clip_grads_with_norm_: total_norm + 1e-6, then clip_coef = max_norm / that, which
//   is Tensor.__rtruediv__ = `self.reciprocal() * other` (torch/_tensor.py): a reciprocal
//   (dies at __rdiv__'s return), the product, then the shifted norm dies;
//   clip_coef_clamped = clamp(clip_coef, max=1.0); per group
//   _foreach_mul_(grads, clip_coef_clamped.to(device)) in place (nothing new); clip_coef
//   and clip_coef_clamped die at return.
// * clip_grad_norm_ returns total_norm: a statement that drops it frees it there; a script
//   that binds it (HF Trainer's _grad_norm / grad_norm, torchtitan's grad_norm:
//   optimizer.clip_keep_norm) keeps it until the next step's clip returns.
//
// Every tensor here is at most a few KiB: 512-B small-pool blocks but output_per_tensor
// (N x chunks x 4 B, e.g. 2.3 MB for 291 grads whose largest has 131M elements).
// Without kernel scratch (device.kernel_scratch false, a CPU run) the per-group norms are
// ATen's CPU path (foreach_tensor_norm_slow: one linalg_vector_norm per tensor, no
// workspaces), which is also what torch 1.13's clip_grad_norm_ computes (a list of
// torch.norm(g) per grad, then the same stack / norm / clamp).
//
// Over FSDP2 (dtensor_grads) the grads are the shards' DTensor .grads: the same calls on
// each rank's local shards, and linalg.vector_norm of the stacked _NormPartial norms first
// redistributes the stack to Replicate (sim/step/clip_grad_dtensor.h). FSDP1's
// FullyShardedDataParallel.clip_grad_norm_ is sim/step/fsdp1_clip_grad.h.
//
// Not modelled (refused by require_clip_grad_modelled, naming the key): foreach false (the
// per-grad vector_norm's Reduce.cuh staging), DeepSpeed/Megatron clipping,
// tensor/pipeline/context parallelism, ZeroRedundancyOptimizer, optimizer.in_backward,
// master weights, a fused optimizer under the GradScaler, numeric mode.
#pragma once

#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

class ClipGradNormSim {
 public:
  // dtensor_grads: FSDP2's sharded DTensor gradients (parallel.sharding fsdp2).
  ClipGradNormSim(const OptimizerConfig& o, uint64_t model_elem, bool dtensor_grads = false)
      : keep_norm_(o.clip_keep_norm), error_if_nonfinite_(o.clip_error_if_nonfinite),
        dtensor_grads_(dtensor_grads), model_elem_(model_elem) {}
  // clip_grad_norm_(model.parameters(), max_norm) on the Runtime's parameter grads.
  void clip(graph::Runtime& rt);

 private:
  bool keep_norm_, error_if_nonfinite_, dtensor_grads_;
  uint64_t model_elem_;
  graph::Tensor kept_norm_;  // clip_keep_norm: the previous step's total_norm
};

// Throws ScenarioError naming optimizer.max_grad_norm (or the clashing key) where clipping
// is not modelled. No-op without optimizer.max_grad_norm. DeepSpeed runs clip in the engine
// instead (ClipGradNormSim is not used): require_deepspeed_clip_modelled
// (sim/parallel/deepspeed_norm.h) checks them.
void require_clip_grad_modelled(const Scenario& s);

}  // namespace memsim
