#include "tools/cli/replay_analysis.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "allocator/units.h"
#include "sim/analysis/peaks.h"

namespace memsim {
namespace {

constexpr uint32_t kNoSlot = UINT32_MAX;

struct LiveBlock {
  uint64_t address = 0;
  uint64_t bytes = 0;
  size_t alloc_event = 0;
  bool before_trace = false;
};

std::string block_name(uint64_t address) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "block 0x%llx", static_cast<unsigned long long>(address));
  return buf;
}

EventPoint trace_point(const ReplayReport& report, size_t index, const char* op) {
  EventPoint p;
  p.index = index;
  p.op = op;
  if (index < report.timeline.size()) {
    p.allocated = report.timeline[index].allocated;
    p.reserved = report.timeline[index].reserved;
    p.requested = report.timeline[index].requested;
  }
  return p;
}

// Blocks live right after trace entry `index`: the seeded start state, then the trace's
// allocs and frees up to it.
LiveSet live_blocks_at(const PreparedReplay& prepared, size_t index, size_t top_n) {
  std::unordered_map<uint32_t, LiveBlock> by_slot;
  std::vector<LiveBlock> never_freed;  // seeded blocks the trace never frees
  for (const PreparedReplay::Seed& seed : prepared.seeds) {
    size_t k = 0;
    for (const BlockInfo& b : seed.segment.blocks) {
      if (b.state == BlockState::inactive) continue;
      const uint32_t slot = k < seed.slots.size() ? seed.slots[k] : kNoSlot;
      ++k;
      LiveBlock lb{b.address, b.size, 0, true};
      if (slot == kNoSlot) never_freed.push_back(lb);
      else by_slot[slot] = lb;
    }
  }
  for (const PreparedReplay::Step& s : prepared.steps) {
    if (s.trace_index > index) break;
    if (s.kind == PreparedReplay::Kind::alloc) {
      by_slot[s.slot] = LiveBlock{s.address, s.size, s.trace_index, false};
    } else if (s.kind == PreparedReplay::Kind::free) {
      by_slot.erase(s.slot);
    }
  }

  std::vector<LiveBlock> live = std::move(never_freed);
  for (const auto& [slot, b] : by_slot) live.push_back(b);
  LiveSet out;
  out.event_index = index;
  NamedBytes seeded{"before trace", 0, 0}, traced{"alloc", 0, 0};
  for (const LiveBlock& b : live) {
    out.tensors += 1;
    out.bytes += b.bytes;
    NamedBytes& nb = b.before_trace ? seeded : traced;
    nb.bytes += b.bytes;
    nb.tensors += 1;
  }
  out.by_kind[static_cast<size_t>(TensorKind::other)] = out.bytes;
  if (out.tensors > 0) out.by_layer.push_back(LayerBytes{-1, out.bytes, out.tensors});
  for (NamedBytes* nb : {&traced, &seeded}) {
    if (nb->tensors > 0) out.by_op.push_back(*nb);
  }
  std::sort(out.by_op.begin(), out.by_op.end(),
            [](const NamedBytes& a, const NamedBytes& b) { return a.bytes > b.bytes; });

  auto larger = [](const LiveBlock& a, const LiveBlock& b) {
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    return a.address < b.address;
  };
  const size_t keep = std::min(top_n, live.size());
  std::partial_sort(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(keep), live.end(),
                    larger);
  for (size_t k = 0; k < keep; ++k) {
    LiveTensor t;
    t.name = block_name(live[k].address);
    t.kind = TensorKind::other;
    t.bytes = live[k].bytes;
    t.op = live[k].before_trace ? "before trace" : "alloc";
    t.alloc_event = live[k].alloc_event;
    out.largest.push_back(std::move(t));
  }
  return out;
}

}  // namespace

Analysis analyze_replay(const std::vector<SnapshotTraceEntry>& trace,
                        const PreparedReplay& prepared, const ReplayReport& report,
                        const AnalysisOptions& options) {
  Analysis a;
  a.events = report.events;
  a.events_executed = report.timeline.empty() ? report.events : report.timeline.size();
  a.measured_begin = 0;
  a.peak_allocated = report.peak_allocated_bytes;
  a.peak_reserved = report.peak_reserved_bytes;
  a.peak_requested = report.peak_requested_bytes;

  if (report.events > 0) {
    const size_t peak_index = std::min(report.peak_allocated_event, report.events - 1);
    a.peak = trace_point(report, peak_index, "alloc");
    a.live_at_peak = live_blocks_at(prepared, peak_index, options.top_tensors);
    a.breakdown_at_peak.other =
        peak_index < report.timeline.size() ? report.timeline[peak_index].allocated : a.peak_allocated;
  }

  if (!report.timeline.empty()) {
    std::vector<uint64_t> allocated(report.timeline.size());
    for (size_t i = 0; i < allocated.size(); ++i) allocated[i] = report.timeline[i].allocated;
    const double fraction = std::max(0.0, options.min_peak_prominence);
    const auto min_prominence =
        static_cast<uint64_t>(std::floor(static_cast<double>(a.peak_allocated) * fraction));
    for (const CurvePeak& cp :
         find_top_peaks(allocated, 0, allocated.size(), options.top_peaks, min_prominence)) {
      a.top_peaks.push_back(trace_point(report, cp.index, "alloc"));
    }
  }

  for (const std::string& name : options.marks) a.marks.emplace_back(name, std::nullopt);

  for (size_t i = 0; i < trace.size(); ++i) {
    if (trace[i].action != TraceAction::oom) continue;
    OomReport r;
    r.index = i;
    r.op = "alloc";
    r.requested_bytes = trace[i].size;
    r.free_bytes = trace[i].address;  // PyTorch traces device_free in the address field
    if (i < report.timeline.size()) {
      r.allocated_bytes = report.timeline[i].allocated;
      r.reserved_bytes = report.timeline[i].reserved;
    }
    r.message = "traced out-of-memory: tried to allocate " + torch_format_size(r.requested_bytes) +
                " with " + torch_format_size(r.free_bytes) +
                " free (the trace does not record PyTorch's message)";
    a.oom = std::move(r);
    break;
  }
  return a;
}

}  // namespace memsim
