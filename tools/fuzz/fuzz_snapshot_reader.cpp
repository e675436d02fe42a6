// libFuzzer harness for the snapshot reader (build with -DMEMSIM_FUZZ=ON and clang).
// Any input must either parse or end in SnapshotError: anything else (a crash, another
// exception, a sanitizer report, a timeout or an out-of-memory) is a bug. A parsed
// snapshot is also written back and re-read, which must succeed.
//
//   build-fuzz/fuzz_snapshot_reader -max_total_time=240 -rss_limit_mb=2048 -timeout=5 \
//       corpus/ tests/data/fuzz tests/data/silmont2000_mem_snapshot.pickle
#include <cstddef>
#include <cstdint>
#include <string>

#include "allocator/snapshot/snapshot.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  memsim::Snapshot snapshot;
  try {
    snapshot = memsim::read_snapshot_bytes(bytes, "<fuzz>");
  } catch (const memsim::SnapshotError&) {
    return 0;
  }
  // Whatever the reader accepts, the writer must write and the reader read back.
  const std::string written = memsim::write_snapshot_bytes(snapshot);
  memsim::read_snapshot_bytes(written, "<fuzz rewritten>");
  return 0;
}
