// Pieces both DeepSeek routers run (decoder_moe_deepseek.cpp: DeepseekV3TopkRouter,
// decoder_moe_deepseek_v2.cpp: DeepseekV2TopkRouter, transformers 5.17.0). Internal to
// those two files.
#pragma once

#include <cstdint>

#include "graph/ops/ops_nn.h"
#include "graph/runtime.h"

namespace memsim::graph {

// A tensor whose Python name dies with nothing else holding its autograd node: the node's
// saved tensors go with it.
inline void drop_with_node(Runtime& rt, Tensor& t) {
  if (t.grad_fn >= 0) rt.release_saved(rt.node(t.grad_fn));
  t.reset();
}

// router_logits = F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32)):
// the (T, E) fp32 logits. `.type` is the tensor itself in an fp32 model; otherwise two fp32
// copies (x: T x D, the weight: E x D), saved by the mm, dying with the expression.
inline Tensor deepseek_router_logits(Runtime& rt, const Tensor& x, const Tensor& weight, uint64_t T,
                                     uint64_t D, uint64_t E, uint64_t elem) {
  const double flops = 2.0 * static_cast<double>(T) * static_cast<double>(D) * static_cast<double>(E);
  if (elem == 4) return mm_linear(rt, x, weight, T * E * 4, flops);
  Tensor x32 = to_copy(rt, x, T * D * 4);
  Tensor w32 = to_copy(rt, weight, E * D * 4);
  return mm_linear(rt, x32, w32, T * E * 4, flops);
}

}  // namespace memsim::graph
