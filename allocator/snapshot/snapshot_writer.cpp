// Snapshot -> pickle in the layout torch.cuda.memory._dump_snapshot writes on PyTorch
// v2.6 (§9): same keys in the same order, so that memory_viz, torch.cuda._memory_viz
// and scripts written against real snapshots read ours unchanged. Python stacks do not
// exist here: a block's or trace entry's 'frames' are the Snapshot's frame_sets (memsim
// run fills them with what each tensor is), else [] for blocks and no key for trace
// entries, as PyTorch writes them when no stack was recorded. A trace entry's
// 'category' (the key torch.cuda._memory_viz.profile_plot writes and MemoryViz.js
// colours by) follows its 'frames'.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "allocator/snapshot/pickle.h"
#include "allocator/snapshot/snapshot.h"

namespace memsim {
namespace {

void empty_list(PickleWriter& w) {
  w.begin_list(0);
  w.end_list();
}

void write_frames(PickleWriter& w, const Snapshot& snapshot, uint32_t set) {
  if (set == 0 || set > snapshot.frame_sets.size()) return empty_list(w);
  const std::vector<SnapshotFrame>& frames = snapshot.frame_sets[set - 1];
  w.begin_list(frames.size());
  for (const SnapshotFrame& f : frames) {
    w.begin_dict(3);  // the key order of PyTorch's frames
    w.string("name"); w.string(f.name);
    w.string("filename"); w.string(f.filename);
    w.string("line"); w.integer(f.line);
    w.end_dict();
  }
  w.end_list();
}

void write_segment(PickleWriter& w, const Snapshot& snapshot, const SnapshotSegment& seg) {
  const SegmentInfo& s = seg.info;
  w.begin_dict(12);
  w.string("device"); w.integer(seg.device);
  w.string("address"); w.unsigned_integer(s.address);
  w.string("total_size"); w.unsigned_integer(s.total_size);
  w.string("allocated_size"); w.unsigned_integer(s.allocated_size);
  w.string("active_size"); w.unsigned_integer(s.active_size);
  w.string("requested_size"); w.unsigned_integer(s.requested_size);
  w.string("stream"); w.unsigned_integer(s.stream);
  w.string("segment_type"); w.string(s.is_small ? "small" : "large");
  w.string("segment_pool_id"); w.tuple2_ints(0, 0);  // the default pools
  w.string("is_expandable"); w.boolean(s.is_expandable);
  w.string("frames"); empty_list(w);  // an empty 'frames' precedes 'blocks' (§9.2)
  w.string("blocks");
  w.begin_list(s.blocks.size());
  for (size_t k = 0; k < s.blocks.size(); ++k) {
    const BlockInfo& b = s.blocks[k];
    w.begin_dict(5);
    w.string("address"); w.unsigned_integer(b.address);
    w.string("size"); w.unsigned_integer(b.size);
    w.string("requested_size"); w.unsigned_integer(b.requested_size);
    w.string("state"); w.string(to_string(b.state));
    w.string("frames");
    write_frames(w, snapshot, k < seg.block_frames.size() ? seg.block_frames[k] : 0);
    w.end_dict();
  }
  w.end_list();
  w.end_dict();
}

void write_trace_entry(PickleWriter& w, const Snapshot& snapshot, const SnapshotTraceEntry& e) {
  const bool frames = e.frames != 0 && e.frames <= snapshot.frame_sets.size();
  const bool category = e.category != 0 && e.category <= snapshot.categories.size();
  w.begin_dict(5 + (frames ? 1 : 0) + (category ? 1 : 0));
  w.string("action"); w.string(to_string(e.action));
  w.string(e.action == TraceAction::oom ? "device_free" : "addr"); w.unsigned_integer(e.address);
  w.string("size"); w.unsigned_integer(e.size);
  w.string("stream"); w.unsigned_integer(e.stream);
  w.string("time_us"); w.integer(e.time_us);
  if (frames) {
    w.string("frames");
    write_frames(w, snapshot, e.frames);
  }
  if (category) {
    w.string("category");
    w.string(snapshot.categories[e.category - 1]);
  }
  w.end_dict();
}

void write_settings(PickleWriter& w, const Snapshot& snapshot) {
  const AllocatorConfig& c = snapshot.config;
  w.begin_dict(8);
  w.string("PYTORCH_CUDA_ALLOC_CONF"); w.string(snapshot.alloc_conf_string);
  w.string("max_split_size");
  if (c.max_split_size == AllocatorConfig::kUnlimited) w.integer(-1);
  else w.unsigned_integer(c.max_split_size);
  w.string("garbage_collection_threshold"); w.real(c.garbage_collection_threshold);
  w.string("expandable_segments"); w.boolean(c.expandable_segments);
  // Pinned-memory settings are not modelled; these are PyTorch's defaults.
  w.string("pinned_num_register_threads"); w.integer(1);
  w.string("release_lock_on_cudamalloc"); w.boolean(false);
  w.string("pinned_use_cuda_host_register"); w.boolean(false);
  w.string("roundup_power2_divisions");
  w.begin_dict(c.roundup_power2_divisions.size());
  for (size_t i = 0; i < c.roundup_power2_divisions.size(); ++i) {
    w.string(std::to_string(uint64_t{1} << i));  // interval lower bound in MiB
    w.integer(c.roundup_power2_divisions[i]);
  }
  w.end_dict();
  w.end_dict();
}

}  // namespace

std::string write_snapshot_bytes(const Snapshot& snapshot) {
  PickleWriter w;
  w.begin_dict(4);
  w.string("segments");
  w.begin_list(snapshot.segments.size());
  for (const SnapshotSegment& seg : snapshot.segments) write_segment(w, snapshot, seg);
  w.end_list();

  // One trace list per device, at least up to the highest device with a segment, so a
  // viewer indexing device_traces[device] always finds a list.
  size_t devices = snapshot.device_traces.size();
  for (const SnapshotSegment& seg : snapshot.segments) {
    devices = std::max(devices, static_cast<size_t>(seg.device) + 1);
  }
  w.string("device_traces");
  w.begin_list(devices);
  for (size_t d = 0; d < devices; ++d) {
    if (d < snapshot.device_traces.size()) {
      w.begin_list(snapshot.device_traces[d].size());
      for (const SnapshotTraceEntry& e : snapshot.device_traces[d]) write_trace_entry(w, snapshot, e);
      w.end_list();
    } else {
      empty_list(w);
    }
  }
  w.end_list();

  w.string("allocator_settings");
  write_settings(w, snapshot);
  w.string("external_annotations");
  empty_list(w);
  w.end_dict();
  return w.finish();
}

void write_snapshot_file(const Snapshot& snapshot, const std::string& path) {
  const std::string bytes = write_snapshot_bytes(snapshot);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw SnapshotError(path + ": cannot open for writing: " + std::strerror(errno));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw SnapshotError(path + ": write failed");
}

}  // namespace memsim
