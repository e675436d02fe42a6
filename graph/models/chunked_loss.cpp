#include "graph/models/chunked_loss.h"

#include "graph/models/losses.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

std::vector<uint64_t> tensor_split_sizes(uint64_t len, uint64_t n) {
  std::vector<uint64_t> sizes(n, len / n);
  for (uint64_t i = 0; i < len % n; ++i) ++sizes[i];
  return sizes;
}

Tensor chunked_output_cross_entropy(Runtime& rt, const std::vector<Tensor>& chunks,
                                    const Tensor& labels, uint64_t batch,
                                    const std::vector<uint64_t>& seq_pieces, uint64_t vocab) {
  ModuleScope module_scope(rt, Module::loss);
  uint64_t seq = 0;
  for (uint64_t p : seq_pieces) seq += p;
  // total_elements = (labels != ignore_index).sum(): the bool mask dies after the sum.
  Tensor total_elements;
  {
    Tensor mask = new_tensor(rt, batch * seq, OpKind::compare, TensorKind::temporary);
    total_elements = new_tensor(rt, 8, OpKind::sum_dim, TensorKind::temporary);
  }
  // The label pieces: copies of the non-contiguous (B, S_i) slices when B > 1.
  const bool copies = batch > 1 && seq_pieces.size() > 1;
  std::vector<Tensor> label_pieces;
  label_pieces.reserve(seq_pieces.size());
  for (uint64_t p : seq_pieces)
    label_pieces.push_back(copies ? new_tensor(rt, batch * p * 8, OpKind::clone, TensorKind::temporary)
                                  : rt.view_of(labels, batch * p * 8));
  Tensor total_loss;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Tensor& c = chunks[i];
    const uint64_t rows = batch * seq_pieces[i];
    const uint64_t elem = c.bytes / (rows * vocab);
    Tensor ce;
    {
      // F.cross_entropy(logits.float(), labels, reduction="sum"): the fp32 argument lives
      // until the call returns (log_softmax's result is saved, the copy is not).
      Tensor xf = elem == 4 ? c : to_copy(rt, c, rows * vocab * 4);
      ce = torch_cross_entropy(rt, xf, label_pieces[i], 4);
    }
    if (i == 0) {
      total_loss = add_scalar(rt, ce);  // 0.0 + ce
    } else {
      total_loss = add_(rt, total_loss, ce);  // total_loss += ce (Tensor.__iadd__)
    }
  }
  // total_loss / total_elements: the quotient is a 0-d fp32 (the int64 count is 0-d too;
  // its 8 bytes do not size the result), DivBackward0 saves the count.
  Tensor count = rt.view_of(total_elements, total_loss.bytes);
  Tensor loss = div(rt, total_loss, count);
  count.reset();
  // The frame's locals die at return: total_elements (saved), labels (the pieces),
  // logits (the caller's), total_loss.
  total_elements.reset();
  label_pieces.clear();
  total_loss.reset();
  return loss;
}

}  // namespace memsim::graph
