#include "graph/models/script_losses.h"

#include "graph/ops/ops_nn.h"

namespace memsim::graph {

Tensor last_position(Runtime& rt, const Tensor& logits, uint64_t last_bytes) {
  Tensor all_rows = slice_seq(rt, logits, logits.bytes);       // [:, ...]
  Tensor selected = select_dim(rt, all_rows, last_bytes);      // [:, -1, ...]
  all_rows.reset();
  return slice_seq(rt, selected, last_bytes);                   // [:, -1, :]
}

Tensor one_hot_cross_entropy(Runtime& rt, Autocast* ac, const Tensor& x, uint64_t rows,
                             uint64_t elem) {
  ModuleScope module_scope(rt, Module::loss);
  const bool low = ac != nullptr && ac->active() && elem != 4;
  const uint64_t f32 = x.bytes / elem * 4;
  MaxResult mx = max_dim(rt, x, rows, elem);  // max_value, _ (both locals)
  Tensor shifted = sub(rt, x, mx.values);     // the outer `x - max_value`
  Tensor e;
  {
    Tensor inner = sub(rt, x, mx.values);     // the one inside exp(...)
    if (low) {
      Tensor inner32 = ac->to_fp32(inner, f32);  // exp is on autocast's fp32 list
      e = exp(rt, inner32);
    } else {
      e = exp(rt, inner);
    }
  }
  Tensor z = sum_dim(rt, e, rows * (low ? 4 : elem));
  e.reset();
  Tensor lz = log(rt, z);
  z.reset();
  Tensor lsm;
  if (low) {
    lsm = sub(rt, ac->widen(shifted), lz);  // low - fp32 promotes to fp32
    Autocast::promoted(rt, lsm, 0, shifted);
  } else {
    lsm = sub(rt, shifted, lz);
  }
  shifted.reset();
  lz.reset();
  // zeros_like + scatter_ in place: a new tensor that needs no grad (op "other": the
  // `fill` kind is named ones_like, the engine's root grad).
  Tensor one_hot = new_tensor(rt, lsm.bytes, OpKind::other);
  const uint64_t out_elem = low ? 4 : elem;
  Tensor prod = mul(rt, one_hot, lsm);
  Tensor total = sum_dim(rt, prod, out_elem);
  prod.reset();
  Tensor negated = neg(rt, total);
  total.reset();
  Tensor loss = div_scalar(rt, negated);
  negated.reset();
  // The frame's locals die at return in the order they were first bound: max_value, _,
  // log_softmax_x, target_one_hot (each only if nothing saved it).
  mx.values.reset();
  mx.indices.reset();
  lsm.reset();
  one_hot.reset();
  return loss;
}

}  // namespace memsim::graph
