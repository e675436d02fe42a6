// Test support for the DeepSpeed ZeRO suites (test_deepspeed.cpp,
// test_deepspeed_grad_accum.cpp): the small Llama both use, and what a Program allocates,
// keeps and frees under a tensor-name glob (program/tensor_names.h's names).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "program/tensor_names.h"
#include "scenario/scenario.h"
#include "test_paths.h"

namespace memsim_test::deepspeed {

using namespace memsim;

// hf-llama, 2 layers, d_model 64, d_ff 128, vocab 256, untied: numel
//   embed 16384; per layer q,k,v,o 4096 each, gate/up/down 8192 each, two norms 64 each
//   (41088); final norm 64; lm_head 16384: total 115008.
constexpr uint64_t kTotal = 115008;

inline std::string small_llama(int64_t d, const std::string& parallel_extra, const std::string& extra = "") {
  std::string y =
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 4\n"
      "  d_ff: 128\n  vocab: 256\n  context_length: 32\n  tied_embeddings: false\n"
      "batch:\n  micro_batch: 2\n  seq_len: 32\n"
      "precision:\n  params: bf16\n"
      "step:\n  kind: train\n  warmup_steps: 1\n"
      "parallel:\n  data: " + std::to_string(d) + "\n  sharding: deepspeed\n" + parallel_extra +
      "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n" + extra;
  return y;
}

inline Scenario load(const std::string& text,
                     const std::vector<std::pair<std::string, std::string>>& overrides = {}) {
  return load_scenario_text(text, "ds.yaml", overrides);
}

// Does tensor name `n` match `glob` ('*' matches any run of characters)? The names are
// program/tensor_names.h's, per parameter or sub group: a glob picks a family of them.
inline bool matches(const char* g, const char* n) {
  if (*g == '\0') return *n == '\0';
  if (*g == '*') return matches(g + 1, n) || (*n != '\0' && matches(g, n + 1));
  return *n == *g && matches(g + 1, n + 1);
}
inline bool named_as(const TensorNames& names, uint32_t t, const std::string& glob) {
  return matches(glob.c_str(), names.name(t).c_str());
}

// Allocation sizes of tensors named `name` (a glob), in event order.
inline std::vector<uint64_t> allocs(const Program& p, const std::string& name) {
  const TensorNames names(p);
  std::vector<uint64_t> out;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && named_as(names, e.tensor, name)) out.push_back(e.bytes);
  return out;
}

inline size_t mark_index(const Program& p, const std::string& mark) {
  for (size_t i = 0; i < p.events.size(); ++i)
    if (p.events[i].type == EventType::mark && p.str(static_cast<uint32_t>(p.events[i].bytes)) == mark)
      return i;
  return SIZE_MAX;
}

// Allocs of `name` from event `from` on.
inline size_t count_after(const Program& p, const std::string& name, size_t from) {
  const TensorNames names(p);
  size_t n = 0;
  for (size_t i = from; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc && named_as(names, e.tensor, name)) ++n;
  }
  return n;
}

// Bytes of tensors named `glob` alive just before event `at`, leaving out names that
// contain `except` (when given).
inline uint64_t live_named_before(const Program& p, const std::string& glob, size_t at,
                                  const std::string& except = "") {
  const TensorNames names(p);
  std::vector<char> alive(p.tensors.size(), 0);
  for (size_t i = 0; i < at; ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc) alive[e.tensor] = 1;
    if (e.type == EventType::free) alive[e.tensor] = 0;
  }
  uint64_t b = 0;
  for (size_t t = 0; t < p.tensors.size(); ++t)
    if (alive[t] && named_as(names, static_cast<uint32_t>(t), glob) &&
        (except.empty() || names.name(static_cast<uint32_t>(t)).find(except) == std::string::npos))
      b += p.tensors[t].bytes;
  return b;
}

// Bytes alive at the end of the program, by tensor name.
inline uint64_t live_at_end(const Program& p, const std::string& name) {
  return live_named_before(p, name, p.events.size());
}

// DeepSpeed's own allocations in [from, to) (names with "ZeRO-", and the scaled loss's
// where with_scaled_loss): name and requested bytes, in order.
using Allocs = std::vector<std::pair<std::string, uint64_t>>;
inline Allocs ds_allocs(const Program& p, size_t from, size_t to, bool with_scaled_loss) {
  const TensorNames names(p);
  Allocs out;
  for (size_t i = from; i < to; ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type != EventType::alloc) continue;
    const std::string n = names.name(e.tensor);
    if (n.find("ZeRO-") != std::string::npos || (with_scaled_loss && n.find("scaled loss") != std::string::npos))
      out.emplace_back(n, e.bytes);
  }
  return out;
}

inline std::string data(const std::string& f) { return std::string(MEMSIM_SOURCE_DIR) + "/tests/data/deepspeed/" + f; }


}  // namespace memsim_test::deepspeed
