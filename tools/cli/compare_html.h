// `memsim compare --html` (issue #18 item 3): one self-contained page (inline SVG and CSS,
// no script, no network) with every policy's memory curve on a phase-aligned time axis and
// the comparison table under the plot.
//
// Contract:
//  - The x axis is a sequence of phase segments (setup, forward, loss, backward, optimizer,
//    ... as the runs' events go, warm-up steps included). Every run walks the same script,
//    so its k-th phase band is the k-th segment for every policy; a segment's width is the
//    largest event count any policy spends in that band (the policy that recomputes, or
//    unpacks offloaded tensors, widens its backward), and each policy's events are spread
//    evenly over their own band. Forward, backward and optimizer of all policies therefore
//    start at the same x. A run that ran out of memory stops inside its band. A run whose
//    phase sequence differs from the longest one (no shipped script does that) is drawn
//    on its own event-share axis, and the page says so.
//  - Per policy: the allocated curve (solid) and, beside it, the reserved curve (dashed,
//    same colour); the peak marked; an OOM point drawn as a vertical line whose label is
//    staggered one line per OOM policy so that labels never overlap.
//  - Under the plot, the table of tools/cli/compare_rows.h (one row per policy).
//  - All text is HTML-escaped; the page size is bounded by the curves' downsampling
//    (tools/cli/html_report.h kMaxHtmlPoints per curve).
#pragma once

#include <cstdio>
#include <vector>

#include "tools/cli/compare_rows.h"
#include "tools/cli/html_report.h"

namespace memsim::cli {

// The phase-aligned axis of a set of curves (see the contract).
struct PhaseAxis {
  struct Segment {
    Phase phase = Phase::other;
    double begin = 0, width = 0;  // shares of the plot width, summing to 1
  };
  std::vector<Segment> segments;
  std::vector<bool> aligned;  // per curve: false = drawn on its own event-share axis
  // x (a share of the plot width, 0..1) of event `index` of curve `c` (curve number ci).
  double x(const std::vector<HtmlCurve>& curves, size_t ci, size_t index) const;
};
PhaseAxis phase_axis(const std::vector<HtmlCurve>& curves);

// report.curves: one per policy, in the rows' order; report.notes are printed too.
void write_compare_html(std::FILE* out, const HtmlReport& report, const std::vector<CompareRow>& rows);

}  // namespace memsim::cli
