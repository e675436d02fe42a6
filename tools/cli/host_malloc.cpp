#include "tools/cli/host_malloc.h"

#include <cstdlib>  // defines __GLIBC__ with glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace memsim::cli {

void tune_host_malloc() {
#if defined(__GLIBC__)
  // Measured on a cold cs336-xl `run` (docs/engine.md, "A cold run under 5 ms"): 12
  // munmaps -> 3, the drain ~0.2 ms and the exit ~0.4 ms earlier.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2)
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

}  // namespace memsim::cli
