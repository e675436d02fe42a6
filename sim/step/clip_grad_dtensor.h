// clip_grad_norm_ over FSDP2's DTensor gradients (parallel.sharding fsdp2 with
// optimizer.max_grad_norm; docs/clip-grad.md "Over FSDP2's DTensor gradients"): what differs
// from the plain-tensor call of sim/step/clip_grad.h, read from the source:
//
// * torch/distributed/tensor/__init__.py (pytorch/pytorch @ 1d310620b3f1) appends DTensor to
//   torch.utils._foreach_utils._foreach_supported_types, so _has_foreach_support is true
//   and _get_total_norm takes torch._foreach_norm on the DTensor grads (not the per-grad
//   vector_norm path). Its sharding rule (foreach_norm_strategy,
//   torch/distributed/tensor/_ops/_math_ops.py @ 0088381bebca) reduces each Shard(0) grad
//   to a 0-d _NormPartial(2): no redistribution, so the local op is one CUDA
//   _foreach_norm over the rank's local shards (rank 0's: the padded shard), with the same
//   workspaces as sim/step/clip_grad.h, sized by the largest local shard.
// * torch.stack of the N norms follows their placement (stack_strategy,
//   _tensor_ops.py: "stack is used w/ NormPartial"): a local [N] stack, still _NormPartial.
// * linalg.vector_norm of that stack: common_reduction_strategy (_math_ops.py @ 0088381b,
//   the check pytorch/pytorch#165962 added: a Partial input whose reduce_op ("sum" for
//   _NormPartial(2)) is not the reduction (NormReduction(2)) is made Replicate first)
//   redistributes the stack Partial -> Replicate before the local norm:
//   _NormPartial._reduce_value = `tensor ** 2` (a new [N]), funcol.all_reduce (the
//   _c10d_functional op clones its input, torch/csrc/distributed/c10d/Functional.cpp
//   @ 00295aec0dd3, then reduces the clone in place), `** (1/2)` (a new [N]); at its return
//   the squared stack, then the reduced clone die; the Replicate [N] is the dispatcher's
//   local argument: the 0-d total norm is allocated while it lives, and it dies when the
//   dispatch returns (before the argument stack dies with the statement).
// * The total norm is then a Replicate DTensor: everything after it (error_if_nonfinite's
//   isnan / isinf / logical_or, `total_norm + 1e-6`, the reciprocal and product, clamp,
//   _foreach_mul_ on the Shard(0) grads with a Replicate scalar) is local and allocates as
//   on one GPU. torchtitan's dist_utils.clip_grad_norm_ (torchtitan @ b5bcd76c, the
//   `total_norm.full_tensor()` of a Replicate DTensor: no redistribution, the local tensor)
//   and torchtune's `grad_norm.full_tensor()` add nothing; Accelerate's FSDP2 branch
//   (accelerate @ 16cb6eb8, Accelerator.clip_grad_norm_) is torch.nn.utils.clip_grad_norm_.
//
// Every tensor here is 0-d or [N] (512-B small-pool blocks up to 128 fp32 grads).
#pragma once

#include <cstdint>

#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

// linalg.vector_norm(stack) with the stack (stack_bytes, allocated by the caller) a
// _NormPartial DTensor: the redistribution's three [N] tensors and the 0-d total norm
// (elem bytes), which it returns. The caller frees the stack after.
graph::Tensor dtensor_stack_norm(graph::Runtime& rt, uint64_t stack_bytes, uint64_t elem);

// Throws ScenarioError naming the key where clipping over FSDP2 is not modelled
// (called by require_clip_grad_modelled for parallel.sharding fsdp2).
void require_fsdp2_clip_modelled(const Scenario& s);

}  // namespace memsim
