// Tests that read ../shared (the real snapshots of shared/groundtruth, next to the
// project; absent in some checkouts) find it here, and say so when it is absent.
//
// - shared_root(): $MEMSIM_SHARED when set (MEMSIM_SHARED=/nonexistent ctest shows what
//   runs without it), else MEMSIM_SOURCE_DIR/../shared.
// - MEMSIM_SKIP(message): a Catch WARN "SKIPPED: message". ctest marks every test whose
//   output holds "SKIPPED: " as skipped (SKIP_REGULAR_EXPRESSION in CMakeLists.txt), so a
//   check that could not run is listed under "The following tests did not run", never
//   counted as passed. The caller returns right after it.
#pragma once

#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>
#include "test_paths.h"

#define MEMSIM_SKIP(message) WARN("SKIPPED: " << message)

namespace memsim_test {

inline const std::string& shared_root() {
  static const std::string root = [] {
    const char* env = std::getenv("MEMSIM_SHARED");
    return std::string(env != nullptr && *env != '\0' ? env : MEMSIM_SOURCE_DIR + "/../shared");
  }();
  return root;
}

// The real snapshots and their manifest.json, with a trailing '/'.
inline const std::string& shared_snapshots_dir() {
  static const std::string dir = shared_root() + "/groundtruth/snapshots/";
  return dir;
}

}  // namespace memsim_test
