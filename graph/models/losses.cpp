#include "graph/models/losses.h"

namespace memsim::graph {

Tensor cs336_cross_entropy(Runtime& rt, const Tensor& logits, const Tensor& targets,
                           uint64_t rows, uint64_t elem) {
  ModuleScope module_scope(rt, Module::loss);
  // log_softmax: shifted = x - max; shifted - log(sum(exp(shifted))). The max values
  // stay bound until log_softmax returns; log(z) is a temporary of its line.
  MaxResult mx = max_dim(rt, logits, rows, elem);
  mx.indices.reset();  // only the values are bound (the indices are saved under grad)
  Tensor shifted = sub(rt, logits, mx.values);
  Tensor e = exp(rt, shifted);
  Tensor z = sum_dim(rt, e, rows * elem);
  Tensor lz = log(rt, z);
  Tensor lsm = sub(rt, shifted, lz);
  lz.reset();
  z.reset();
  e.reset();
  shifted.reset();
  mx.values.reset();
  Tensor nl = neg(rt, lsm);
  lsm.reset();
  Tensor picked = gather(rt, nl, targets, rows * elem);
  nl.reset();
  Tensor loss = mean_all(rt, picked, elem);
  picked.reset();
  return loss;
}

Tensor torch_cross_entropy(Runtime& rt, const Tensor& logits, const Tensor& targets,
                           uint64_t elem) {
  ModuleScope module_scope(rt, Module::loss);
  Tensor logp = log_softmax(rt, logits);
  Tensor loss = nll_loss(rt, logp, targets, elem);
  return loss;
}

}  // namespace memsim::graph
