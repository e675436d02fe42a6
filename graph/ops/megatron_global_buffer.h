// Megatron-Core's GlobalMemoryBuffer "mpu" entry (get_global_memory_buffer().get_tensor(
// shape, dtype, "mpu")) as memory events, shared by the model's forward uses
// (graph/models/megatron.cpp: sequence-parallel all-gathers, the baddbmm input, the MoE
// allgather dispatcher) and the one backward that writes into it (the MoE dispatcher's
// hidden-state gather, graph/ops/ops_megatron_moe.cpp).
//
// Modelled from NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553,
// megatron/core/utils.py GlobalMemoryBuffer.get_tensor: the dict entry is replaced by a new
// torch.empty(required_len) when it is missing or has fewer elements than asked for (the
// old tensor dies once nothing else views it), otherwise a view of its first elements is
// returned. The buffer only grows, and every request of a training step repeats the first
// layer's sizes, so after the first forward no request allocates.
//
// Contract: `slot` is the process's one buffer (the model's, or the pipeline's shared one)
// and outlives every autograd node that refers to it. Sizes are bytes (one dtype: the
// model's).
#pragma once

#include <cstdint>

#include "graph/runtime.h"

namespace memsim::graph {

// get_tensor(bytes): grows `slot` if it holds fewer than `bytes` (a new storage outside any
// layer, named "mpu global memory buffer") and returns a view of `bytes` of it.
Tensor global_buffer_get(Runtime& rt, Tensor& slot, uint64_t bytes);

}  // namespace memsim::graph
