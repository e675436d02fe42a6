// The HTML report's per-layer view (issue #19 item 5): what is live at the peak, by
// transformer layer and by breakdown category.
//
// Contract:
//  - layer_view(program, analysis) is nullopt without a peak event; else, after the peak
//    event (Analysis::peak), the live tensors' requested bytes (sim/analysis/layer_bytes.h's
//    live_bytes_after_event) per layer (the layer of each tensor's alloc event) and
//    outside every layer, mapped to the six categories of Breakdown (to_breakdown).
//    Requested sizes, not the allocator's rounded blocks: the sum can be a little below
//    the peak allocated.
//  - write_layer_view writes a section: a horizontal stacked bar per layer (and one for
//    "outside layers"), a table of the same numbers in a <details>, and the data as JSON
//    in <script type="application/json" id="memsim-layers">:
//      {"event": N, "categories": [six names], "layers": [{"layer": L, "bytes": [six]}],
//       "outside": [six]}
//    Text is HTML-escaped; nothing external is referenced.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "program/program.h"
#include "sim/analysis/analysis.h"

namespace memsim::cli {

inline constexpr int kHtmlCategoryCount = 6;  // the Breakdown fields, in their order
inline constexpr const char* kHtmlCategoryNames[kHtmlCategoryCount] = {
    "parameters", "gradients", "optimizer_state", "activations", "temporaries", "other"};
inline constexpr const char* kHtmlCategoryColors[kHtmlCategoryCount] = {
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#bab0ac"};

struct HtmlLayerView {
  size_t event = 0;   // the peak event
  std::string where;  // "op (phase, layer N)"
  std::vector<std::array<uint64_t, kHtmlCategoryCount>> by_layer;  // index = layer
  std::array<uint64_t, kHtmlCategoryCount> outside{};
};

std::optional<HtmlLayerView> layer_view(const Program& program, const Analysis& analysis);

void write_layer_view(std::FILE* out, const HtmlLayerView& view);

}  // namespace memsim::cli
