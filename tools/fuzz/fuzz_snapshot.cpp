// libFuzzer harness for snapshots (docs/fuzzing.md): reader, writer, replay preparation
// and replay (tools/fuzz/entries.h). Build with -DMEMSIM_FUZZ=ON and clang; run through
// tools/fuzz/run.sh, or directly:
//
//   build-fuzz/fuzz_snapshot -max_total_time=240 -rss_limit_mb=2048 -timeout=5 \
//       corpus-snapshot/ tests/data/fuzz
#include <cstddef>
#include <cstdint>

#include "tools/fuzz/entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memsim::fuzz::snapshot_entry(data, size);
  return 0;
}
