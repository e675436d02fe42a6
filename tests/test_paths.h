// The suite's paths into this checkout and its build tree.
//
// Contract: each macro below is a `const std::string&` naming an absolute directory
// (no trailing slash), fixed for the life of the test binary. Write `MEMSIM_SOURCE_DIR +
// "/scenarios/x.yaml"`, never string-literal juxtaposition.
//
// Why they are functions and not -D string literals: a path on a test file's compile
// line makes its object differ per checkout, so no worktree ever reused another's ccache
// entries (a cold build of the suite per worktree). Only tests/test_paths.cpp is compiled
// with the paths.
#pragma once

#include <string>

namespace memsim_test::paths {
const std::string& source_dir();
const std::string& binary_dir();
const std::string& h100_snapshots();
const std::string& h100_arch_snapshots();
const std::string& fsdp2_snapshots();
const std::string& stacks_snapshots();
const std::string& moe_snapshots();
const std::string& cp_snapshots();
}  // namespace memsim_test::paths

#define MEMSIM_SOURCE_DIR (::memsim_test::paths::source_dir())
#define MEMSIM_BINARY_DIR (::memsim_test::paths::binary_dir())
#define MEMSIM_H100_SNAPSHOTS (::memsim_test::paths::h100_snapshots())
#define MEMSIM_H100_ARCH_SNAPSHOTS (::memsim_test::paths::h100_arch_snapshots())
#define MEMSIM_FSDP2_SNAPSHOTS (::memsim_test::paths::fsdp2_snapshots())
#define MEMSIM_STACKS_SNAPSHOTS (::memsim_test::paths::stacks_snapshots())
#define MEMSIM_MOE_SNAPSHOTS (::memsim_test::paths::moe_snapshots())
#define MEMSIM_CP_SNAPSHOTS (::memsim_test::paths::cp_snapshots())
