// torchtune's chunked cross entropy (loss.impl chunked:N; docs/losses.md): the model's
// chunked_output hands back N logits chunks (graph::DecoderModel::forward_chunked) and
// CEWithChunkedOutputLoss upcasts and cross-entropies one chunk at a time.
//
// Modelled from pytorch/torchtune torchtune/modules/loss/ce_chunked_output_loss.py at commit
// 10ff7cd2e2415a9ebb462a10cf7ed149bf531054 (CEWithChunkedOutputLoss.forward):
//   total_elements = (labels != ignore_index).sum()          bool (B, S) temporary, int64 0-d
//   labels = [c.reshape(-1) for c in labels.tensor_split(N, dim=1)]
//                                       each piece is a copy when B > 1 and N > 1 (a
//                                       non-contiguous (B, S_i) slice), a view otherwise
//   logits = [c.reshape(-1, V) for c in logits]             views (contiguous mm outputs)
//   total_loss = 0.0
//   for each chunk: total_loss += F.cross_entropy(c.float(), l, reduction="sum")
//                                       .float(): an fp32 copy unless already fp32;
//                                       log_softmax saves its fp32 result, nll_loss its
//                                       input, target and total_weight; the first `+=` is
//                                       `0.0 + t` (a new 0-d), the others add_ in place
//   return total_loss / total_elements   a 0-d fp32 quotient (DivBackward0 saves the count)
// The frame's locals die at return (the label copies; total_elements stays saved).
//
// Contract: `chunks` are the (B*S_i, V) logits chunks in the model's order (handles the
// caller keeps: the recipe's `logits` list); `rows` their row counts; `labels` the (B, S)
// int64 labels (already shifted by the data pipeline: no shift here). Returns the loss.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/ops/ops.h"

namespace memsim::graph {

// torch.tensor_split(x, n, dim) along a length `len`: the sizes of the n pieces (the first
// len % n pieces one longer).
std::vector<uint64_t> tensor_split_sizes(uint64_t len, uint64_t n);

Tensor chunked_output_cross_entropy(Runtime& rt, const std::vector<Tensor>& chunks,
                                    const Tensor& labels, uint64_t batch,
                                    const std::vector<uint64_t>& seq_pieces, uint64_t vocab);

}  // namespace memsim::graph
