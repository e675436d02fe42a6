#include "graph/models/megatron_swiglu_experts.h"

#include "graph/ops/ops_fused.h"
#include "graph/ops/ops_megatron_arch.h"

namespace memsim::graph {

Tensor swiglu_experts(Runtime& rt, const Tensor& permuted, const Tensor& probs, const SwigluExpertsSpec& s) {
  const uint64_t M = s.rows, h = s.hidden, F = s.ffn, e = s.elem;
  const double flops = 2 * static_cast<double>(M) * static_cast<double>(h) * static_cast<double>(F);
  Tensor gated = megatron_linear(rt, permuted, {M * 2 * F * e, s.fc1_weight, 0, 2 * flops, 0, 0, -1});
  // weighted_bias_swiglu_impl(fc1, None, probs); under moe_act inside CheckpointWithoutOutput.
  Tensor scaled = s.moe_act ? checkpointed_weighted_swiglu(rt, gated, probs) : weighted_swiglu(rt, gated, probs);
  gated.reset();
  Tensor out = megatron_linear(rt, scaled, {M * h * e, s.fc2_weight, 0, flops, 0, 0, -1});
  if (s.moe_act) out = discard_moe_act(rt, scaled, out);  // discard_output_and_register_recompute
  scaled.reset();
  return out;
}

}  // namespace memsim::graph
