// The --html report: one self-contained page (inline SVG, CSS and a small script, no
// network) showing a run's memory over time.
//
// Contract:
//  - A chart of allocated memory as stacked areas by breakdown category (parameters,
//    gradients, optimizer_state, activations, temporaries, other), the reserved curve,
//    shaded bands for the phases (forward, backward, optimizer, ...), the peak marked
//    with its value, the capacity line (when it is within reach of the curves, else a
//    note), and the OOM point when the run ran out of memory. With several curves
//    (`memsim compare`) each gets one allocated line and its own peak marker, over a
//    common "share of the step" axis, and no stack or bands.
//  - With an Analysis given: the verdict, the breakdown at the peak and the largest live
//    tensors there as tables, and PyTorch's OOM message.
//  - The page size is bounded: each curve is downsampled to at most kMaxHtmlPoints
//    points, keeping the maximum of every bucket (peaks are never smoothed away).
//  - Zoom (issue #19 item 5, tools/cli/html_zoom.h): drag, wheel, double-click / a reset
//    button zoom the timeline's x axis; without script the page is the same static chart.
//  - Per-layer view (issue #19 item 5, tools/cli/html_layers.h): with HtmlReport::layers,
//    the bytes live at the peak per layer and kind, as bars, a table and JSON.
//  - All text is HTML-escaped; the page references no external resource.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "program/program.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "tools/cli/html_layers.h"

namespace memsim::cli {

inline constexpr size_t kMaxHtmlPoints = 2000;
inline constexpr int kBreakdownCount = 6;  // the Breakdown fields, in their order

// One run's timeline, downsampled for drawing; small enough to keep for many runs.
struct HtmlCurve {
  struct Band {
    Phase phase = Phase::other;
    size_t begin = 0, end = 0;  // event indices [begin, end)
  };
  std::string label;
  size_t events = 0;  // executed events (the x range)
  std::vector<size_t> x;  // event index of each point (ascending)
  std::vector<uint64_t> allocated, reserved;  // bucket maxima
  // Breakdown at each point's allocated maximum; empty when by_kind was not recorded.
  std::vector<std::array<uint64_t, kBreakdownCount>> stack;
  std::vector<Band> bands;
  uint64_t peak_allocated = 0;
  std::optional<size_t> peak_index;
  std::optional<size_t> oom_index;
};

HtmlCurve downsample_timeline(const Program& program, const Timeline& timeline,
                              const Analysis& analysis, std::string label,
                              size_t max_points = kMaxHtmlPoints);
// The same without phase bands, for a timeline no Program describes (a replayed trace).
HtmlCurve downsample_timeline(const Timeline& timeline, const Analysis& analysis,
                              std::string label, size_t max_points = kMaxHtmlPoints);

struct HtmlReport {
  std::string title;
  std::vector<std::pair<std::string, std::string>> facts;  // scenario_facts()
  std::optional<uint64_t> capacity;  // bytes the allocator may use; nullopt = unlimited
  std::vector<HtmlCurve> curves;     // one (run) or one per policy (compare)
  std::vector<std::string> notes;    // extra lines under the title (e.g. per-policy verdicts)
  std::optional<HtmlLayerView> layers;  // run: the per-layer view at the peak (layer_view)
};

// Text made safe for HTML element content and attribute values.
std::string html_escape(const std::string& s);

// `detail` (optional): the Analysis of a single run, for the tables.
void write_html_report(std::FILE* out, const HtmlReport& report, const Analysis* detail);

}  // namespace memsim::cli
