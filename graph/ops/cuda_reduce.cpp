#include "graph/ops/cuda_reduce.h"

#include <algorithm>

namespace memsim::graph {
namespace {
uint64_t last_pow2(uint64_t n) {
  uint64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
uint64_t div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
}  // namespace

ReduceScratch outer_reduce_scratch(uint64_t rows, uint64_t cols, uint64_t elem, int sm_count) {
  ReduceScratch r;
  if (rows <= 1 || cols == 0) return r;
  // The reduced dim is not the fastest-moving one: block.x maps outputs, vectorised
  // "along output" by up to 16 bytes.
  uint64_t vec = 16 / elem;
  while (vec > 1 && cols % vec != 0) vec /= 2;
  const uint64_t max_threads = 512 / vec;  // max_reduce_threads / output_vec_size
  const uint64_t dim0 = cols / vec, dim1 = rows;
  const uint64_t d0 = dim0 < max_threads ? last_pow2(dim0) : max_threads;
  const uint64_t d1 = dim1 < max_threads ? last_pow2(dim1) : max_threads;
  uint64_t bw = std::min<uint64_t>(d0, 32);
  const uint64_t bh = std::min<uint64_t>(d1, max_threads / bw);
  bw = std::min<uint64_t>(d0, max_threads / bh);
  const uint64_t threads = bw * bh;
  // Outputs are split across the warp's lanes; inputs across warps when each thread
  // keeps at least 16 values.
  uint64_t values_per_thread = rows;
  if (!(values_per_thread >= bh * 16 || values_per_thread >= 256)) return r;
  values_per_thread = div_up(rows, bh);
  const uint64_t grid_x = div_up(dim0, bw);
  const uint64_t target_grid = static_cast<uint64_t>(sm_count) * (2048 / threads);
  if (values_per_thread < 256 || grid_x > target_grid) return r;
  const uint64_t ctas = std::max(std::min(div_up(target_grid, grid_x), div_up(values_per_thread, 16)),
                                 div_up(values_per_thread, 256));
  if (ctas <= 1) return r;
  r.global_bytes = elem * cols * ctas * bw * vec;
  r.semaphore_bytes = 4 * grid_x;
  return r;
}

ReduceScratch full_reduce_scratch(uint64_t numel, int sm_count) {
  ReduceScratch r;
  if (numel <= 1) return r;
  // The reduced dim is the fastest-moving one (one output): dim0 = numel, dim1 = 1;
  // "vectorize along input" divides dim0 by input_vec_size (4) from 128 elements on.
  const uint64_t dim0 = numel >= 128 ? numel / 4 : numel;
  const uint64_t max_threads = 512;
  const uint64_t d0 = dim0 < max_threads ? last_pow2(dim0) : max_threads;
  // dim1 = 1: block_height 1, block_width = d0 (the second min of set_block_dimension).
  const uint64_t bw = d0, bh = 1;
  const uint64_t threads = bw * bh;
  // input_mult[0] = split_input(block_width): step_input = bw; values_per_thread counts
  // the config's num_inputs (numel), not the vectors.
  uint64_t step = bw;
  const uint64_t values_per_thread = div_up(numel, step);
  if (values_per_thread < std::min<uint64_t>(bh * 16, 256)) return r;  // no block_y split
  step *= bh;  // split_input(block_height): block_y_reduce
  const uint64_t vpt = div_up(numel, step);
  const uint64_t grid_x = 1;  // one output
  const uint64_t target_grid = static_cast<uint64_t>(sm_count) * (2048 / threads);
  if (vpt < 256 || grid_x > target_grid) return r;
  const uint64_t ctas = std::max(std::min(div_up(target_grid, grid_x), div_up(vpt, 16)), div_up(vpt, 256));
  if (ctas <= 1) return r;
  // global_memory_size: element_size_bytes x num_outputs x ctas (block_x_reduce: no
  // block().x factor); semaphore_size: sizeof(int) x grid().x.
  r.global_bytes = 4 * 1 * ctas;
  r.semaphore_bytes = 4 * grid_x;
  return r;
}

}  // namespace memsim::graph
