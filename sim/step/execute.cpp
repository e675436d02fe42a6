#include "sim/step/execute.h"

namespace memsim {

Timeline execute(const Program& program, const AllocatorConfig& config, DeviceMemory& device,
                 const ExecuteOptions& options) {
  Timeline timeline;
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
  Executor executor(config, device, options.reset_peaks_at_mark, options.trace_observer,
                    program.tensors.size(),
                    options.buffers != nullptr ? &options.buffers->block_of : nullptr,
                    options.buffers != nullptr ? &options.buffers->rounded_of : nullptr);
  const MemoryStats& stats = executor.stats();
  for (size_t i = 0; i < n; ++i) {
    if (!executor.step(program, program.events[i], i)) {
      timeline.oom = std::move(executor.oom());
      timeline.final_stats = stats;
      if (options.final_segments != nullptr) *options.final_segments = executor.allocator().segments();
      return timeline;
    }
    timeline.allocated.push_back(static_cast<uint64_t>(stats.allocated_bytes.all.current));
    timeline.reserved.push_back(static_cast<uint64_t>(stats.reserved_bytes.all.current));
    timeline.requested.push_back(static_cast<uint64_t>(stats.requested_bytes.all.current));
    if (options.record_by_kind) timeline.by_kind.push_back(executor.by_kind());
  }
  timeline.final_stats = stats;
  if (options.final_segments != nullptr) *options.final_segments = executor.allocator().segments();
  return timeline;
}

}  // namespace memsim
