// FullyShardedDataParallel.clip_grad_norm_(max_norm) of FSDP1 (optimizer.max_grad_norm with
// parallel.sharding fsdp; docs/clip-grad.md "FSDP1"): what HF Trainer runs through
// Accelerate (accelerator.clip_grad_norm_ -> unscale_gradients(), then, for FSDP1,
// model.clip_grad_norm_(max_norm, norm_type); huggingface/accelerate @16cb6eb8
// accelerator.py) after backward, before optimizer.step(). Read from pytorch/pytorch
// torch/distributed/fsdp/fully_sharded_data_parallel.py (the stored copy @005df1d6 for the
// structure; the later 2.x text with `_zero_scalar`, `_get_grad_norm(params, norm_type, zero,
// device)` and `local_nonsharded_norm = ... if nonsharded_params else None`, as quoted in
// docs/clip-grad.md "FSDP1"), on one simulated rank:
//
// * First call: `self._zero_scalar = torch.tensor(0.0, device=compute_device)`: a 0-d fp32
//   tensor kept by the root for the run (returned only when a rank has no gradient).
// * The gradients, in the FSDP states' handle order (Fsdp::clip_order: module pre-order,
//   root first): with use_orig_params each original parameter's .grad (a 1-D view of
//   flat_param.grad, only for parameters with elements in this rank's shard), else each
//   sharded FlatParameter's .grad. All are FULL_SHARD / SHARD_GRAD_OP handles: no
//   non-sharded parameter, so local_nonsharded_norm is None (nothing allocated).
// * _get_grad_norm: one torch.linalg.vector_norm(grad, 2, dtype=float32) per gradient, a
//   0-d fp32 result each, kept in the list comprehension; on CUDA each is a full
//   reduction whose global staging (Reduce.cuh: a ctas x 4-byte buffer, then 4 B of
//   semaphores, freed in reverse at the launcher's return; graph/ops/cuda_reduce.h
//   full_reduce_scratch) comes and goes inside it. torch.stack of the list ([N] fp32);
//   the list is the call's argument, so the N norms die (last first: list_dealloc) when
//   stack returns, before the outer vector_norm allocates its 0-d result; then the stack
//   dies with the statement. `.to(device)` is a no-op.
// * total_norm = local ** 2 (new); dist.all_reduce in place; total_norm ** 0.5 (new, the
//   squared one dies at the rebind).
// * clip_coef = max_norm / (total_norm + 1e-6): the add, then Tensor.__rtruediv__'s
//   reciprocal and product (the reciprocal dies at __rdiv__'s return, the shifted norm at
//   the statement's end); clip_coef_clamped = torch.clamp(clip_coef, max=1.0); per
//   gradient grad.mul_(clamped.to(grad.device, grad.dtype)): in place (fp32 grads: the
//   .to is a no-op). `return total_norm.to(fp32)`: the same tensor.
// * At return the frame's locals go in co_varnames order: local_sharded_norm, clip_coef,
//   clip_coef_clamped. The returned total norm dies with the caller's statement or, with
//   optimizer.clip_keep_norm (Trainer's `_grad_norm`), at the next step's clip.
//
// Every tensor is a 512-B block but the stack (4 N B) and a staging buffer above 512 B.
// Without kernel scratch (a CPU run) there is no staging. Refused by
// require_fsdp1_clip_modelled, naming the key: CPU offload (the total norm moved to the
// CPU), LoRA (frozen parameters in the flat parameters), gradients other than fp32,
// master weights, error_if_nonfinite (FSDP1's clip has no such argument) and a gradient of
// 2^31 elements or more (the reduction's 64-bit split). (FSDP on one rank, NO_SHARD,
// whose clip is torch.nn.utils', is refused for FSDP as a whole.)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

class Fsdp1ClipGradNormSim {
 public:
  // `source`: the scenario's file, for the refusal of a gradient too large to model.
  Fsdp1ClipGradNormSim(const OptimizerConfig& o, std::string source)
      : keep_norm_(o.clip_keep_norm), source_(std::move(source)) {}
  // model.clip_grad_norm_(max_norm) over the parameters `order` (Fsdp::clip_order) that
  // hold a .grad.
  void clip(graph::Runtime& rt, const std::vector<int32_t>& order);

 private:
  bool keep_norm_;
  std::string source_;
  graph::Tensor zero_scalar_;  // FSDP's _zero_scalar, made by the first call
  graph::Tensor kept_norm_;    // clip_keep_norm: the previous step's total norm
};

// Throws ScenarioError naming the key where FSDP1's clip is not modelled; called by
// require_clip_grad_modelled for parallel.sharding fsdp.
void require_fsdp1_clip_modelled(const Scenario& s);

}  // namespace memsim
