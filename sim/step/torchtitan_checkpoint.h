// torchtitan's activation checkpointing recipes (checkpoint.policy sac-op and sac-layer:N)
// as data for the checkpoint engine (graph/checkpoint.h), and what memsim models of them.
//
// Source: pytorch/torchtitan at commit cfb93265 (2026-02-26),
// torchtitan/distributed/activation_checkpoint.py (_apply_op_sac, _apply_layer_sac,
// _apply_full_ac) and torchtitan/models/llama3/parallelize.py (_op_sac_save_list); the
// SAC machinery is torch.utils.checkpoint's create_selective_checkpoint_contexts.
// docs/torchtitan-recipes.md has the rules, the evidence and the limits.
//
//  - sac-op: every transformer block wrapped by ptd_checkpoint_wrapper (non-reentrant)
//    with context_fn = create_selective_checkpoint_contexts(policy). The policy saves
//    (MUST_SAVE) the outputs of the ops in _op_sac_save_list, except that aten.mm is saved
//    on the block's 1st, 3rd, 5th... mm only (`meta["forward_mm_count"] % 2 == 0` ->
//    PREFER_RECOMPUTE); everything else is recomputed. Of that list memsim's decoders
//    emit aten.mm (bias-free nn.Linear: graph::mm_linear) and the SDPA flash and
//    mem-efficient kernels; the rest (cuDNN / math / overrideable SDPA, reduce_scatter
//    (TP), aten.max (float8 amax), flex and varlen attention, inductor code) never occur
//    in a step memsim models, and bias linears are aten.addmm (not in the list).
//  - sac-layer:N: `_layer_sac_count += 1` per block in model order, checkpointed when
//    `_layer_sac_count % N == 0`: 0-based layers N-1, 2N-1, ... (a module global, counted
//    from the first block of the process's first model).
//  - Both pass early_stop=ac_config.early_stop, false by default (the re-run goes to the
//    end of the block); checkpoint.early_stop overrides it.
#pragma once

#include <cstdint>

#include "graph/checkpoint.h"
#include "scenario/scenario.h"

namespace memsim {

// torchtitan's op-SAC policy (llama3 _op_sac_save_list + the every-other-mm rule).
graph::SelectivePolicy torchtitan_op_sac_policy();
// Whether torchtitan's layer SAC with frequency n checkpoints 0-based layer l.
inline bool torchtitan_layer_sac_checkpoints(int64_t layer, int64_t n) {
  return n <= 0 || (layer + 1) % n == 0;
}
// Throws ScenarioError naming the key for a torchtitan recipe memsim does not model
// (called by require_modelled).
void require_torchtitan_modelled(const Scenario& s);

}  // namespace memsim
