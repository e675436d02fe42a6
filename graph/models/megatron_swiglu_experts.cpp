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
  // SequentialMLP (MLP.forward): `intermediate_parallel = weighted_bias_swiglu_impl(...)`
  // drops the last reference to fc1's output here. TEGroupedMLP.forward binds it to the
  // local `fc1_output` until it returns (Megatron-LM d98e8a64 moe/experts.py, TEGroupedMLP.
  // forward: `fc1_output, bias_parallel = apply_module(self.linear_fc1)(...)`, `moe_act_manager
  // = off_interface(..., fc1_output, "moe_act")`, fc2, `group_offload(output,
  // forced_released_tensors=[fc1_output])`, return): without grad it is alive through fc2.
  if (!s.te_grouped) gated.reset();
  Tensor out = megatron_linear(rt, scaled, {M * h * e, s.fc2_weight, 0, flops, 0, 0, -1});
  if (s.moe_act) out = discard_moe_act(rt, scaled, out);  // discard_output_and_register_recompute
  scaled.reset();  // `bias_act_output` / `intermediate_parallel`: to the return (no bias add)
  gated.reset();
  return out;
}

}  // namespace memsim::graph
