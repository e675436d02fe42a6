#include "sim/step/execute.h"

#include <cstring>

namespace memsim {

namespace {

// Forwards the allocator's trace entries with the index of the event being executed.
class EventTagger : public TraceObserver {
 public:
  explicit EventTagger(ExecuteTraceObserver* target) : target_(target) {}
  void on_trace(const TraceEntry& entry) override { target_->on_trace(event, entry); }
  size_t event = 0;

 private:
  ExecuteTraceObserver* target_;
};

}  // namespace

Timeline execute(const Program& program, const AllocatorConfig& config, DeviceMemory& device,
                 const ExecuteOptions& options) {
  CachingAllocator allocator(config, device);
  EventTagger tagger(options.trace_observer);
  if (options.trace_observer != nullptr) allocator.set_trace_observer(&tagger);
  Timeline timeline;
  std::vector<BlockId> own_block_of;
  std::vector<uint64_t> own_rounded_of;
  if (options.buffers != nullptr) {
    timeline = std::move(options.buffers->timeline);
    timeline.allocated.clear();
    timeline.reserved.clear();
    timeline.requested.clear();
    timeline.by_kind.clear();
    timeline.oom.reset();
    timeline.final_stats = MemoryStats{};
  }
  const size_t n = program.events.size();
  timeline.allocated.reserve(n);
  timeline.reserved.reserve(n);
  timeline.requested.reserve(n);
  if (options.record_by_kind) timeline.by_kind.reserve(n);

  // Tensor id -> allocator block, and the rounded size each tensor really occupies.
  std::vector<BlockId>& block_of =
      options.buffers != nullptr ? options.buffers->block_of : own_block_of;
  std::vector<uint64_t>& rounded_of =
      options.buffers != nullptr ? options.buffers->rounded_of : own_rounded_of;
  block_of.assign(program.tensors.size(), kNoBlock);
  rounded_of.assign(program.tensors.size(), 0);
  std::array<uint64_t, kTensorKindCount> by_kind{};
  uint32_t reset_mark = UINT32_MAX;
  if (options.reset_peaks_at_mark != nullptr) {
    for (const MemoryEvent& e : program.events) {
      if (e.type == EventType::mark &&
          std::strcmp(program.str(static_cast<uint32_t>(e.bytes)).c_str(),
                      options.reset_peaks_at_mark) == 0) {
        reset_mark = static_cast<uint32_t>(e.bytes);
        break;
      }
    }
  }

  const MemoryStats& stats = allocator.stats();
  for (size_t i = 0; i < n; ++i) {
    const MemoryEvent& e = program.events[i];
    tagger.event = i;
    switch (e.type) {
      case EventType::alloc: {
        if (e.bytes == 0) break;  // PyTorch never calls the allocator for empty tensors
        AllocResult r = allocator.malloc(e.bytes, e.stream);
        if (!r.ok()) {
          timeline.oom = OomPoint{i, std::move(*r.oom)};
          timeline.final_stats = stats;
          if (options.final_segments != nullptr) *options.final_segments = allocator.segments();
          return timeline;
        }
        block_of[e.tensor] = r.block;
        rounded_of[e.tensor] = r.size;
        by_kind[static_cast<int>(e.kind)] += r.size;
        break;
      }
      case EventType::free: {
        BlockId b = block_of[e.tensor];
        if (b == kNoBlock) break;  // zero-byte tensor
        allocator.free(b);
        block_of[e.tensor] = kNoBlock;
        by_kind[static_cast<int>(e.kind)] -= rounded_of[e.tensor];
        break;
      }
      case EventType::mark:
        if (static_cast<uint32_t>(e.bytes) == reset_mark) allocator.reset_peak_stats();
        break;
      case EventType::empty_cache:
        allocator.empty_cache();
        break;
    }
    timeline.allocated.push_back(static_cast<uint64_t>(stats.allocated_bytes.all.current));
    timeline.reserved.push_back(static_cast<uint64_t>(stats.reserved_bytes.all.current));
    timeline.requested.push_back(static_cast<uint64_t>(stats.requested_bytes.all.current));
    if (options.record_by_kind) timeline.by_kind.push_back(by_kind);
  }
  timeline.final_stats = stats;
  if (options.final_segments != nullptr) *options.final_segments = allocator.segments();
  return timeline;
}

}  // namespace memsim
