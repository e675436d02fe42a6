#include "tools/cli/snapshot_report.h"

#include <utility>

#include "tools/cli/output.h"

namespace memsim::cli {

void write_run_snapshot(const std::string& path, std::vector<SnapshotTraceEntry> trace,
                        std::vector<SegmentInfo> segments, const AllocatorConfig& config) {
  Snapshot snapshot;
  snapshot.segments.reserve(segments.size());
  for (SegmentInfo& s : segments) snapshot.segments.push_back({0, std::move(s)});
  snapshot.device_traces.push_back(std::move(trace));
  snapshot.config = config;
  // The settings the run used, so a replay of the file uses them too.
  snapshot.alloc_conf_string = config.to_string();
  // Through Output (not write_snapshot_file) so that a failed write names the file the
  // same way every other report does.
  Output out(path);
  out.write(write_snapshot_bytes(snapshot));
  out.finish();
}

}  // namespace memsim::cli
