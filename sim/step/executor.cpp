#include "sim/step/executor.h"

#include <algorithm>

namespace memsim {

Executor::Executor(const AllocatorConfig& config, DeviceMemory& device,
                   const char* reset_peaks_at_mark, ExecuteTraceObserver* trace_observer,
                   size_t tensors, std::vector<BlockId>* block_of,
                   std::vector<uint64_t>* rounded_of)
    : allocator_(config, device),
      tagger_(trace_observer),
      reset_name_(reset_peaks_at_mark),
      block_of_(block_of != nullptr ? block_of : &own_block_of_),
      rounded_of_(rounded_of != nullptr ? rounded_of : &own_rounded_of_) {
  if (trace_observer != nullptr) allocator_.set_trace_observer(&tagger_);
  block_of_->assign(tensors, kNoBlock);
  rounded_of_->assign(tensors, 0);
}

void Executor::grow(uint32_t tensor) {
  // A streamed Program's ids arrive in order: grow by a page's worth of ids past the one
  // asked for (capacity grows geometrically), so that this runs once per 1024 tensors
  // instead of once per tensor, and at most a few KiB past the last id are touched. The
  // new entries are "no block", as for an id never allocated.
  const size_t size = static_cast<size_t>(tensor) + kGrowIds;
  block_of_->resize(size, kNoBlock);
  rounded_of_->resize(size, 0);
}

}  // namespace memsim
