// The HTML report's timeline zoom (issue #19 item 5): a small inline script, no library.
//
// Contract with the SVG that write_html_report draws (tools/cli/html_report.cpp):
//  - the chart is <svg id="memsim-timeline" data-left=L data-right=R data-events=N
//    data-single=0|1>, where [L, R] is the plot's x range in viewBox units and N the
//    run's events (the x axis of a single run: event 0 .. N-1; of several: a share);
//  - the shapes that follow x (phase bands, stacked areas, curves, the OOM line) are in
//    <g id="memsim-zoom">, inside a group clipped to the plot; the script gives it
//    transform="translate(t,0) scale(k,1)" (lines keep their width through
//    vector-effect="non-scaling-stroke");
//  - labels and markers that must not stretch carry class="zx" and data-x (their x at zoom
//    1); the script moves them (cx for a circle, x otherwise) and hides those outside; a
//    phase band's label also has data-x1 (the band's end) and stays at the band's
//    visible start while at least 40 units of the band show;
//  - <text id="memsim-xcaption"> gets the visible range ("events A to B of N").
// Interaction: drag across the chart to zoom into the dragged range, the wheel zooms
// around the pointer, double-click or the "reset zoom" button (id memsim-zoom-reset)
// resets. Only x zooms: the y axis stays the whole run's.
// The curve is the report's downsampled one (at most kMaxHtmlPoints bucket maxima):
// zooming magnifies those points, it does not add events.
// For tests: a page opened with "#zoom=A,B" (shares of the x range) starts zoomed there;
// the script then sets data-zoom="A,B" on the svg (chromium --dump-dom shows it).
#pragma once

#include <cstdio>

namespace memsim::cli {

void write_zoom_script(std::FILE* out);

}  // namespace memsim::cli
