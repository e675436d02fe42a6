// DeepSpeed's loss scaling, overflow check, global gradient norm and gradient clipping on
// rank 0 (docs/deepspeed.md "Gradient norm, clipping and the loss scaler"): the tensors the
// ZeRO optimizers' step() and the engine's backward() allocate for them, and their
// lifetimes. Read from DeepSpeed 0.19.6 (github deepspeedai/DeepSpeed at edaa7221, the
// commit deepspeed_zero.h models): runtime/engine.py (backward, _take_model_step),
// runtime/base_optimizer.py (ZeROOptimizer.scale_if_loss), runtime/fp16/loss_scaler.py
// (LossScalerBase.scale_loss, CreateLossScaler), runtime/utils.py
// (mask_nan_or_inf_with_val_inplace), runtime/zero/stage_1_and_2.py (step,
// scaled_global_norm, get_grad_norm_direct, has_overflow, _has_inf_or_nan,
// unscale_and_clip_grads, set_norm_for_param_grad_in_gpu, update_offload_overflow_tracker,
// complete_grad_norm_calculation_for_cpu_offload) and runtime/zero/stage3.py (__init__'s
// inf_or_nan_tracker, step, _overflow_check_and_loss_scale_update, has_overflow,
// _get_norm_groups, get_grad_norm_direct, _constant_buffered_norm2,
// complete_grad_norm_calculation_for_cpu_offload, unscale_and_clip_grads).
//
// * The loss scale is a Python float (LossScaler / DynamicLossScaler.cur_scale; 1.0 for
//   bf16 and fp32, CreateLossScaler): the scaler owns no tensor. engine.backward(loss)
//   calls optimizer.scale_if_loss(loss) = `loss * loss_scale` for every dtype (a 0-d
//   tensor, MulBackward1: its backward's grad * scale is a new 0-d tensor), dropped when
//   engine.backward returns. HF Trainer passes scale_wrt_gas=False (transformers
//   src/transformers/trainer.py Trainer.training_step @ 000945a9, PR #35808), so
//   `gas_scaled_loss` is the loss itself and the output hooks' grad / gas is not taken:
//   neither allocates (the scale_wrt_gas=True path is not modelled).
// * ZeRO 1/2 step (no offload): check_overflow when check_grad_overflow (fp16; bf16's
//   check_grad_overflow true is refused by the reader): per partition gradient
//   _has_inf_or_nan = x.float(), isnan, isinf, logical_or, .float(), .max(); then
//   scaled_global_norm -> get_grad_norm_direct: per partition gradient
//   vector_norm(g.double()) (an fp64 copy of the gradient, its 0-d norm kept in a list),
//   stack / square / sum / float, pow(0.5), mask_nan_or_inf_with_val_inplace; the group
//   norms' stack and vector_norm; `_global_grad_norm = norm / prev_scale` (kept by the
//   optimizer and the engine: the previous step's dies after the next optimizer.step());
//   unscale_and_clip_grads on the fp32 gradient: with gradient_clipping > 0 the 0-d chain
//   (norm / scale + 1e-6) / clip, clamp, * scale, then 1. / combined (reciprocal, mul);
//   without, a Python float. This happens every step: the norm is computed whether or not
//   clipping is on.
// * ZeRO 1/2 with offload_optimizer cpu: at the accumulation boundary, per partition
//   gradient, its fp64 norm (set_norm_for_param_grad_in_gpu, kept until the step's
//   reset_cpu_buffers) and update_offload_overflow_tracker's _has_inf_or_nan on the whole
//   gradient (for every dtype); in the step a 4-B total_dev_norm (and the 1-B overflow flag
//   with fp16); the rest runs on the CPU.
// * ZeRO-3: a 1-element bool inf_or_nan_tracker made by __init__ (on the GPU without
//   offload_optimizer) and kept. step: fp16 only, has_overflow on the reduce stream:
//   isinf / isnan of the whole grad_partitions_flat_buffer (one byte per element) and
//   .any(); then per sub group get_grad_norm_direct: per partition gradient
//   g.double().norm(2), stack, pow, sum, ** 0.5, isinf / isnan / logical_or, a 4-B err and
//   torch.where (fp64); the sub groups' norms stay in step()'s norm_groups until it
//   returns; per sub group unscale_and_clip_grads as above in fp64. With offload_optimizer
//   the norms are taken at the boundary in partition_grads (_constant_buffered_norm2 on the
//   GPU copy of each partition, kept until reset_cpu_buffers) and the step's
//   complete_grad_norm_calculation_for_cpu_offload sums them on the GPU.
//
// Not modelled: ATen's CUDA reduction scratch of the full reductions (Reduce.cuh's
// global-memory staging and semaphores of .norm / .sum / .max / .any on large tensors: a
// few KiB per kernel, freed when it ends; the same gap as optimizer.clip_foreach false),
// the overflow branch (a step that finds inf/NaN frees the gradients and skips the
// update: memsim simulates steps without overflow), ZeRO++ / MoE / pipeline norms.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

class DeepSpeedNorm {
 public:
  // stage: 1-3; grad_elem: bytes of the bit16 gradients; offload: offload_optimizer.
  DeepSpeedNorm(graph::Runtime& rt, const Scenario& s);

  // engine.backward: optimizer.scale_if_loss(loss) = loss * loss_scale (the graph's root).
  graph::Tensor scale_loss(graph::Runtime& rt, const graph::Tensor& loss);

  // ZeRO-3 __init__: inf_or_nan_tracker (kept; on the GPU unless offload_optimizer).
  void make_tracker(graph::Runtime& rt);

  // ZeRO 1/2 step, up to the flat gradient: check_overflow (fp16), scaled_global_norm,
  // _global_grad_norm. `grads`: each partition gradient's elements (averaged_gradients).
  void norm12(graph::Runtime& rt, const std::vector<uint64_t>& grads);
  // ZeRO 1/2 with offload, at the boundary per partition gradient (copy_grads_in_partition):
  // its fp64 norm (kept) and the overflow tracker's check of the whole gradient.
  void offload_grad12(graph::Runtime& rt, uint64_t in_partition, uint64_t whole);
  // ZeRO 1/2 step with offload (the GPU tensors of check_overflow and the CPU norm).
  void offload_step12(graph::Runtime& rt);

  // ZeRO-3 step after _partition_all_parameters: has_overflow (fp16) on the grad
  // partitions buffer (`buffer` elements), then _get_norm_groups over the sub groups'
  // partition gradients, the global norm and _global_grad_norm.
  void norm3(graph::Runtime& rt, uint64_t buffer, const std::vector<std::vector<uint64_t>>& sub_groups);
  // ZeRO-3 with offload, at the boundary per partition (_constant_buffered_norm2 of its GPU
  // copy, on the reduce stream, kept until the step's reset_cpu_buffers).
  void offload_grad3(graph::Runtime& rt, uint64_t partition);
  // ZeRO-3 step with offload: per sub group complete_grad_norm_calculation_for_cpu_offload
  // over `counts[g]` kept norms.
  void offload_step3(graph::Runtime& rt, const std::vector<uint64_t>& counts);

  // unscale_and_clip_grads on one fp32 gradient (stage 1/2: per group, stage 3: per sub group).
  void unscale_and_clip(graph::Runtime& rt);
  // optimizer.step() returns (its locals die), then the engine takes _global_grad_norm
  // (the previous step's dies); with offload reset_cpu_buffers drops the kept norms first.
  void step_done(graph::Runtime& rt);

 private:
  graph::Tensor alloc(graph::Runtime& rt, uint64_t bytes, graph::OpKind op, uint32_t name, uint8_t stream = 0,
                      TensorKind kind = TensorKind::temporary);
  // _has_inf_or_nan (stage_1_and_2.py): x.float() ... .max(); returns the 0-d max.
  graph::Tensor has_inf_or_nan(graph::Runtime& rt, uint64_t numel);
  // mask_nan_or_inf_with_val_inplace (runtime/utils.py) on a 0-d norm.
  void mask_nan_or_inf(graph::Runtime& rt);

  int stage_;
  uint64_t elem_;        // the gradients' bytes per element
  bool fp16_;            // check_grad_overflow (engine._configure_zero_optimizer: fp16)
  bool offload_;
  double clip_;          // gradient_clipping (0: none)
  uint64_t norm_elem_;   // the total norm's dtype: fp32 (stage 1/2) or fp64 (stage 3)
  graph::Tensor tracker_;            // ZeRO-3 inf_or_nan_tracker
  graph::Tensor scaled_norm_;        // step()'s scaled_global_grad_norm
  std::vector<graph::Tensor> norm_groups_;  // ZeRO-3 step()'s norm_groups
  graph::Tensor new_global_norm_;    // optimizer._global_grad_norm of this step
  graph::Tensor engine_global_norm_; // engine._global_grad_norm (the previous step's until rebound)
  std::vector<graph::Tensor> kept_norms_;   // offload: norm_for_param_grads, insertion order
  std::vector<graph::Tensor> scratch_;      // get_grad_norm_direct's list of norms (empty between calls)
  // Interned names (program/tensor_names.h), one per kind of tensor.
  uint32_t n_scaled_loss_, n_tracker_, n_f64_copy_, n_f32_copy_, n_mask_, n_scalar_, n_stack_, n_global_;
};

// optimizer.max_grad_norm with parallel.sharding deepspeed (DeepSpeed's gradient_clipping):
// throws ScenarioError naming the key where it is not modelled.
void require_deepspeed_clip_modelled(const Scenario& s);

}  // namespace memsim
