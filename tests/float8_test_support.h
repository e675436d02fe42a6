// Test support for the float8 suites (tests/test_float8.cpp: tensorwise,
// tests/test_float8_rowwise.cpp: rowwise): the small bf16 Llama both load with overrides
// (and, through event_span_test_support.h, the span helpers both use).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "event_span_test_support.h"
#include "scenario/scenario.h"
#include "scenario_error_test_support.h"

namespace memsim_test {

// A 2-layer bf16 Llama (flash attention, AdamW foreach, no workspaces) for float8 runs.
inline constexpr const char* kFloat8Llama =
    "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, kv_heads: 2, d_ff: 128, "
    "vocab: 1000, attention: flash}\n"
    "batch: {micro_batch: 2, seq_len: 32}\n"
    "precision: {params: bf16}\n"
    "optimizer: {type: adamw, impl: foreach}\n"
    "device: {cublas_workspace: 0, kernel_scratch: false}\n"
    "step: {warmup_steps: 1}\n";

// The error kFloat8Llama with these overrides loads with, empty when it loads.
inline std::string float8_error_of(const std::vector<std::pair<std::string, std::string>>& overrides) {
  return scenario_error(kFloat8Llama, "f8.yaml", overrides);
}

}  // namespace memsim_test
