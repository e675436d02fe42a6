#include "sim/step/peak_sink.h"

namespace memsim {

PeakSink::PeakSink(const AllocatorConfig& config, DeviceMemory& device, const char* reset_peaks_at_mark,
                   std::vector<BlockId>* block_of, std::vector<uint64_t>* rounded_of)
    : executor_(config, device, reset_peaks_at_mark, nullptr, 0, block_of, rounded_of) {}

bool PeakSink::consume(const Program& program, const MemoryEvent* events, size_t n, size_t first) {
  if (oom_) return false;
  for (size_t i = 0; i < n; ++i) {
    if (!executor_.step(program, events[i], first + i)) {
      oom_ = true;
      return false;
    }
  }
  return true;
}

}  // namespace memsim
