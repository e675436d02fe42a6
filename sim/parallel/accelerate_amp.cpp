#include "sim/parallel/accelerate_amp.h"

#include <stdexcept>

#include "graph/ops/ops_nn.h"

namespace memsim {

using graph::Runtime;
using graph::Tensor;

bool accelerate_fsdp2_amp(const Scenario& s) {
  return s.parallel.sharding == Sharding::fsdp2 && s.precision.autocast.has_value() &&
         s.parallel.fsdp_mixed_precision.has_value();
}

bool accelerate_fsdp1_amp(const Scenario& s) {
  return s.parallel.sharding == Sharding::fsdp && s.precision.autocast.has_value() &&
         s.parallel.fsdp_mixed_precision.has_value();
}

bool accelerate_fsdp1_upcast(const Scenario& s) {
  return accelerate_fsdp1_amp(s) && s.precision.params != DType::fp32;
}

uint64_t trained_param_elem(const Scenario& s) {
  return accelerate_fsdp1_upcast(s) ? 4 : static_cast<uint64_t>(dtype_bytes(s.precision.params));
}

namespace {
// x.to(dtype) of a forward output at the root's boundary (module none, outside the layers).
Tensor boundary_copy(Runtime& rt, const Tensor& x, uint64_t bytes, const char* name) {
  const graph::OpContext saved = rt.ctx;
  rt.ctx.layer = -1;
  rt.ctx.module = graph::Module::none;
  Tensor out = graph::to_copy(rt, x, bytes);
  rt.program().tensors[out.storage].name = rt.program().intern(name);
  rt.ctx = saved;
  return out;
}
}  // namespace

void convert_outputs_to_fp32(Runtime& rt, Tensor& loss, Tensor& logits, uint64_t numel) {
  (void)loss;  // fp32 already: recursively_apply returns it unchanged
  if (!logits.defined()) return;
  if (logits.bytes != numel * 4 && logits.bytes != numel * 2)
    throw std::logic_error("convert_outputs_to_fp32: the logits are not (batch, seq, vocab)");
  if (logits.bytes == numel * 4) return;
  Tensor fp32 = boundary_copy(rt, logits, numel * 4,
                              "logits in fp32 (accelerate convert_outputs_to_fp32)");
  logits = std::move(fp32);  // the low-precision logits die with the replaced ModelOutput
}

void cast_outputs(Runtime& rt, Tensor& loss, Tensor& logits, uint64_t numel, uint64_t elem) {
  Tensor loss_cast, logits_cast;
  if (loss.defined() && loss.bytes != elem)
    loss_cast = boundary_copy(rt, loss, elem, "loss in output_dtype (FSDP2 cast_forward_outputs)");
  if (logits.defined() && logits.bytes != numel * elem)
    logits_cast = boundary_copy(rt, logits, numel * elem,
                                "logits in output_dtype (FSDP2 cast_forward_outputs)");
  // The original outputs die once the post-forward hook's result replaced them.
  if (loss_cast.defined()) loss = std::move(loss_cast);
  if (logits_cast.defined()) logits = std::move(logits_cast);
}

}  // namespace memsim
