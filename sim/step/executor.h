// Executor: Program events, one at a time, through the caching-allocator emulator.
//
// The loop body of execute() (sim/step/execute.h), taken out so that the same code runs
// a stored Program (execute) and a Program streamed chunk by chunk while it is being
// built (sim/analysis/stream_run.h, issue #20): the two can then not drift apart.
//
// Contract:
//  - step() applies one event: alloc (zero-byte ones skipped, as PyTorch never calls
//    the allocator for them), free, mark (the first mark named `reset_peaks_at_mark`, and
//    every later mark with that name, resets the allocator's peak statistics), or
//    empty_cache. It returns false when an alloc cannot be served; oom() then holds the
//    failure and no further event may be stepped.
//  - Tensor ids may grow while stepping (a streamed Program's table grows as it is built):
//    the per-tensor arrays grow on demand.
//  - by_kind(): the rounded bytes allocated per TensorKind after the last event.
//  - No per-event allocation beyond that growth, no logging.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "allocator/caching_allocator.h"
#include "program/program.h"

namespace memsim {

struct OomPoint {
  size_t event_index = 0;  // index into Program::events of the failing alloc
  OutOfMemory details;
};

// Receives the allocator's trace entries during execution, each tagged with the index of
// the Program event that caused it (reports such as --snapshot and --trace need to place
// allocator actions on the Program's timeline; a plain TraceObserver cannot know it).
class ExecuteTraceObserver {
 public:
  virtual ~ExecuteTraceObserver() = default;
  virtual void on_trace(size_t event_index, const TraceEntry& entry) = 0;
};

class Executor {
 public:
  // `block_of` / `rounded_of`: per-tensor storage to use (e.g. kept from an earlier run;
  // contents discarded), or null for the Executor's own. `tensors`: expected tensor count.
  Executor(const AllocatorConfig& config, DeviceMemory& device, const char* reset_peaks_at_mark,
           ExecuteTraceObserver* trace_observer, size_t tensors,
           std::vector<BlockId>* block_of = nullptr, std::vector<uint64_t>* rounded_of = nullptr);
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  bool step(const Program& program, const MemoryEvent& e, size_t index) {
    tagger_.event = index;
    switch (e.type) {
      case EventType::alloc: {
        if (e.bytes == 0) break;  // PyTorch never calls the allocator for empty tensors
        AllocResult r = allocator_.malloc(e.bytes, e.stream);
        if (!r.ok()) {
          oom_ = OomPoint{index, std::move(*r.oom)};
          return false;
        }
        if (e.tensor >= block_of_->size()) grow(e.tensor);
        (*block_of_)[e.tensor] = r.block;
        (*rounded_of_)[e.tensor] = r.size;
        by_kind_[static_cast<int>(e.kind)] += r.size;
        break;
      }
      case EventType::free: {
        if (e.tensor >= block_of_->size()) break;  // never allocated (zero bytes)
        BlockId b = (*block_of_)[e.tensor];
        if (b == kNoBlock) break;  // zero-byte tensor
        allocator_.free(b);
        (*block_of_)[e.tensor] = kNoBlock;
        by_kind_[static_cast<int>(e.kind)] -= (*rounded_of_)[e.tensor];
        break;
      }
      case EventType::mark:
        if (is_reset_mark(program, static_cast<uint32_t>(e.bytes))) allocator_.reset_peak_stats();
        break;
      case EventType::empty_cache:
        allocator_.empty_cache();
        break;
    }
    return true;
  }

  const MemoryStats& stats() const { return allocator_.stats(); }
  const std::array<uint64_t, kTensorKindCount>& by_kind() const { return by_kind_; }
  std::optional<OomPoint>& oom() { return oom_; }
  CachingAllocator& allocator() { return allocator_; }

 private:
  // Forwards the allocator's trace entries with the index of the event being executed.
  class EventTagger : public TraceObserver {
   public:
    explicit EventTagger(ExecuteTraceObserver* target) : target_(target) {}
    void on_trace(const TraceEntry& entry) override { target_->on_trace(event, entry); }
    size_t event = 0;

   private:
    ExecuteTraceObserver* target_;
  };

  // The reset mark's string index is learnt at its first occurrence (a streamed Program
  // interns it only when it is emitted); other marks are compared by name until then.
  bool is_reset_mark(const Program& program, uint32_t name) {
    if (reset_index_ != UINT32_MAX) return name == reset_index_;
    if (reset_name_ == nullptr || std::strcmp(program.str(name).c_str(), reset_name_) != 0)
      return false;
    reset_index_ = name;
    return true;
  }
  static constexpr size_t kGrowIds = 1024;
  void grow(uint32_t tensor);

  CachingAllocator allocator_;
  EventTagger tagger_;
  const char* reset_name_;
  uint32_t reset_index_ = UINT32_MAX;
  std::vector<BlockId> own_block_of_;
  std::vector<uint64_t> own_rounded_of_;
  std::vector<BlockId>* block_of_;
  std::vector<uint64_t>* rounded_of_;
  std::array<uint64_t, kTensorKindCount> by_kind_{};
  std::optional<OomPoint> oom_;
};

}  // namespace memsim
