#include "sim/step/clip_grad_dtensor.h"

#include <string>

namespace memsim {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

Tensor dtensor_stack_norm(Runtime& rt, uint64_t stack_bytes, uint64_t elem) {
  auto temp = [&](uint64_t bytes, OpKind op) { return rt.alloc(bytes, TensorKind::temporary, op); };
  Tensor replicated;
  {
    // _NormPartial._reduce_value(tensor): tensor = tensor ** 2; reduced = funcol.all_reduce
    // (a contiguous clone reduced in place); return reduced ** (1/2). Its locals die at the
    // return in frame order: the squared stack, then the reduced clone.
    Tensor squared = temp(stack_bytes, OpKind::pow2);
    Tensor reduced = temp(stack_bytes, OpKind::clone);
    replicated = temp(stack_bytes, OpKind::pow2);
    squared.reset();
    reduced.reset();
  }
  // The local linalg_vector_norm on the Replicate stack; the dispatcher's redistributed
  // argument dies when the dispatch returns.
  Tensor total = temp(elem, OpKind::reduce_sum);
  replicated.reset();
  return total;
}

void require_fsdp2_clip_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw ScenarioError(s.source + ": " + key + ": " + why);
  };
  if (p.cpu_offload)
    refuse("parallel.cpu_offload",
           "with optimizer.max_grad_norm, FSDP2's CPUOffloadPolicy leaves the gradients on the "
           "CPU (clip_grad_norm_ then runs there and moves the norm); not modelled, use "
           "parallel.cpu_offload: false");
  if (p.tensor != 1 || p.pipeline != 1 || p.context != 1)
    refuse("optimizer.max_grad_norm",
           "over FSDP2 clipping is modelled on the data-parallel mesh only (FSDP2 and HSDP): "
           "tensor parallelism's second mesh dimension, pipeline parallelism's extra all_reduce "
           "(torchtitan's dist_utils.clip_grad_norm_ pp_mesh) and context parallelism are not; "
           "use parallel.tensor, parallel.pipeline and parallel.context 1");
}

}  // namespace memsim
