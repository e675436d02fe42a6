// Test support: a Program's step events as comparable text, for the suites that check an
// optimizer-phase sequence event by event against hand arithmetic or a CPU fixture
// (clip_grad_norm_ on one GPU, FSDP1 and FSDP2; the GradScaler; DeepSpeed's step).
//
// Contract: everything reads the Program only (no allocator, no scenario); the walkers look
// at the measured step (from its "measured_step_begin" mark on), so a warm-up step's events
// never count; a fixture's events are [kind, op, bytes] rows as tools/fixtures/*.py write
// them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "program/program.h"

namespace memsim_test {

// The number of allocations in the whole program (warm-up and measured steps).
inline size_t allocations(const memsim::Program& p) {
  size_t n = 0;
  for (const memsim::MemoryEvent& e : p.events) n += e.type == memsim::EventType::alloc;
  return n;
}

// Calls visit(e) for each alloc/free event of the measured step (from its
// "measured_step_begin" mark on) after mark `from`, up to mark `to` (to the end when `to` is
// empty or never comes), while visit returns true.
template <typename Visit>
void walk_step(const memsim::Program& p, const std::string& from, const std::string& to, Visit&& visit) {
  bool measured = false, in = false;
  for (const memsim::MemoryEvent& e : p.events) {
    if (e.type == memsim::EventType::mark) {
      const std::string& m = p.str(static_cast<uint32_t>(e.bytes));
      if (m == "measured_step_begin") measured = true;
      if (measured && m == from) in = true;
      if (measured && in && !to.empty() && m == to) return;
      continue;
    }
    if (!in || (e.type != memsim::EventType::alloc && e.type != memsim::EventType::free)) continue;
    if (!visit(e)) return;
  }
}

// The measured step's alloc/free events from mark `from` to mark `to` (as walk_step): each
// allocation "+BYTES op #K" (K counts the span's allocations from 0), each free "-#K" for a
// tensor allocated in the span, "-BYTES" for an older one, so lifetimes are part of the text.
inline std::vector<std::string> step_events(const memsim::Program& p, const std::string& from,
                                            const std::string& to = "") {
  std::vector<std::string> out;
  std::map<uint32_t, size_t> index;  // tensor id -> K
  walk_step(p, from, to, [&](const memsim::MemoryEvent& e) {
    if (e.type == memsim::EventType::alloc) {
      const size_t k = index.size();
      index[e.tensor] = k;
      out.push_back("+" + std::to_string(e.bytes) + " " + p.str(e.op) + " #" + std::to_string(k));
    } else {
      const auto it = index.find(e.tensor);
      out.push_back(it != index.end() ? "-#" + std::to_string(it->second)
                                      : "-" + std::to_string(p.tensors[e.tensor].bytes));
    }
    return true;
  });
  return out;
}

// step_events' text written by hand: add(bytes, op) appends "+BYTES op #K" and returns K
// (counting from the `k` it starts with), drop(K) appends "-#K".
struct ExpectedEvents {
  std::vector<std::string> v;
  size_t k = 0;
  size_t add(uint64_t bytes, const std::string& op) {
    v.push_back("+" + std::to_string(bytes) + " " + op + " #" + std::to_string(k));
    return k++;
  }
  void drop(size_t i) { v.push_back("-#" + std::to_string(i)); }
};

// The first n entries of v (all of v when it is shorter).
inline std::vector<std::string> head(const std::vector<std::string>& v, size_t n) {
  return std::vector<std::string>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(n, v.size())));
}

// Alloc (true) / free (false) events by requested bytes, the form both memsim and a CPU
// fixture can give.
using AllocFrees = std::vector<std::pair<bool, uint64_t>>;

// A fixture's "events" rows [kind, op, bytes] as AllocFrees.
inline AllocFrees fixture_alloc_frees(const nlohmann::json& fx) {
  AllocFrees out;
  for (const auto& e : fx["events"]) out.emplace_back(e[0] == "alloc", e[2].get<uint64_t>());
  return out;
}

// The measured step's first `count` alloc/free events from mark `from` on (a free counts
// its tensor's bytes).
inline AllocFrees measured_alloc_frees(const memsim::Program& p, const std::string& from, size_t count) {
  AllocFrees got;
  if (count == 0) return got;
  walk_step(p, from, "", [&](const memsim::MemoryEvent& e) {
    got.emplace_back(e.type == memsim::EventType::alloc,
                     e.type == memsim::EventType::alloc ? e.bytes : p.tensors[e.tensor].bytes);
    return got.size() < count;
  });
  return got;
}

// A coarse signature both sides can give: each allocation "+BYTES", and each run of frees
// between two allocations as "-[B1,B2,...]" (sorted). The CPU tracker of the fixtures
// (tools/fixtures/gen_clip_grad_fixtures.py and its siblings) sees a free only at the next
// aten op, so this is the resolution at which its order is real.
inline std::vector<std::string> coarse(const AllocFrees& events) {
  std::vector<std::string> out;
  std::vector<uint64_t> frees;
  auto flush = [&] {
    if (frees.empty()) return;
    std::sort(frees.begin(), frees.end());
    std::string s = "-[";
    for (size_t i = 0; i < frees.size(); ++i) s += (i ? "," : "") + std::to_string(frees[i]);
    out.push_back(s + "]");
    frees.clear();
  };
  for (const auto& [alloc, bytes] : events) {
    if (alloc) {
      flush();
      out.push_back("+" + std::to_string(bytes));
    } else {
      frees.push_back(bytes);
    }
  }
  flush();
  return out;
}

}  // namespace memsim_test
