// The SwiGLU experts' chain of a Megatron-Core MoE layer on its M permuted rows (family
// megatron, graph/models/megatron_moe.cpp; docs/moe-megatron.md): linear_fc1 [M, 2F], the
// weighted SwiGLU (probs per row) [M, F], linear_fc2 [M, h]; with moe_act (--recompute-
// modules moe_act, TEGroupedMLP only) the SwiGLU runs inside Megatron's
// CheckpointWithoutOutput: its output is freed once fc2 has saved it and recomputed by the
// hook on fc2's output grad (graph/ops/ops_megatron_arch.h).
//
// Modelled from NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553
// megatron/core/transformer/moe/experts.py (TEGroupedMLP.forward: fc1, bias_act_func through
// weighted_bias_swiglu_impl, `self.activation_checkpoint.checkpoint(bias_act_func,
// fc1_output, bias_parallel, permuted_probs)` when activation_recompute, fc2, then
// `discard_output_and_register_recompute(output)`). A free function so that the CPU fixture
// test (tests/test_megatron_moe_act.cpp) runs the very chain the model runs.
//
// Lifetimes without grad (no node saves anything): TEGroupedMLP keeps fc1's [M, 2F] output
// and the SwiGLU's [M, F] until fc2 has run (both are locals of forward, see te_grouped);
// SequentialMLP frees fc1's output right after the SwiGLU.
//
// Contract: permuted [M, h] and probs [M] as the dispatcher hands them; returns fc2's
// output (a view on the recompute hook's node with moe_act). GEMM weight bytes per call are
// the caller's (one expert's for TEGroupedMLP, all local experts' for SequentialMLP).
#pragma once

#include <cstdint>

#include "graph/runtime.h"

namespace memsim::graph {

struct SwigluExpertsSpec {
  uint64_t rows = 0;        // M
  uint64_t hidden = 0;      // h
  uint64_t ffn = 0;         // F on this rank (expert_d_ff / ETP)
  uint64_t elem = 2;        // bytes per element
  uint64_t fc1_weight = 0;  // weight bytes the fc1 GEMM reads (and its dummy wgrad)
  uint64_t fc2_weight = 0;
  bool moe_act = false;     // --recompute-modules moe_act
  // TEGroupedMLP (--moe-grouped-gemm): fc1's output is TEGroupedMLP.forward's local
  // `fc1_output` (also held by the `moe_act_manager` offload interface it constructs), alive
  // until forward returns, so without grad (the first pass of --recompute-modules moe) it is
  // still allocated while fc2 runs. SequentialMLP's MLP.forward rebinds
  // `intermediate_parallel` to the SwiGLU's output, which frees fc1's output before fc2.
  // With grad the SwiGLU saves fc1's output either way: the flag changes nothing there.
  bool te_grouped = false;
};
Tensor swiglu_experts(Runtime& rt, const Tensor& permuted, const Tensor& probs, const SwigluExpertsSpec& s);

}  // namespace memsim::graph
