// Test support: what a span of a Program's events allocates and keeps live (the float8,
// context-parallel and other op-level suites check one op's events with these).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "program/program.h"

namespace memsim_test {

// The requested sizes of the allocations among events [from, to), in order.
inline std::vector<uint64_t> allocs_between(const memsim::Program& p, size_t from, size_t to) {
  std::vector<uint64_t> out;
  for (size_t i = from; i < to; ++i)
    if (p.events[i].type == memsim::EventType::alloc) out.push_back(p.events[i].bytes);
  return out;
}

// Live requested bytes at `to` and their peak over [from, to), relative to `from`.
inline std::pair<int64_t, int64_t> live_and_peak(const memsim::Program& p, size_t from, size_t to) {
  int64_t live = 0, peak = 0;
  for (size_t i = from; i < to; ++i) {
    const memsim::MemoryEvent& e = p.events[i];
    if (e.type == memsim::EventType::alloc) live += static_cast<int64_t>(e.bytes);
    if (e.type == memsim::EventType::free) live -= static_cast<int64_t>(p.tensors[e.tensor].bytes);
    peak = std::max(peak, live);
  }
  return {live, peak};
}

}  // namespace memsim_test
