// What is live at one moment of a Program: recomputed by walking the events up to it.
//
// Why a walk and not stored state: a Timeline keeps only totals per event (a few words
// each), so keeping the live set of every event would cost O(events x tensors). Reports
// ask for one or two moments (the peak, the OOM), and one linear pass over the events is
// cheap next to executing them through the allocator.
//
// Contract:
//  - live_set_at(program, k) is the state *after* event k (as the Timeline's entries
//    are). k >= events.size() means after the last event.
//  - Bytes here are the tensors' requested sizes (what the Program knows). The Timeline's
//    per-kind totals are the allocator's rounded block sizes, so they can be slightly
//    larger; use those when the sum must equal allocated_bytes.
//  - Zero-byte tensors are never live (PyTorch never asks the allocator for them).
//  - Names are program/tensor_names.h's. by_name (filled when top_n > 0) collapses
//    repeats: every live tensor in exactly one group of equal (name_pattern(name), kind,
//    bytes), largest total first ("32 x model.layers.N.mlp.up_proj.weight, 86 MiB each").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "program/program.h"

namespace memsim {

struct LiveTensor {
  uint32_t tensor = 0;
  std::string name;
  TensorKind kind = TensorKind::other;
  uint64_t bytes = 0;
  std::string op;          // the op that allocated it
  Phase phase = Phase::other;
  int32_t layer = -1;      // -1 when not in a layer
  size_t alloc_event = 0;  // index of its alloc event
};

struct NamedBytes {
  std::string name;
  uint64_t bytes = 0;
  size_t tensors = 0;
};

struct LayerBytes {
  int32_t layer = -1;
  uint64_t bytes = 0;
  size_t tensors = 0;
};

// Live tensors whose names differ only in a layer/block number, of one kind and size.
struct NameGroup {
  std::string name;         // name_pattern of the members' names ("model.layers.N.mlp.up_proj.weight")
  std::string example;      // the first member's own name (the oldest)
  TensorKind kind = TensorKind::other;
  uint64_t bytes_each = 0;
  size_t tensors = 0;
  uint64_t bytes = 0;       // bytes_each * tensors
  int32_t first_layer = -1, last_layer = -1;  // range of the members' layers (-1: none)
  std::string op;           // the first member's allocating op
};

struct LiveSet {
  size_t event_index = 0;
  size_t tensors = 0;   // how many tensors are live
  uint64_t bytes = 0;   // their requested bytes
  std::array<uint64_t, kTensorKindCount> by_kind{};
  std::vector<LayerBytes> by_layer;  // ascending layer (-1, not in a layer, first)
  std::vector<NamedBytes> by_op;     // allocating op, largest first
  std::vector<LiveTensor> largest;   // the `top_n` largest, largest first (ties: oldest)
  std::vector<NameGroup> by_name;    // all live tensors by name pattern (empty when top_n == 0)
};

LiveSet live_set_at(const Program& program, size_t event_index, size_t top_n = 10);

// One live tensor and its alloc event (what the summary reads from it).
struct LiveAlloc {
  uint32_t tensor = 0;  // its id in a stored Program (a streamed run's: the serial)
  size_t event = 0;   // index of the alloc event
  MemoryEvent alloc;  // that event
  TensorInfo info;    // its TensorInfo (what names it): a copy, as ids may be recycled
};
// The LiveSet at `event_index` of the tensors `live` (ascending tensor id), the summary
// live_set_at makes after its walk; the streaming run (sim/analysis/stream_run.h) keeps
// the tensors' lifetimes instead of the events and calls it directly.
LiveSet summarize_live_set(const Program& program, size_t event_index,
                           const std::vector<LiveAlloc>& live, size_t top_n);

}  // namespace memsim
