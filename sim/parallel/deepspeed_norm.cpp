// DeepSpeed's loss scaling, overflow check, gradient norm and clipping (the contract and
// the sources are in deepspeed_norm.h). Each function follows one DeepSpeed function's
// statements; CPython frees a temporary when the statement (or the call that consumed it)
// ends and a function's locals at its return, in the order of the code object's
// co_varnames (arguments first, then locals by first appearance); a list frees its items
// from the last.
#include "sim/parallel/deepspeed_norm.h"

#include <algorithm>
#include <string>

#include "graph/ops/ops_nn.h"

namespace memsim {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

namespace {
constexpr uint64_t kF64 = 8, kF32 = 4, kBool = 1;
// _constant_buffered_norm2's buffer_size (stage3.py): the partition is normed in parts.
constexpr uint64_t kNormBuffer = 250000000;

void free_list_from_end(std::vector<Tensor>& list) {
  for (auto it = list.rbegin(); it != list.rend(); ++it) it->reset();
  list.clear();
}
}  // namespace

DeepSpeedNorm::DeepSpeedNorm(Runtime& rt, const Scenario& s)
    : stage_(static_cast<int>(s.parallel.zero)),
      elem_(static_cast<uint64_t>(dtype_bytes(s.precision.params))),
      fp16_(s.precision.params == DType::fp16),
      offload_(s.deepspeed.offload_optimizer != DsOffload::none),
      clip_(s.optimizer.max_grad_norm.value_or(0.0)),
      norm_elem_(s.parallel.zero == 3 ? kF64 : kF32) {
  Program& p = rt.program();
  const std::string zero = "ZeRO-" + std::to_string(stage_);
  n_scaled_loss_ = p.intern("scaled loss (DeepSpeed scale_if_loss: loss * loss_scale)");
  n_tracker_ = p.intern("inf_or_nan_tracker (ZeRO-3 overflow flag)");
  n_f64_copy_ = p.intern("fp64 copy of a gradient for its norm (" + zero + " grad norm)");
  n_f32_copy_ = p.intern("fp32 copy of a gradient for the overflow check (" + zero + " _has_inf_or_nan)");
  n_mask_ = p.intern("inf / nan mask of gradients (" + zero + " overflow check)");
  n_scalar_ = p.intern("gradient norm or overflow scalar (" + zero + " step)");
  n_stack_ = p.intern("stacked gradient norms (" + zero + " grad norm)");
  n_global_ = p.intern("_global_grad_norm (" + zero + ")");
}

Tensor DeepSpeedNorm::alloc(Runtime& rt, uint64_t bytes, OpKind op, uint32_t name, uint8_t stream, TensorKind kind) {
  Tensor t = rt.alloc(bytes, kind, op);
  if (stream != 0) rt.program().events.back().stream = stream;  // the alloc just appended
  rt.name(t.storage, name);
  return t;
}

Tensor DeepSpeedNorm::scale_loss(Runtime& rt, const Tensor& loss) {
  // base_optimizer.py scale_if_loss -> loss_scaler.scale_loss: `loss * self.loss_scale`
  // (a Python float, 1.0 unless fp16): MulBackward1, whose backward makes grad * scale.
  Tensor scaled = graph::mul_scalar(rt, loss);
  rt.name(scaled.storage, n_scaled_loss_);
  return scaled;
}

void DeepSpeedNorm::make_tracker(Runtime& rt) {
  // stage3.py __init__: torch.zeros(1, dtype=torch.bool, device=self.device), kept.
  tracker_ = rt.alloc(kBool, TensorKind::other, OpKind::zeros);
  rt.name(tracker_.storage, n_tracker_);
}

Tensor DeepSpeedNorm::has_inf_or_nan(Runtime& rt, uint64_t numel) {
  // stage_1_and_2.py _has_inf_or_nan: float_x = x.float() (x itself when fp32), nan, inf,
  // inf_or_nan; `return inf_or_nan.float().max()` (the .float() dies once max returns);
  // then the locals in order: float_x, nan, inf, inf_or_nan.
  Tensor float_x;
  if (elem_ != kF32) float_x = alloc(rt, numel * kF32, OpKind::to_copy, n_f32_copy_);
  Tensor nan = alloc(rt, numel * kBool, OpKind::compare, n_mask_);
  Tensor inf = alloc(rt, numel * kBool, OpKind::compare, n_mask_);
  Tensor inf_or_nan = alloc(rt, numel * kBool, OpKind::bitwise, n_mask_);
  Tensor as_float = alloc(rt, numel * kF32, OpKind::to_copy, n_f32_copy_);
  Tensor max = alloc(rt, kF32, OpKind::reduce_sum, n_scalar_);
  as_float.reset();
  float_x.reset();
  nan.reset();
  inf.reset();
  inf_or_nan.reset();
  return max;
}

void DeepSpeedNorm::mask_nan_or_inf(Runtime& rt) {
  // runtime/utils.py mask_nan_or_inf_with_val_inplace: isinf, isnan, logical_or, err =
  // torch.tensor(-1.0, device) (fp32), masked_fill_ in place; the locals die at return.
  Tensor is_inf = alloc(rt, kBool, OpKind::compare, n_scalar_);
  Tensor is_nan = alloc(rt, kBool, OpKind::compare, n_scalar_);
  Tensor either = alloc(rt, kBool, OpKind::bitwise, n_scalar_);
  Tensor err = alloc(rt, kF32, OpKind::full, n_scalar_);
  is_inf.reset();
  is_nan.reset();
  either.reset();
  err.reset();
}

// ---------------------------------------------------------------- ZeRO 1 / 2
void DeepSpeedNorm::norm12(Runtime& rt, const std::vector<uint64_t>& grads) {
  if (fp16_) {
    // check_overflow -> has_overflow -> has_overflow_partitioned_grads_serial:
    // invalid_grad_count = zeros([1]) (fp32); `+= _has_inf_or_nan(grad)` in place per
    // gradient (the returned max dies after the statement); `return invalid.bool()`.
    Tensor overflow;
    {
      Tensor invalid = alloc(rt, kF32, OpKind::zeros, n_scalar_);
      for (uint64_t n : grads) has_inf_or_nan(rt, n).reset();
      overflow = alloc(rt, kBool, OpKind::to_copy, n_scalar_);
    }  // invalid_grad_count dies at return
    // has_overflow: overflow_gpu = overflow.byte() (.to(device) is a no-op), all_reduce in
    // place, .item(); its locals die in order: overflow, overflow_gpu.
    Tensor overflow_gpu = alloc(rt, kBool, OpKind::to_copy, n_scalar_);
    overflow.reset();
    overflow_gpu.reset();
  }
  // scaled_global_norm -> get_grad_norm_direct(averaged_gradients[0], ...): per gradient
  // vector_norm(g.data.double().detach()) (.to(device) no-op): the fp64 copy dies once the
  // norm exists; the norms stay in all_norms.
  Tensor total_norm;
  {
    std::vector<Tensor>& all_norms = scratch_;  // reused: no allocation per step
    for (uint64_t n : grads) {
      Tensor as_double = alloc(rt, n * kF64, OpKind::to_copy, n_f64_copy_);
      all_norms.push_back(alloc(rt, kF64, OpKind::reduce_sum, n_scalar_));
    }
    // total_norm = torch.stack(all_norms).square().sum().float(): each link frees the last
    // (no gradient: torch.tensor(0.0, dtype=float32).to(device)).
    Tensor as_float;
    if (grads.empty()) {
      as_float = alloc(rt, kF32, OpKind::full, n_scalar_);
    } else {
      Tensor stacked = alloc(rt, grads.size() * kF64, OpKind::cat_n, n_stack_);
      Tensor squared = alloc(rt, grads.size() * kF64, OpKind::pow2, n_stack_);
      stacked.reset();
      Tensor sum = alloc(rt, kF64, OpKind::reduce_sum, n_scalar_);
      squared.reset();
      as_float = alloc(rt, kF32, OpKind::to_copy, n_scalar_);
    }
    // all_reduce in place; total_norm = total_norm.pow(1. / norm_type): the old one dies.
    total_norm = alloc(rt, kF32, OpKind::pow2, n_scalar_);
    as_float.reset();
    mask_nan_or_inf(rt);
    free_list_from_end(all_norms);  // get_grad_norm_direct returns
  }
  // scaled_global_norm: norm_groups = [total_norm]; vector_norm(torch.stack(norm_groups))
  // (the stack dies with the call); norm_groups dies at return.
  {
    Tensor stacked = alloc(rt, kF32, OpKind::cat_n, n_stack_);
    scaled_norm_ = alloc(rt, kF32, OpKind::reduce_sum, n_scalar_);
    stacked.reset();
    total_norm.reset();
  }
  // step: self._global_grad_norm = scaled_global_grad_norm / prev_scale.
  new_global_norm_ = alloc(rt, kF32, OpKind::div_scalar, n_global_, 0, TensorKind::other);  // kept across steps
}

void DeepSpeedNorm::offload_grad12(Runtime& rt, uint64_t in_partition, uint64_t whole) {
  // copy_grads_in_partition (cpu_offload) at the boundary: set_norm_for_param_grad_in_gpu:
  // norm_for_param_grads[id] = grad.narrow(partition slice).double().norm(2) (kept);
  // update_offload_overflow_tracker_for_param_grad: `if ... self._has_inf_or_nan(grad.data)`
  // on the whole gradient (every dtype); the max dies once `if` has read it.
  {
    Tensor as_double = alloc(rt, in_partition * kF64, OpKind::to_copy, n_f64_copy_);
    kept_norms_.push_back(alloc(rt, kF64, OpKind::reduce_sum, n_scalar_));
  }
  has_inf_or_nan(rt, whole).reset();
}

void DeepSpeedNorm::offload_step12(Runtime& rt) {
  // check_overflow (fp16): has_overflow: overflow_gpu = ByteTensor([local_overflow]) on the
  // GPU, dead at return. complete_grad_norm_calculation_for_cpu_offload: total_dev_norm =
  // FloatTensor([total]) (GPU), .item(), dead at return; the returned norm, the group stack,
  // _global_grad_norm and unscale_and_clip_grads are on the CPU (self.device 'cpu').
  if (fp16_) alloc(rt, kBool, OpKind::full, n_scalar_).reset();
  alloc(rt, kF32, OpKind::full, n_scalar_).reset();
}

// ---------------------------------------------------------------- ZeRO-3
void DeepSpeedNorm::norm3(Runtime& rt, uint64_t buffer, const std::vector<std::vector<uint64_t>>& sub_groups) {
  if (fp16_) {
    // _overflow_check_and_loss_scale_update -> has_overflow(partition_gradients=True), under
    // `with stream(reduce_and_partition_stream)`: tracker.logical_or_(isinf(buf).any())
    // (the mask dies after .any(), the flag after logical_or_), the same with isnan;
    // overflow_gpu = tracker.clone().to(device).to(uint8) (the clone dies after the cast);
    // overflow_gpu dies when has_overflow returns.
    for (int k = 0; k < 2; ++k) {
      Tensor mask = alloc(rt, buffer * kBool, OpKind::compare, n_mask_, 1);
      Tensor any = alloc(rt, kBool, OpKind::reduce_sum, n_scalar_, 1);
      mask.reset();
      any.reset();
    }
    Tensor clone = alloc(rt, kBool, OpKind::to_copy, n_scalar_, 1);
    Tensor overflow_gpu = alloc(rt, kBool, OpKind::to_copy, n_scalar_, 1);
    clone.reset();
    overflow_gpu.reset();
  }
  // _get_norm_groups: per sub group get_grad_norm_direct(averaged_gradients[i], ...).
  norm_groups_.reserve(sub_groups.size());
  for (const std::vector<uint64_t>& grads : sub_groups) {
    Tensor total_norm_cuda, total_norm;
    std::vector<Tensor>& grad_norms = scratch_;  // reused: no allocation per step
    for (uint64_t n : grads) {  // g.to(device).double().norm(2): the copy dies after norm
      Tensor as_double = alloc(rt, n * kF64, OpKind::to_copy, n_f64_copy_);
      grad_norms.push_back(alloc(rt, kF64, OpKind::reduce_sum, n_scalar_));
    }
    {  // torch.sum(torch.pow(torch.stack(grad_norms), 2))
      const uint64_t count = grads.size();  // a sub group holds at least one parameter
      Tensor stacked = alloc(rt, count * kF64, OpKind::cat_n, n_stack_);
      Tensor squared = alloc(rt, count * kF64, OpKind::pow2, n_stack_);
      stacked.reset();
      total_norm_cuda = alloc(rt, kF64, OpKind::reduce_sum, n_scalar_);
    }  // the pow dies after sum
    // total_norm = total_norm_cuda ** 0.5; isinf, isnan, logical_or; err = tensor(-1.0)
    // (fp32); total_norm = torch.where(inf_or_nan, err, total_norm) (fp64; the old dies).
    total_norm = alloc(rt, kF64, OpKind::pow2, n_scalar_);
    Tensor is_inf = alloc(rt, kBool, OpKind::compare, n_scalar_);
    Tensor is_nan = alloc(rt, kBool, OpKind::compare, n_scalar_);
    Tensor either = alloc(rt, kBool, OpKind::bitwise, n_scalar_);
    Tensor err = alloc(rt, kF32, OpKind::full, n_scalar_);
    Tensor where = alloc(rt, kF64, OpKind::other, n_scalar_);
    total_norm = std::move(where);
    // Return: the locals in co_varnames order (total_norm is the return value).
    total_norm_cuda.reset();
    free_list_from_end(grad_norms);
    is_inf.reset();
    is_nan.reset();
    either.reset();
    err.reset();
    norm_groups_.push_back(std::move(total_norm));
  }
  // step: scaled_global_grad_norm = vector_norm(torch.stack(norm_groups)); the stack dies.
  {
    Tensor stacked = alloc(rt, norm_groups_.size() * kF64, OpKind::cat_n, n_stack_);
    scaled_norm_ = alloc(rt, kF64, OpKind::reduce_sum, n_scalar_);
  }
  // self._global_grad_norm = scaled_global_grad_norm / self.loss_scale.
  new_global_norm_ = alloc(rt, kF64, OpKind::div_scalar, n_global_, 0, TensorKind::other);  // kept across steps
}

void DeepSpeedNorm::offload_grad3(Runtime& rt, uint64_t partition) {
  // _offload_grad_partition_at_boundary: _constant_buffered_norm2(grad_buffer) on the
  // reduce stream: per 250M-element part part.double().norm(2) ** 2.0 (the first is
  // `norm`, later ones are added in place); `return norm ** 0.5` (norm dies at return).
  Tensor norm;
  const uint64_t parts = partition == 0 ? 1 : (partition + kNormBuffer - 1) / kNormBuffer;
  for (uint64_t k = 0; k < parts; ++k) {
    const uint64_t part = std::min(kNormBuffer, partition - k * kNormBuffer);
    Tensor as_double = alloc(rt, part * kF64, OpKind::to_copy, n_f64_copy_, 1);
    Tensor n = alloc(rt, kF64, OpKind::reduce_sum, n_scalar_, 1);
    as_double.reset();
    Tensor squared = alloc(rt, kF64, OpKind::pow2, n_scalar_, 1);
    n.reset();
    if (!norm.defined()) norm = std::move(squared);  // later parts: norm += part in place, then freed
  }
  kept_norms_.push_back(alloc(rt, kF64, OpKind::pow2, n_scalar_, 1));
  norm.reset();
}

void DeepSpeedNorm::offload_step3(Runtime& rt, const std::vector<uint64_t>& counts) {
  if (fp16_) {
    // has_overflow: the tracker and the buffer are host tensors; overflow_gpu =
    // tracker.clone().to(device) (a GPU bool) .to(uint8), under the reduce stream.
    Tensor on_gpu = alloc(rt, kBool, OpKind::to_copy, n_scalar_, 1);
    Tensor overflow_gpu = alloc(rt, kBool, OpKind::to_copy, n_scalar_, 1);
    on_gpu.reset();
    overflow_gpu.reset();
  }
  // _get_norm_groups -> complete_grad_norm_calculation_for_cpu_offload per sub group:
  // total_norm = 0.0; `total_norm += param_norm**2` (the first makes a tensor from the
  // float, later ones add in place); total_norm_cuda = FloatTensor([...]);
  // total_norm = total_norm_cuda[0] ** 0.5 (fp32; the fp64 sum dies); masked; returned
  // .cpu(); then the locals die: total_norm, total_norm_cuda.
  for (uint64_t count : counts) {
    Tensor sum;
    for (uint64_t k = 0; k < count; ++k) {
      Tensor squared = alloc(rt, kF64, OpKind::pow2, n_scalar_);
      if (!sum.defined()) sum = alloc(rt, kF64, OpKind::add_scalar, n_scalar_);
    }
    Tensor total_norm_cuda = alloc(rt, kF32, OpKind::full, n_scalar_);
    Tensor total_norm = alloc(rt, kF32, OpKind::pow2, n_scalar_);
    sum.reset();
    mask_nan_or_inf(rt);
    total_norm.reset();
    total_norm_cuda.reset();
  }
}

// ---------------------------------------------------------------- both
void DeepSpeedNorm::unscale_and_clip(Runtime& rt) {
  if (offload_) return;  // the fp32 gradient and the norm are host tensors
  // unscale_and_clip_grads: combined_scale = loss_scale (a float); with clip_grad > 0
  // clip = ((total_norm / loss_scale) + 1e-6) / clip_grad (each link frees the last),
  // clamp(min=1.0) (the old clip dies at the rebind), combined_scale = clip * loss_scale.
  // grad.mul_(1. / combined_scale): Tensor.__rtruediv__ is reciprocal() * 1.0 (the
  // reciprocal dies inside it), the quotient after mul_. Locals at return: combined_scale,
  // clip. Without clipping 1. / float is a float: nothing is allocated.
  if (clip_ <= 0.0) return;
  const uint64_t e = norm_elem_;
  Tensor clip, combined;
  {
    Tensor a = alloc(rt, e, OpKind::div_scalar, n_scalar_);
    Tensor b = alloc(rt, e, OpKind::add_scalar, n_scalar_);
    a.reset();
    Tensor c = alloc(rt, e, OpKind::div_scalar, n_scalar_);
    b.reset();
    clip = alloc(rt, e, OpKind::other, n_scalar_);  // torch.clamp
    c.reset();
  }
  combined = alloc(rt, e, OpKind::mul_scalar, n_scalar_);
  {
    Tensor reciprocal = alloc(rt, e, OpKind::reciprocal, n_scalar_);
    Tensor quotient = alloc(rt, e, OpKind::mul_scalar, n_scalar_);
    reciprocal.reset();
  }  // mul_ in place; the quotient dies with the statement
  combined.reset();
  clip.reset();
}

void DeepSpeedNorm::step_done(Runtime& rt) {
  (void)rt;
  // step() returns: ZeRO-3's norm_groups (from the last), then scaled_global_grad_norm;
  // with offload _post_step / the stage-1/2 loop end ran reset_cpu_buffers first
  // (norm_for_param_grads = {}: a dict frees its values in insertion order).
  for (Tensor& t : kept_norms_) t.reset();
  kept_norms_.clear();
  free_list_from_end(norm_groups_);
  scaled_norm_.reset();
  // engine._take_model_step: self._global_grad_norm = optimizer._global_grad_norm; the
  // previous step's tensor (the optimizer dropped its reference in step()) dies.
  if (new_global_norm_.defined()) engine_global_norm_ = std::move(new_global_norm_);
}

void require_deepspeed_clip_modelled(const Scenario& s) {
  const OptimizerConfig& o = s.optimizer;
  auto refuse = [&](const char* key, const std::string& why) {
    throw ScenarioError(s.source + ": " + key + ": " + why);
  };
  // The clip_* keys describe torch.nn.utils.clip_grad_norm_'s call; DeepSpeed's engine
  // computes its norm in the ZeRO optimizer's step (no foreach, no error_if_nonfinite, the
  // norm kept as _global_grad_norm).
  if (!o.clip_foreach)
    refuse("optimizer.clip_foreach", "DeepSpeed clips inside its ZeRO optimizer (gradient_clipping), "
                                     "not with clip_grad_norm_; remove the key");
  if (o.clip_error_if_nonfinite)
    refuse("optimizer.clip_error_if_nonfinite", "DeepSpeed clips inside its ZeRO optimizer "
                                                "(gradient_clipping), not with clip_grad_norm_; remove the key");
  if (o.clip_keep_norm)
    refuse("optimizer.clip_keep_norm", "DeepSpeed keeps its norm itself (_global_grad_norm, modelled); "
                                       "remove the key");
  if (s.step.kind != StepKind::train)
    refuse("optimizer.max_grad_norm", "DeepSpeed clips in its optimizer step; step.kind is not train");
  if (o.type == OptimizerType::none)
    refuse("optimizer.max_grad_norm", "clipping needs an optimizer step; optimizer.type is none");
}

}  // namespace memsim
