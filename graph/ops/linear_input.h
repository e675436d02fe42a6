// LinearInput: what a linear layer's input x is, which decides the layout of x's gradient
// and so whether autograd's InputBuffer can add a second gradient for x in place
// (docs/input-buffer.md; torch/csrc/autograd/input_buffer.cpp `accumulate` and
// `can_accumulate_inplace`, pytorch/pytorch 4537ef6c, unchanged in 2.x since).
//
//  - folded: an N-D activation, (B, S, D), that the linear flattens to 2-D itself
//    (at::native::linear: matmul's fold without a bias, _flatten_nd_linear with one;
//    GPT-2's Conv1D: addmm on x.view(-1, D)). x's grad is the reshape of the mm result: a
//    view whose base shares the storage, which InputBuffer never adds into in place.
//  - flat: a 2-D tensor of its own (the MoE blocks' hidden_states.view(-1, D), read by the
//    router, the shared expert and its gate): x's grad is the mm result itself, dense and
//    held by nobody else, so later grads for x are added into it in place.
#pragma once

#include <cstdint>

namespace memsim::graph {

enum class LinearInput : uint8_t { folded, flat };

}  // namespace memsim::graph
