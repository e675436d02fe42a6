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
  // One id past the end at a time (capacity grows geometrically): a streamed Program's
  // ids arrive in order, and pages past the last id are never touched.
  block_of_->resize(static_cast<size_t>(tensor) + 1, kNoBlock);
  rounded_of_->resize(static_cast<size_t>(tensor) + 1, 0);
}

}  // namespace memsim
