#include "tools/cli/snapshot_report.h"

#include <string>
#include <unordered_map>
#include <utility>

#include "program/tensor_names.h"
#include "tools/cli/output.h"

namespace memsim::cli {
namespace {

// Where a tensor was made, as the phase memory_viz shows: a checkpoint re-run's tensors
// are "recompute" (their events carry the backward phase).
std::string phase_label(const Program& program, uint32_t tensor, const MemoryEvent& alloc) {
  if (program.tensors[tensor].flags & kTensorRecomputed) return "recompute";
  return to_string(alloc.phase);
}

}  // namespace

void add_tensor_frames(Snapshot& snapshot, const Program& program) {
  const TensorNames names(program);
  // Categories: one per TensorKind (the profiler's names), then "unknown", which segment
  // events carry. MemoryViz.js adds "unknown" itself when no event has it, through a
  // misspelt field (`snapshot.categores.push`) that throws: so some event must carry it.
  std::unordered_map<std::string, uint32_t> category_index;
  auto category = [&](const char* c) {
    auto [it, fresh] = category_index.try_emplace(c, static_cast<uint32_t>(snapshot.categories.size() + 1));
    if (fresh) snapshot.categories.emplace_back(c);
    return it->second;
  };
  const uint32_t unknown = category("unknown");
  std::vector<uint32_t> set_of(program.tensors.size(), 0);  // tensor -> 1 + frame set
  auto frames_of = [&](uint32_t t) -> uint32_t {
    if (t >= set_of.size()) return 0;
    if (set_of[t] != 0) return set_of[t];
    const size_t k = names.alloc_event(t);
    if (k == SIZE_MAX) return 0;
    const MemoryEvent& a = program.events[k];
    std::string path = names.module_path(t);
    // Innermost first: what the tensor is, in which module (line = its layer), then the op
    // that allocated it, in which phase.
    snapshot.frame_sets.push_back(
        {SnapshotFrame{names.name(t), path.empty() ? "model" : path, a.layer >= 0 ? a.layer : 0},
         SnapshotFrame{program.str(a.op), phase_label(program, t, a), 0}});
    return set_of[t] = static_cast<uint32_t>(snapshot.frame_sets.size());
  };

  // Address -> (frame set, category) of the block allocated there, for frees (whose
  // causing event may be another tensor's) and for the final active blocks.
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> live;
  for (std::vector<SnapshotTraceEntry>& trace : snapshot.device_traces) {
    for (SnapshotTraceEntry& entry : trace) {
      const auto index = static_cast<size_t>(entry.time_us);
      const MemoryEvent* e = index < program.events.size() ? &program.events[index] : nullptr;
      switch (entry.action) {
        case TraceAction::alloc:
          if (e != nullptr && e->type == EventType::alloc) {
            entry.frames = frames_of(e->tensor);
            entry.category = category(snapshot_category(e->kind));
            live[entry.address] = {entry.frames, entry.category};
          }
          break;
        case TraceAction::free_requested:
        case TraceAction::free_completed:
          if (auto it = live.find(entry.address); it != live.end()) {
            entry.frames = it->second.first;
            entry.category = it->second.second;
            if (entry.action == TraceAction::free_completed) live.erase(it);
          }
          break;
        default:  // segments, oom: the request that caused them
          if (e != nullptr && e->type == EventType::alloc) entry.frames = frames_of(e->tensor);
          entry.category = unknown;
          break;
      }
    }
  }
  for (SnapshotSegment& seg : snapshot.segments) {
    seg.block_frames.assign(seg.info.blocks.size(), 0);
    for (size_t k = 0; k < seg.info.blocks.size(); ++k) {
      const BlockInfo& b = seg.info.blocks[k];
      if (b.state == BlockState::inactive) continue;
      if (auto it = live.find(b.address); it != live.end()) seg.block_frames[k] = it->second.first;
    }
  }
}

void write_run_snapshot(const std::string& path, const Program& program,
                        std::vector<SnapshotTraceEntry> trace, std::vector<SegmentInfo> segments,
                        const AllocatorConfig& config) {
  Snapshot snapshot;
  snapshot.segments.reserve(segments.size());
  for (SegmentInfo& s : segments) snapshot.segments.push_back({0, std::move(s), {}});
  snapshot.device_traces.push_back(std::move(trace));
  snapshot.config = config;
  // The settings the run used, so a replay of the file uses them too.
  snapshot.alloc_conf_string = config.to_string();
  add_tensor_frames(snapshot, program);
  // Through Output (not write_snapshot_file) so that a failed write names the file the
  // same way every other report does.
  Output out(path);
  out.write(write_snapshot_bytes(snapshot));
  out.finish();
}

}  // namespace memsim::cli
