// The loss statement of a training loop that computes its own loss (cs336; hf-* with
// loss.impl torch / torch-float): which loss function the script
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

// loss.impl torch / torch-float on an hf-* model's logits (docs/losses.md): the script
// calls the model without labels and computes F.cross_entropy(logits.view(-1, V),
// labels.view(-1)) itself (labels already shifted: no HF shift or padding), on
// `logits.float()` for torch-float (a copy unless the logits are fp32 already, as after
// the v4.45 Llama head's own upcast). Low-precision logits inside the autocast region go
// through CUDA autocast's cross_entropy (graph::torch_cross_entropy_autocast).
graph::Tensor logits_script_loss(graph::Runtime& rt, graph::Autocast* autocast,
                                 const graph::Tensor& logits, const graph::Tensor& targets,
                                 uint64_t rows, uint64_t vocab, bool float_first);

}  // namespace memsim
