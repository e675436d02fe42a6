// PeakSink: an EventSink (program/event_sink.h) that runs a Program's events through the
// caching-allocator emulator as they are emitted and keeps only the allocator's
// statistics: for choosing among Programs (the pipeline's stages) by their peak without
// storing any of them.
//
// Contract:
//  - Each event goes through an Executor (sim/step/executor.h), the loop body of
//    execute(): with the same config, device and reset mark, stats() at the end equal
//    execute(...).final_stats of the finished Program (peaks reset at the mark).
//  - At the first alloc the allocator cannot serve, consume() returns false and nothing
//    more is executed; stats() are those at the failure, as execute() leaves them, and
//    out_of_memory() is true.
//  - Memory: the Executor's per-tensor tables; nothing per event.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/caching_allocator.h"
#include "program/event_sink.h"
#include "sim/step/executor.h"

namespace memsim {

class PeakSink final : public EventSink {
 public:
  // block_of / rounded_of: the Executor's per-tensor tables to reuse (contents
  // discarded), or null for its own.
  PeakSink(const AllocatorConfig& config, DeviceMemory& device,
           const char* reset_peaks_at_mark = "measured_step_begin",
           std::vector<BlockId>* block_of = nullptr, std::vector<uint64_t>* rounded_of = nullptr);
  bool consume(const Program& program, const MemoryEvent* events, size_t n, size_t first) override;
  const MemoryStats& stats() const { return executor_.stats(); }
  bool out_of_memory() const { return oom_; }

 private:
  Executor executor_;
  bool oom_ = false;
};

}  // namespace memsim
