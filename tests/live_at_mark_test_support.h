// Requested bytes of one tensor kind live at a named mark of a Program (the sharding and
// offload suites' check of parameters, gradients and optimizer state at forward_end,
// backward_end and optimizer_end). Fails the test when the mark is missing.
#pragma once

#include <cstdint>

#include <catch2/catch.hpp>

#include "program/program.h"
#include "sim/analysis/layer_bytes.h"

namespace memsim_test {

inline uint64_t live(const memsim::Program& p, const char* mark, memsim::TensorKind k) {
  const memsim::LiveBytes l = memsim::live_bytes_at_mark(p, mark);
  REQUIRE(l.found_mark);
  return l.by_kind[static_cast<int>(k)];
}

}  // namespace memsim_test
