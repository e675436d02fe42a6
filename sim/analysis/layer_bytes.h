// What is live at a named moment of a Program, by layer and by tensor kind, in requested
// (not allocator-rounded) bytes: the measure the published memory formulas use.
//
// Contract: walks the Program's events in order up to and including the first mark
// named `mark` (the whole Program when there is none) and sums the requested bytes of
// the tensors allocated and not yet freed there. A tensor counts for the layer of its
// alloc event (-1: outside the layers, reported in `outside`).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "program/program.h"

namespace memsim {

struct LiveBytes {
  bool found_mark = false;
  std::array<uint64_t, kTensorKindCount> by_kind{};
  // by_layer[l][kind]: live bytes allocated in layer l.
  std::vector<std::array<uint64_t, kTensorKindCount>> by_layer;
  std::array<uint64_t, kTensorKindCount> outside{};
};

LiveBytes live_bytes_at_mark(const Program& program, std::string_view mark);

// The same after event `event_index` (inclusive; the state a Timeline entry records, as
// live_set_at), for the HTML report's per-layer view at the peak (issue #19 item 5).
// found_mark is false; an index past the end means the whole Program.
LiveBytes live_bytes_after_event(const Program& program, size_t event_index);

}  // namespace memsim
