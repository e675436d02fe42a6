// Requested bytes of each tensor kind (or of one) live at a named mark of a Program: the
// sharding and offload suites' check of parameters, gradients and optimizer state at
// forward_end, backward_end and optimizer_end. Fails the test when the mark is missing.
#pragma once

#include <array>
#include <cstdint>

#include <catch2/catch.hpp>

#include "program/program.h"
#include "sim/analysis/layer_bytes.h"

namespace memsim_test {

// Every kind's live bytes at the mark (fails the test when the mark is missing).
inline std::array<uint64_t, memsim::kTensorKindCount> live_at(const memsim::Program& p, const char* mark) {
  const memsim::LiveBytes l = memsim::live_bytes_at_mark(p, mark);
  REQUIRE(l.found_mark);
  return l.by_kind;
}

// One kind's entry of live_at's array.
inline uint64_t kind(const std::array<uint64_t, memsim::kTensorKindCount>& k, memsim::TensorKind t) {
  return k[static_cast<int>(t)];
}

inline uint64_t live(const memsim::Program& p, const char* mark, memsim::TensorKind k) {
  return kind(live_at(p, mark), k);
}

}  // namespace memsim_test
