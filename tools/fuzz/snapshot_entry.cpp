// See tools/fuzz/entries.h.
#include <set>
#include <stdexcept>
#include <string>

#include "allocator/snapshot/snapshot.h"
#include "replay/replay.h"
#include "tools/fuzz/entries.h"

namespace memsim::fuzz {

void snapshot_entry(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  Snapshot snapshot;
  try {
    snapshot = read_snapshot_bytes(bytes, "<fuzz>");
  } catch (const SnapshotError&) {
    return;
  }
  // Whatever the reader accepts, the writer must write and the reader read back.
  const std::string written = write_snapshot_bytes(snapshot);
  read_snapshot_bytes(written, "<fuzz rewritten>");

  std::set<int> devices;
  for (size_t d = 0; d < snapshot.device_traces.size(); ++d) devices.insert(static_cast<int>(d));
  for (const SnapshotSegment& s : snapshot.segments) devices.insert(s.device);
  if (devices.empty()) devices.insert(0);
  size_t replayed = 0;
  for (const int device : devices) {
    if (++replayed > 4) break;
    ReplayOptions options;
    options.device = device;
    options.record_timeline = true;
    try {
      const PreparedReplay prepared = prepare_replay(snapshot, options);
      run_replay(prepared, options);
    } catch (const SnapshotError&) {
      continue;  // an impossible start state, refused
    } catch (const std::overflow_error&) {
      continue;  // statistics past int64: refused (allocator/allocator_impl.h)
    }
    program_from_trace(snapshot, device);
  }
}

}  // namespace memsim::fuzz
