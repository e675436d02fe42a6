// Scratch memory of ATen's CUDA reduction kernels (aten/src/ATen/native/cuda/Reduce.cuh,
// setReduceConfig): a reduction whose per-output work is split across thread blocks
// stages partial results in global memory and counts finished blocks with semaphores,
// both allocated through the caching allocator for the duration of the kernel.
//
// Modelled cases:
//  - outer_reduce_scratch: summing a contiguous (rows, cols) tensor over its leading dim to
//    (cols,) (sum_to of a broadcast weight grad, e.g. RMSNorm's gamma). Checked against the
//    snapshots: medium (1024 rows x 1024) -> 8,388,608 + 32 B; xl (2048 x 2560) ->
//    41,943,040 + 80 B; 512 rows -> none.
//  - full_reduce_scratch: a contiguous tensor reduced to one value with a 4-byte
//    accumulator (torch.linalg.vector_norm(g, dtype=float32) of a gradient, FSDP1's
//    clip_grad_norm_: sim/step/fsdp1_clip_grad.h). Read from setReduceConfig (the
//    reduced dim is the fastest-moving one: block.x splits the input, vectorised 4 wide;
//    block.y splits it again when each thread keeps >= 16 values; CTAs split it when each
//    keeps >= 256 and one output row leaves the grid under num_mp x blocks_per_sm). Not
//    checked against a GPU trace (no GPU run has such a reduction yet).
#pragma once

#include <cstdint>

namespace memsim::graph {

struct ReduceScratch {
  uint64_t global_bytes = 0;     // 0: no global-memory reduction
  uint64_t semaphore_bytes = 0;
};

// `sm_count` only matters for very wide outputs; the default is an H100's.
ReduceScratch outer_reduce_scratch(uint64_t rows, uint64_t cols, uint64_t elem,
                                   int sm_count = 132);
// `numel` elements (< 2^31: 32-bit indexing) reduced to one 4-byte accumulator value.
ReduceScratch full_reduce_scratch(uint64_t numel, int sm_count = 132);

}  // namespace memsim::graph
