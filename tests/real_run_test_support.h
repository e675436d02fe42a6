// Shared by the tests that compare memsim's predictions with real runs: the relative
// error, where the real snapshots are when ../shared is checked out, and the comparison
// table the accuracy tests print.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/shared_dir_test_support.h"
#include "tests/support/real_runs.h"

namespace memsim_test {

// (predicted - real) / real.
inline double rel(uint64_t predicted, uint64_t real) {
  return (static_cast<double>(predicted) - static_cast<double>(real)) / static_cast<double>(real);
}

// Whether the real snapshots are checked out (their manifest.json is readable). When they
// are not, says so with MEMSIM_SKIP naming the missing folder and what goes unchecked,
// so a run without ../shared is a skipped test, never a silent pass (ctest lists it as
// not run; tests/shared_dir_test_support.h); the caller then returns. The
// predictions against the stored peaks are other test cases and run either way.
inline bool shared_snapshots_present(const std::string& unchecked) {
  if (std::ifstream(shared_snapshots_dir() + "manifest.json")) return true;
  MEMSIM_SKIP(shared_snapshots_dir() << "manifest.json not found (shared ground truth "
              "absent): " << unchecked << " not checked; the stored peaks stand alone");
  return false;
}

// The stored replay peaks of `snapshot` in `measured` (the test fails when absent).
inline const memsim::ReplayPeaks& find_measured(const std::vector<memsim::ReplayPeaks>& measured,
                                                const std::string& snapshot) {
  for (const memsim::ReplayPeaks& m : measured)
    if (m.snapshot == snapshot) return m;
  FAIL("no measured peaks for " << snapshot);
  throw 0;
}

// The Markdown comparison table: predicted vs real peak allocated and reserved, bytes and %.
inline void print_comparison_header() {
  std::printf("\n| case | predicted allocated | real allocated | error | predicted reserved | "
              "real reserved | error |\n|---|---:|---:|---:|---:|---:|---:|\n");
}
inline void print_comparison_row(const std::string& id, uint64_t allocated,
                                 uint64_t real_allocated, uint64_t reserved,
                                 uint64_t real_reserved, const std::string& note = "") {
  std::printf("| %s | %llu | %llu | %+.3f%% | %llu | %llu | %+.3f%% |%s\n", id.c_str(),
              static_cast<unsigned long long>(allocated),
              static_cast<unsigned long long>(real_allocated),
              100 * rel(allocated, real_allocated), static_cast<unsigned long long>(reserved),
              static_cast<unsigned long long>(real_reserved), 100 * rel(reserved, real_reserved),
              note.empty() ? "" : ("  " + note).c_str());
}

}  // namespace memsim_test
