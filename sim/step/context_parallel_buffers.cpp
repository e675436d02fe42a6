#include "sim/step/context_parallel_buffers.h"

namespace memsim {

using graph::OpKind;
using graph::Tensor;

void ContextParallelBuffers::enter(graph::Runtime& rt, int buffers) {
  const uint64_t local = batch_ * (seq_ / degree_) * 8;
  {
    // load_balancer._generate_indices(): (1, S) int64
    Tensor indices = rt.alloc(seq_ * 8, TensorKind::temporary, OpKind::other);
    for (int b = 0; b < buffers; ++b) {
      for (uint64_t row = 0; row < batch_; ++row)  // buffer[i] = index_select(buffer[i], ...)
        Tensor picked = rt.alloc(seq_ * 8, TensorKind::temporary, OpKind::other);
      if (batch_ > 1) {  // _split_tensor(contiguous=True): every chunk copied, chunk r kept
        std::vector<Tensor> chunks;
        for (uint64_t c = 0; c < degree_; ++c)
          chunks.push_back(rt.alloc(local, TensorKind::input, OpKind::clone));
        shards_.push_back(chunks[rank_]);
      }
    }
  }
  for (int b = 0; b < buffers; ++b) {  // shard = shard.clone(); buffer.resize_; copy_
    Tensor clone = rt.alloc(local, TensorKind::input, OpKind::clone);
    shard_ = std::move(clone);
  }
}

void ContextParallelBuffers::exit() {
  shards_.clear();
  shard_.reset();
}

}  // namespace memsim
