// The `with context_parallel(cp_mesh, buffers=[inputs, labels], buffer_seq_dims=[1, 1],
// no_restore_buffers={inputs, labels})` block around one micro-batch's forward and backward
// (torchtitan train.py forward_backward_step through create_context_parallel_ctx,
// torchtitan/distributed/utils.py; torch/distributed/tensor/experimental/_context_parallel/
// _attention.py context_parallel and _context_parallel_buffers, stored snapshot 09b101c5).
//
// Contract (one rank r of N; B rows of S tokens, int64; each buffer's storage keeps its
// full B*S*8 bytes, since resize_ to the shard's shape never shrinks a storage):
//  - enter(): the head-tail load balancer's index (1, S) int64 on the device, alive while
//    the buffers are sharded; per buffer and row, index_select's S*8 result, copied back
//    into the row and freed; distribute_tensor(..., [Shard(1)], src_data_rank=None)
//    .to_local(): with B > 1 every chunk of torch.chunk along the sequence is made
//    contiguous (N copies of B*S/N*8), chunk r kept in the generator's `shards` list, the
//    others freed (with B = 1 the chunks are views: nothing); then the index dies. Per
//    buffer `shard.clone()` (B*S/N*8), copied into the resized buffer; the name `shard`
//    keeps the last clone.
//  - exit() (the block ends after backward): `shards` and `shard` die with the generator.
// No buffer is restored (both are in no_restore_buffers), so nothing is cloned up front.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/runtime.h"

namespace memsim {

class ContextParallelBuffers {
 public:
  ContextParallelBuffers(uint64_t batch, uint64_t seq, uint64_t degree, uint64_t rank)
      : batch_(batch), seq_(seq), degree_(degree), rank_(rank) {}
  // `buffers`: how many CP buffers the step shards (inputs, and labels when on the device).
  void enter(graph::Runtime& rt, int buffers);
  void exit();

 private:
  uint64_t batch_, seq_, degree_, rank_;
  std::vector<graph::Tensor> shards_;  // the generator's `shards` (B > 1: the copies)
  graph::Tensor shard_;                // its `shard` name: the last clone
};

}  // namespace memsim
