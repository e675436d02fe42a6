// The one test object compiled with this checkout's paths (tests/test_paths.h says why).
#include "test_paths.h"

namespace memsim_test::paths {
#define MEMSIM_PATH_FN(name, value)  \
  const std::string& name() {        \
    static const std::string s{value}; \
    return s;                        \
  }
MEMSIM_PATH_FN(source_dir, MEMSIM_PATH_SOURCE_DIR)
MEMSIM_PATH_FN(binary_dir, MEMSIM_PATH_BINARY_DIR)
MEMSIM_PATH_FN(h100_snapshots, MEMSIM_PATH_BINARY_DIR "/h100_snapshots")
MEMSIM_PATH_FN(h100_arch_snapshots, MEMSIM_PATH_BINARY_DIR "/h100_arch_snapshots")
MEMSIM_PATH_FN(fsdp2_snapshots, MEMSIM_PATH_BINARY_DIR "/gpu_fsdp2_snapshots")
MEMSIM_PATH_FN(stacks_snapshots, MEMSIM_PATH_BINARY_DIR "/gpu_stacks_snapshots")
MEMSIM_PATH_FN(moe_snapshots, MEMSIM_PATH_BINARY_DIR "/gpu_moe_snapshots")
MEMSIM_PATH_FN(cp_snapshots, MEMSIM_PATH_BINARY_DIR "/gpu_cp_snapshots")
#undef MEMSIM_PATH_FN
}  // namespace memsim_test::paths
