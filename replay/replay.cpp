// Snapshot replay (§15 of shared/docs/pytorch-allocator.md). See replay/replay.h.
#include "replay/replay.h"

#include <algorithm>
#include <cstdio>
#include <unordered_map>
#include <unordered_set>

namespace memsim {

namespace {

constexpr uint32_t kNoSlot = UINT32_MAX;
constexpr uint64_t kSmallSizeLimit = 1048576;  // kSmallSize: large blocks are all bigger
constexpr uint64_t kSmallSegment = 2097152;    // kSmallBuffer: the only small segment size

using Kind = PreparedReplay::Kind;

// A block known to be live at trace start.
struct LiveAtStart {
  uint64_t address;
  uint64_t size;       // 0 = unknown (freed in the trace, never allocated in it)
  uint64_t requested;
  uint32_t slot;       // kNoSlot if never freed in the trace
  uint32_t freed_at = 0;  // trace index of its free_requested (unknown-size blocks)
};

// A traced alloc: where it landed and when.
struct TracedAlloc {
  uint64_t address;
  uint32_t index;
};

struct StartSegment {
  SegmentInfo info;  // address, total_size, stream, kind; blocks filled by tile()
  std::vector<LiveAtStart> live;
  const SegmentInfo* final_state = nullptr;  // the snapshot's, if the segment survives
};

// The true end of a large-pool block of unknown size (freed in the trace, never allocated
// in it): round_size(requested) plus an unsplit remainder of 0..1 MiB (§4.8). Since every
// large-pool block is > 1 MiB,
//  - a gap of <= 1 MiB up to the next live block can only be that remainder;
//  - otherwise the free block after it starts at its true end, and the first traced
//    alloc placed into that free block while the block is still live lands exactly there
//    (splits hand out the low part), so the lowest such alloc within 1 MiB marks the end.
uint64_t infer_large_block_size(const LiveAtStart& b, uint64_t rounded, uint64_t next_live,
                                const std::vector<TracedAlloc>& allocs, size_t& inferred) {
  const uint64_t end = b.address + rounded;
  const uint64_t gap = next_live > end ? next_live - end : 0;
  if (gap == 0) return rounded;
  if (gap <= kSmallSizeLimit) {
    ++inferred;
    return rounded + gap;
  }
  auto it = std::lower_bound(allocs.begin(), allocs.end(), end,
                             [](const TracedAlloc& a, uint64_t v) { return a.address < v; });
  for (; it != allocs.end() && it->address <= end + kSmallSizeLimit; ++it) {
    if (it->index < b.freed_at) {
      if (it->address != end) ++inferred;
      return it->address - b.address;
    }
  }
  return rounded;  // nothing landed there while it was live: the remainder cannot matter
}

// §15: the free space between live blocks is one free block (free neighbours merge).
PreparedReplay::Seed tile(StartSegment& seg, const CachingAllocator& rounding,
                          const std::vector<TracedAlloc>& allocs, size_t& inferred) {
  std::sort(seg.live.begin(), seg.live.end(),
            [](const LiveAtStart& a, const LiveAtStart& b) { return a.address < b.address; });
  const uint64_t end = seg.info.address + seg.info.total_size;
  PreparedReplay::Seed seed;
  seed.segment = seg.info;
  seed.segment.blocks.clear();
  uint64_t cursor = seg.info.address;
  auto stale_requested_at = [&seg](uint64_t address) -> uint64_t {
    // Best guess for a free block's stale requested_size: the snapshot's inactive block at
    // the same address, when the trace left it alone.
    if (seg.final_state == nullptr) return 0;
    for (const BlockInfo& b : seg.final_state->blocks)
      if (b.address == address && b.state == BlockState::inactive) return b.requested_size;
    return 0;
  };
  for (size_t i = 0; i < seg.live.size(); ++i) {
    LiveAtStart& b = seg.live[i];
    if (b.address > cursor) {
      seed.segment.blocks.push_back(
          {cursor, b.address - cursor, stale_requested_at(cursor), BlockState::inactive});
    }
    uint64_t size = b.size;
    if (size == 0) {
      size = rounding.round_size(b.requested);
      const uint64_t next = i + 1 < seg.live.size() ? seg.live[i + 1].address : end;
      // Small-pool and expandable blocks split down to 512 B: their size is exact.
      if (!seg.info.is_small && !seg.info.is_expandable && !rounding.config().expandable_segments)
        size = infer_large_block_size(b, size, next, allocs, inferred);
    }
    seed.segment.blocks.push_back({b.address, size, b.requested, BlockState::active_allocated});
    seed.slots.push_back(b.slot);
    cursor = b.address + size;
  }
  if (cursor < end)
    seed.segment.blocks.push_back({cursor, end - cursor, stale_requested_at(cursor), BlockState::inactive});
  seed.segment.allocated_size = seed.segment.active_size = seed.segment.requested_size = 0;
  for (const BlockInfo& b : seed.segment.blocks) {
    if (b.state != BlockState::inactive) {
      seed.segment.allocated_size += b.size;
      seed.segment.active_size += b.size;
      seed.segment.requested_size += b.requested_size;
    }
  }
  return seed;
}

// The start state must be a possible one: segments that do not overlap (the snapshot's
// own segments are checked by the reader; the ones the trace cudaFrees without creating
// them are checked here against those), each within the device address space.
void check_start_segments(const std::vector<StartSegment>& start) {
  auto describe = [](const StartSegment& s) {
    return std::to_string(s.info.address) + " + " + std::to_string(s.info.total_size) + " bytes (" +
           (s.final_state != nullptr ? "a segment of the snapshot" : "a segment the trace frees") + ")";
  };
  for (size_t i = 0; i < start.size(); ++i) {
    const SegmentInfo& s = start[i].info;
    if (s.total_size > kMaxDeviceAddress || s.address > kMaxDeviceAddress - s.total_size)
      throw SnapshotError("start state: the segment at " + describe(start[i]) +
                          " ends past 2^57, beyond any device's address space");
    if (i > 0 && s.address < start[i - 1].info.address + start[i - 1].info.total_size)
      throw SnapshotError("start state: the segment at " + describe(start[i]) + " overlaps " +
                          describe(start[i - 1]) + "; a real trace never frees such a segment");
  }
}

// cudaMalloc answered from the trace: the emulator must ask exactly when the trace has a
// pending segment_alloc, for exactly its size.
class ReplayDevice final : public DeviceMemory {
 public:
  struct Pending {
    uint64_t address;
    uint64_t size;
    uint32_t trace_index;
  };
  std::vector<Pending> pending;  // segment_allocs seen since the last alloc
  std::vector<std::pair<uint64_t, uint64_t>> freed;  // cudaFrees the emulator made
  ReplayReport* report = nullptr;
  size_t keep = 0;
  uint32_t current_event = 0;
  uint64_t fake_address = 0xfff0000000000000ull;

  void mismatch(uint32_t index, const char* what, uint64_t expected, uint64_t got) {
    ++report->mismatches;
    if (report->first_mismatches.size() < keep)
      report->first_mismatches.push_back({index, what, expected, got});
  }

  std::optional<uint64_t> cuda_malloc(uint64_t bytes) override {
    if (pending.empty()) {
      mismatch(current_event, "unexpected cudaMalloc (size got)", 0, bytes);
      // Fake addresses live above every real one (kMaxDeviceAddress); running out of
      // them takes exabytes of cudaMallocs the trace never made.
      const uint64_t a = fake_address;
      const uint64_t rounded = bytes / (2u << 20) * (2u << 20) + (bytes % (2u << 20) != 0 ? (2u << 20) : 0);
      if (rounded < bytes || __builtin_add_overflow(fake_address, rounded, &fake_address))
        throw SnapshotError("replay: the emulator's own cudaMallocs exceed the 64-bit address space");
      return a;
    }
    const Pending p = pending.front();
    pending.erase(pending.begin());
    if (p.size != bytes) mismatch(p.trace_index, "cudaMalloc size", p.size, bytes);
    return p.address;
  }
  void cuda_free(uint64_t address, uint64_t bytes) override { freed.emplace_back(address, bytes); }
  uint64_t free_bytes() const override { return uint64_t{1} << 50; }
  uint64_t total_bytes() const override { return uint64_t{1} << 40; }
  bool map_pages(uint64_t, uint64_t) override { return true; }
};

}  // namespace

std::string ReplayMismatch::describe() const {
  return "event " + std::to_string(event_index) + ": " + what + ": expected " +
         std::to_string(expected) + ", got " + std::to_string(got);
}

PreparedReplay prepare_replay(const Snapshot& snapshot, const ReplayOptions& options) {
  PreparedReplay out;
  out.config = options.config ? *options.config : snapshot.config;
  static const std::vector<SnapshotTraceEntry> kEmpty;
  const auto dev = static_cast<size_t>(options.device);
  const std::vector<SnapshotTraceEntry>& trace =
      dev < snapshot.device_traces.size() ? snapshot.device_traces[dev] : kEmpty;
  out.trace_events = trace.size();
  for (const SnapshotSegment& s : snapshot.segments)
    if (s.device == options.device) out.final_segments.push_back(s.info);
  std::sort(out.final_segments.begin(), out.final_segments.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) { return a.address < b.address; });

  // 1. Walk the trace: resolve frees to allocs, find blocks and segments older than it.
  std::unordered_map<uint64_t, uint32_t> owned;  // address -> slot of a trace-allocated block
  std::unordered_set<uint64_t> created;          // segments cudaMalloc'd in the trace, alive
  std::vector<LiveAtStart> freed_pretrace;
  std::vector<SnapshotTraceEntry> freed_start_segments;
  std::vector<TracedAlloc> allocs;
  out.steps.reserve(trace.size());
  for (size_t i = 0; i < trace.size(); ++i) {
    const SnapshotTraceEntry& e = trace[i];
    PreparedReplay::Step step{Kind::ignore, static_cast<uint32_t>(i), kNoSlot, e.stream,
                              e.address, e.size};
    switch (e.action) {
      case TraceAction::alloc:
        allocs.push_back({e.address, static_cast<uint32_t>(i)});
        step.kind = Kind::alloc;
        step.slot = out.slot_count++;
        owned[e.address] = step.slot;
        break;
      case TraceAction::free_requested: {
        step.kind = Kind::free;
        auto it = owned.find(e.address);
        if (it != owned.end()) {
          step.slot = it->second;
          owned.erase(it);
        } else {
          step.slot = out.slot_count++;
          freed_pretrace.push_back({e.address, 0, e.size, step.slot, static_cast<uint32_t>(i)});
        }
        break;
      }
      case TraceAction::segment_alloc:
        step.kind = Kind::segment_alloc;
        created.insert(e.address);
        break;
      case TraceAction::segment_free:
        step.kind = Kind::segment_free;
        if (created.erase(e.address) == 0) freed_start_segments.push_back(e);
        break;
      case TraceAction::free_completed:
      case TraceAction::snapshot:
        break;
      case TraceAction::oom:
      case TraceAction::segment_map:
      case TraceAction::segment_unmap:
        step.kind = Kind::unsupported;
        break;
    }
    out.steps.push_back(step);
  }

  // 2. Segments at trace start: the final ones not created in the trace, plus the ones
  //    the trace cudaFrees without having created them.
  std::vector<StartSegment> start;
  for (const SegmentInfo& s : out.final_segments) {
    if (!s.is_expandable && created.count(s.address) != 0) continue;
    StartSegment seg;
    seg.info = s;
    seg.final_state = &s;
    for (const BlockInfo& b : s.blocks)
      if (b.state != BlockState::inactive && owned.count(b.address) == 0)
        seg.live.push_back({b.address, b.size, b.requested_size, kNoSlot, 0});
    start.push_back(std::move(seg));
  }
  for (const SnapshotTraceEntry& e : freed_start_segments) {
    StartSegment seg;
    seg.info.address = e.address;
    seg.info.total_size = e.size;
    seg.info.stream = e.stream;
    seg.info.is_small = e.size == kSmallSegment;
    start.push_back(std::move(seg));
  }
  std::sort(start.begin(), start.end(), [](const StartSegment& a, const StartSegment& b) {
    return a.info.address < b.info.address;
  });
  check_start_segments(start);

  // 3. Blocks freed in the trace but never allocated in it were live at its start.
  for (const LiveAtStart& b : freed_pretrace) {
    auto it = std::upper_bound(start.begin(), start.end(), b.address,
                               [](uint64_t a, const StartSegment& s) { return a < s.info.address; });
    if (it == start.begin()) continue;  // outside every known segment: cannot be placed
    --it;
    if (b.address >= it->info.address + it->info.total_size) continue;
    it->live.push_back(b);
  }

  // 4. Tile each start segment.
  SimulatedDevice scratch(0, 0);
  const CachingAllocator rounding(out.config, scratch);
  // The manifest's trace-only allocated estimate (see ReplayReport).
  {
    // Every size is at most kMaxDeviceAddress (2^57, the reader checks), so the running
    // totals fit easily in 128 bits; a trace whose total leaves 0..2^64 is inconsistent.
    __int128 final_allocated = 0, running = 0, max_prefix = 0;
    for (const SegmentInfo& s : out.final_segments) final_allocated += s.allocated_size;
    for (const PreparedReplay::Step& st : out.steps) {
      if (st.kind == Kind::alloc) running += rounding.round_size(st.size);
      else if (st.kind == Kind::free) running -= rounding.round_size(st.size);
      max_prefix = std::max(max_prefix, running);
    }
    const __int128 estimate = final_allocated - running + max_prefix;
    out.trace_estimate_peak_allocated =
        estimate < 0 ? 0 : estimate > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(estimate);
  }
  std::sort(allocs.begin(), allocs.end(), [](const TracedAlloc& a, const TracedAlloc& b) {
    return a.address != b.address ? a.address < b.address : a.index < b.index;
  });
  for (StartSegment& seg : start)
    out.seeds.push_back(tile(seg, rounding, allocs, out.inferred_block_sizes));
  return out;
}

ReplayReport run_replay(const PreparedReplay& prepared, const ReplayOptions& options) {
  ReplayReport report;
  ReplayDevice device;
  device.report = &report;
  device.keep = options.keep_mismatches;
  CachingAllocator alloc(prepared.config, device);

  std::vector<BlockId> handles(prepared.slot_count, kNoBlock);
  for (const PreparedReplay::Seed& seed : prepared.seeds) {
    const std::vector<BlockId> ids = alloc.seed_segment(seed.segment);
    for (size_t k = 0; k < ids.size() && k < seed.slots.size(); ++k)
      if (seed.slots[k] != kNoSlot) handles[seed.slots[k]] = ids[k];
    ++report.seeded_segments;
    report.seeded_live_blocks += ids.size();
  }
  const MemoryStats& stats = alloc.stats();
  report.baseline_allocated_bytes = static_cast<uint64_t>(stats.allocated_bytes.all.current);
  report.baseline_reserved_bytes = static_cast<uint64_t>(stats.reserved_bytes.all.current);
  report.baseline_requested_bytes = static_cast<uint64_t>(stats.requested_bytes.all.current);
  report.inferred_block_sizes = prepared.inferred_block_sizes;
  report.trace_estimate_peak_allocated_bytes = prepared.trace_estimate_peak_allocated;
  report.events = prepared.trace_events;
  if (options.record_timeline) report.timeline.reserve(prepared.trace_events);

  int64_t peak_allocated = stats.allocated_bytes.all.current;
  const std::vector<PreparedReplay::Step>& steps = prepared.steps;
  for (size_t i = 0; i < steps.size(); ++i) {
    const PreparedReplay::Step& s = steps[i];
    switch (s.kind) {
      case Kind::alloc: {
        ++report.allocs;
        device.current_event = s.trace_index;
        const AllocResult r = alloc.malloc(s.size, s.stream);
        if (!r.ok()) {
          device.mismatch(s.trace_index, "emulator out of memory (request)", s.size, 0);
        } else {
          if (r.address != s.address) device.mismatch(s.trace_index, "alloc address", s.address, r.address);
          handles[s.slot] = r.block;
        }
        for (const ReplayDevice::Pending& p : device.pending)
          device.mismatch(p.trace_index, "traced cudaMalloc not made (size)", p.size, 0);
        device.pending.clear();
        if (stats.allocated_bytes.all.current > peak_allocated) {
          peak_allocated = stats.allocated_bytes.all.current;
          report.peak_allocated_event = s.trace_index;
        }
        break;
      }
      case Kind::free:
        ++report.frees;
        if (handles[s.slot] != kNoBlock) {
          alloc.free(handles[s.slot]);
          handles[s.slot] = kNoBlock;
        } else {
          device.mismatch(s.trace_index, "free of a block the start state lacks (address)", s.address, 0);
        }
        break;
      case Kind::segment_alloc:
        ++report.segment_allocs;
        device.pending.push_back({s.address, s.size, s.trace_index});
        break;
      case Kind::segment_free: {
        // A run of cudaFrees outside a malloc: torch.cuda.empty_cache().
        size_t j = i;
        while (j < steps.size() && (steps[j].kind == Kind::segment_free || steps[j].kind == Kind::ignore)) ++j;
        device.freed.clear();
        alloc.empty_cache();
        size_t k = 0;
        for (size_t t = i; t < j; ++t) {
          if (steps[t].kind != Kind::segment_free) continue;
          ++report.segment_frees;
          const bool same = k < device.freed.size() && device.freed[k].first == steps[t].address &&
                            device.freed[k].second == steps[t].size;
          if (!same) device.mismatch(steps[t].trace_index, "cudaFree (address)", steps[t].address,
                                     k < device.freed.size() ? device.freed[k].first : 0);
          ++k;
        }
        for (; k < device.freed.size(); ++k)
          device.mismatch(steps[j - 1].trace_index, "extra cudaFree (address)", 0, device.freed[k].first);
        if (options.record_timeline)
          for (size_t t = i; t + 1 < j; ++t)
            report.timeline.push_back({static_cast<uint64_t>(stats.allocated_bytes.all.current),
                                       static_cast<uint64_t>(stats.reserved_bytes.all.current),
                                       static_cast<uint64_t>(stats.requested_bytes.all.current)});
        i = j - 1;
        break;
      }
      case Kind::unsupported:
        ++report.unsupported_events;
        break;
      case Kind::ignore:
        break;
    }
    if (options.record_timeline)
      report.timeline.push_back({static_cast<uint64_t>(stats.allocated_bytes.all.current),
                                 static_cast<uint64_t>(stats.reserved_bytes.all.current),
                                 static_cast<uint64_t>(stats.requested_bytes.all.current)});
  }

  report.peak_allocated_bytes = static_cast<uint64_t>(stats.allocated_bytes.all.peak);
  report.peak_reserved_bytes = static_cast<uint64_t>(stats.reserved_bytes.all.peak);
  report.peak_requested_bytes = static_cast<uint64_t>(stats.requested_bytes.all.peak);
  report.final_stats = stats;

  if (!options.check_final_state) return report;
  const std::vector<SegmentInfo> got = alloc.segments();
  report.first_segment_difference = compare_segments(prepared.final_segments, got, false);
  report.final_segments_match = report.first_segment_difference.empty();
  const std::string layout = compare_segments(prepared.final_segments, got, true);
  report.final_layout_match = layout.empty();
  if (!layout.empty()) report.first_segment_difference = layout;
  return report;
}

ReplayReport replay_snapshot(const Snapshot& snapshot, const ReplayOptions& options) {
  return run_replay(prepare_replay(snapshot, options), options);
}

Program program_from_trace(const Snapshot& snapshot, int device, std::vector<StreamId>* streams) {
  Program program;
  std::vector<StreamId> handles{0};
  auto stream_index = [&handles](StreamId s) {
    for (size_t i = 0; i < handles.size(); ++i)
      if (handles[i] == s) return static_cast<uint8_t>(i);
    handles.push_back(s);
    return static_cast<uint8_t>(handles.size() - 1);
  };
  const auto dev = static_cast<size_t>(device);
  if (dev < snapshot.device_traces.size()) {
    std::unordered_map<uint64_t, uint32_t> live;  // address -> tensor id
    bool in_free_run = false;
    for (const SnapshotTraceEntry& e : snapshot.device_traces[dev]) {
      if (e.action == TraceAction::segment_free) {
        if (!in_free_run) program.empty_cache(Phase::other);
        in_free_run = true;
        continue;
      }
      in_free_run = false;
      if (e.action == TraceAction::alloc) {
        live[e.address] = program.alloc(e.size, TensorKind::other, Phase::other, 0, -1, 0,
                                        stream_index(e.stream));
      } else if (e.action == TraceAction::free_requested) {
        auto it = live.find(e.address);
        if (it == live.end()) continue;  // older than the trace
        program.free(it->second, Phase::other, 0, -1);
        live.erase(it);
      }
    }
  }
  if (streams != nullptr) *streams = handles;
  return program;
}

std::string compare_segments(const std::vector<SegmentInfo>& expected,
                             const std::vector<SegmentInfo>& got, bool ignore_inactive_requested) {
  auto hex = [](uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return std::string(buf);
  };
  // The texts are built only for the difference that is returned: a matching snapshot
  // (the usual case) formats nothing (was a quarter of the replay loop's instructions).
  auto where = [&](size_t i) { return "segment " + std::to_string(i) + " at " + hex(expected[i].address); };
  auto block_where = [&](size_t i, size_t k) {
    return where(i) + " block " + std::to_string(k) + " at " + hex(expected[i].blocks[k].address);
  };
  const size_t n = std::min(expected.size(), got.size());
  for (size_t i = 0; i < n; ++i) {
    const SegmentInfo& e = expected[i];
    const SegmentInfo& g = got[i];
    if (e.address != g.address) return where(i) + ": emulator has a segment at " + hex(g.address);
    if (e.total_size != g.total_size)
      return where(i) + ": total_size " + std::to_string(e.total_size) + " vs " + std::to_string(g.total_size);
    if (e.is_small != g.is_small || e.is_expandable != g.is_expandable || e.stream != g.stream)
      return where(i) + ": kind/stream differ";
    if (e.blocks.size() != g.blocks.size())
      return where(i) + ": " + std::to_string(e.blocks.size()) + " blocks vs " + std::to_string(g.blocks.size());
    for (size_t k = 0; k < e.blocks.size(); ++k) {
      const BlockInfo& eb = e.blocks[k];
      const BlockInfo& gb = g.blocks[k];
      if (eb.address != gb.address || eb.size != gb.size)
        return block_where(i, k) + ": size " + std::to_string(eb.size) + " vs " + std::to_string(gb.size) +
               " at " + hex(gb.address);
      if (eb.state != gb.state)
        return block_where(i, k) + ": state " + to_string(eb.state) + " vs " + to_string(gb.state);
      const bool check_requested = !(ignore_inactive_requested && eb.state == BlockState::inactive);
      if (check_requested && eb.requested_size != gb.requested_size)
        return block_where(i, k) + ": requested_size " + std::to_string(eb.requested_size) + " vs " +
               std::to_string(gb.requested_size);
    }
    if (!ignore_inactive_requested && e.requested_size != g.requested_size)
      return where(i) + ": requested_size differs";
    if (e.allocated_size != g.allocated_size || e.active_size != g.active_size)
      return where(i) + ": allocated/active size differs";
  }
  if (expected.size() != got.size())
    return std::to_string(expected.size()) + " segments vs " + std::to_string(got.size());
  return "";
}

}  // namespace memsim
