// libFuzzer harness for scenarios (docs/fuzzing.md): YAML text, then --set strings after
// a line "#--set", through the loader and, for small runs, the simulation
// (tools/fuzz/entries.h). Build with -DMEMSIM_FUZZ=ON and clang; run through
// tools/fuzz/run.sh, or directly:
//
//   build-fuzz/fuzz_scenario -max_total_time=240 -rss_limit_mb=2048 -timeout=10 \
//       -dict=tools/fuzz/scenario.dict corpus-scenario/ tests/data/fuzz-scenario
#include <cstddef>
#include <cstdint>

#include "tools/fuzz/entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memsim::fuzz::scenario_entry(data, size);
  return 0;
}
