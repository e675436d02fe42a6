// Loss functions as op sequences (cs336-model.md §6).
#pragma once

#include "graph/ops/ops.h"

namespace memsim::graph {

// cs336_basics.nn_utils.cross_entropy(logits, targets), staff version: a hand-written
// log-softmax, neg, gather (which saves the whole negated tensor), mean. rows = B*S.
Tensor cs336_cross_entropy(Runtime& rt, const Tensor& logits, const Tensor& targets,
                           uint64_t rows, uint64_t elem);

// F.cross_entropy(logits.view(-1, V), targets.view(-1)): _log_softmax + nll_loss.
Tensor torch_cross_entropy(Runtime& rt, const Tensor& logits, const Tensor& targets,
                           uint64_t elem);

}  // namespace memsim::graph
