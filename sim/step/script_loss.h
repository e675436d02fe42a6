// The loss statement of a cs336-family training loop: which loss function the script
// calls (TrainingScript::loss, from the scenario's loss.impl) on which logits positions
// (loss.positions), inside or outside the autocast region.
//
// Contract: returns the loss tensor (the script's `loss` name); everything else the
// statement made is dropped or saved as PyTorch would. `positions: last` is
// `logits[:, -1, :]` (graph::last_position) with targets of shape (B,); `all` passes
// the (B, S, V) logits. logits_elem is the logits' element size (2 when the model ran
// under autocast). Not for numeric mode (refused by scenario/script_keys.h's checks).
#pragma once

#include "graph/autocast.h"
#include "graph/models/cs336.h"
#include "scenario/scenario.h"
#include "sim/step/training_script.h"

namespace memsim {

graph::Tensor cs336_script_loss(graph::Runtime& rt, graph::Autocast* autocast,
                                const graph::Tensor& logits, const graph::Tensor& targets,
                                const graph::Cs336Shape& shape, uint64_t logits_elem,
                                LossImpl impl, LossPositions positions);

}  // namespace memsim
