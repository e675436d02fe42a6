#include "tools/cli/html_report.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <string>

#include "allocator/units.h"
#include "tools/cli/html_zoom.h"

namespace memsim::cli {

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

static_assert(kBreakdownCount == kHtmlCategoryCount);
constexpr const auto& kCategoryNames = kHtmlCategoryNames;    // tools/cli/html_layers.h
constexpr const auto& kCategoryColors = kHtmlCategoryColors;
// Distinct line colours for compare's curves (cycled).
constexpr const char* kCurveColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                        "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

const char* band_color(Phase p) {
  switch (p) {
    case Phase::forward: return "#dbe9f6";
    case Phase::loss: return "#e4f2dc";
    case Phase::backward: return "#fbe3cf";
    case Phase::optimizer: return "#e9def3";
    case Phase::setup: return "#eeeeee";
    case Phase::other: return nullptr;  // no band
  }
  return nullptr;
}

std::array<uint64_t, kBreakdownCount> categories(const Breakdown& b) {
  return {b.parameters, b.gradients, b.optimizer_state, b.activations, b.temporaries, b.other};
}

std::string esc(const std::string& s) { return html_escape(s); }

std::string bytes_text(uint64_t b) {
  return human_bytes(b) + " (" + std::to_string(b) + " bytes)";
}

// The smallest 1/2/5 x 10^k step giving at most ~6 ticks up to `top`.
double decimal_step(double top) {
  const double raw = top / 6.0;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10.0 * p;
}

// The smallest 1/2/5 x 10^k step (in the binary unit, KiB/MiB/GiB/..., that labels
// `top`, so the tick labels read 2 GiB, 4 GiB rather than 1.86 GiB) giving at most ~6
// ticks up to `top`.
double tick_step(double top) {
  double unit = 1;
  while (top / unit >= 1024 && unit < 1099511627776.0) unit *= 1024;
  return unit * decimal_step(top / unit);
}

struct Frame {
  // Plot area inside the SVG.
  static constexpr double kWidth = 1000, kHeight = 420;
  static constexpr double kLeft = 90, kRight = 20, kTop = 24, kBottom = 40;
  double ymax = 1;
  double px(double share) const { return kLeft + share * (kWidth - kLeft - kRight); }
  double py(double bytes) const {
    return kTop + (1.0 - bytes / ymax) * (kHeight - kTop - kBottom);
  }
  double bottom() const { return kHeight - kBottom; }
};

// x of a curve's event index as a share of its run (each curve spans the full width).
double share(const HtmlCurve& c, size_t index) {
  return c.events > 1 ? static_cast<double>(index) / static_cast<double>(c.events - 1) : 0.0;
}

void point(std::string& s, double x, double y) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x, y);
  s += buf;
}

void write_svg(std::FILE* out, const HtmlReport& r) {
  Frame f;
  uint64_t top = 1;
  for (const HtmlCurve& c : r.curves) {
    for (uint64_t v : c.reserved) top = std::max(top, v);
    for (uint64_t v : c.allocated) top = std::max(top, v);
  }
  // The capacity line is drawn unless it would squash the curves below a quarter of
  // the chart height: "how close to the limit" is what the reader came for.
  const bool draw_capacity = r.capacity && *r.capacity <= top * 4;
  if (draw_capacity) top = std::max(top, *r.capacity);
  f.ymax = static_cast<double>(top) * 1.05;
  const bool single = r.curves.size() == 1;

  // The zoom script's contract (tools/cli/html_zoom.h): ids, the plot's x range, the
  // shapes that follow x in #memsim-zoom (clipped to the plot), and labels and markers
  // that must not stretch as class "zx" with their unzoomed x in data-x, outside it.
  std::fprintf(out, "<svg id=\"memsim-timeline\" viewBox=\"0 0 %.0f %.0f\" width=\"100%%\" role=\"img\" "
               "font-family=\"sans-serif\" font-size=\"12\" data-left=\"%.1f\" data-right=\"%.1f\" "
               "data-events=\"%zu\" data-single=\"%d\" style=\"cursor:crosshair\">\n",
               Frame::kWidth, Frame::kHeight, f.px(0), f.px(1), single ? r.curves[0].events : size_t{0},
               single ? 1 : 0);
  std::fprintf(out, "<defs><clipPath id=\"memsim-plot\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
               "height=\"%.1f\"/></clipPath></defs>\n",
               f.px(0), Frame::kTop - 1, f.px(1) - f.px(0), f.bottom() - Frame::kTop + 2);
  std::fputs("<g clip-path=\"url(#memsim-plot)\"><g id=\"memsim-zoom\">\n", out);
  std::string labels;  // outside the zoomed group, after it
  char buf[512];
  // Phase bands (single run only: compare's runs have different event axes).
  if (single) {
    const HtmlCurve& c = r.curves[0];
    for (const HtmlCurve::Band& b : c.bands) {
      const char* color = band_color(b.phase);
      if (color == nullptr) continue;
      const double x0 = f.px(share(c, b.begin)), x1 = f.px(share(c, b.end > 0 ? b.end - 1 : 0));
      std::fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">"
                   "<title>%s: events %zu-%zu</title></rect>\n",
                   x0, Frame::kTop, std::max(0.5, x1 - x0), f.bottom() - Frame::kTop, color,
                   to_string(b.phase), b.begin, b.end - 1);
      if (x1 - x0 > 40) {
        // data-x1: the band's end, so that a zoom starting inside the band keeps its label.
        std::snprintf(buf, sizeof buf, "<text class=\"zx\" data-x=\"%.1f\" data-x1=\"%.1f\" data-dx=\"3\" "
                      "x=\"%.1f\" y=\"%.1f\" fill=\"#666\">%s</text>\n", x0, x1, x0 + 3, Frame::kTop + 12,
                      to_string(b.phase));
        labels += buf;
      }
    }
  }
  // Grid lines (in the group: a zoomed horizontal line still spans the plot) and their
  // labels (outside: not stretched).
  const double step = tick_step(f.ymax);
  for (double v = 0; v <= f.ymax; v += step) {
    std::fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\" "
                 "vector-effect=\"non-scaling-stroke\"/>\n", f.px(0), f.px(1), f.py(v), f.py(v));
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                  Frame::kLeft - 6, f.py(v) + 4, esc(human_bytes(static_cast<uint64_t>(v))).c_str());
    labels += buf;
  }
  labels += "<text id=\"memsim-xcaption\" x=\"" + std::to_string(f.px(0.5)) + "\" y=\"" +
            std::to_string(Frame::kHeight - 8) + "\" text-anchor=\"middle\">" +
            (single ? "event index (0 to " + std::to_string(r.curves[0].events) + ")"
                    : std::string("share of the run's events (each policy spans the full width)")) +
            "</text>\n";

  if (single && !r.curves[0].stack.empty()) {
    // Stacked areas: category k fills between the cumulative sums k-1 and k.
    const HtmlCurve& c = r.curves[0];
    const size_t n = c.x.size();
    std::vector<uint64_t> below(n, 0), above(n, 0);
    for (int k = 0; k < kBreakdownCount; ++k) {
      for (size_t i = 0; i < n; ++i) above[i] = below[i] + c.stack[i][static_cast<size_t>(k)];
      std::string pts;
      for (size_t i = 0; i < n; ++i) point(pts, f.px(share(c, c.x[i])), f.py(above[i]));
      for (size_t i = n; i-- > 0;) point(pts, f.px(share(c, c.x[i])), f.py(below[i]));
      std::fprintf(out, "<polygon points=\"%s\" fill=\"%s\" fill-opacity=\"0.85\">"
                   "<title>%s</title></polygon>\n",
                   pts.c_str(), kCategoryColors[k], kCategoryNames[k]);
      below.swap(above);
    }
  }
  for (size_t ci = 0; ci < r.curves.size(); ++ci) {
    const HtmlCurve& c = r.curves[ci];
    const char* color = single ? "#222" : kCurveColors[ci % 8];
    std::string alloc_pts, res_pts;
    for (size_t i = 0; i < c.x.size(); ++i) {
      point(alloc_pts, f.px(share(c, c.x[i])), f.py(static_cast<double>(c.allocated[i])));
      point(res_pts, f.px(share(c, c.x[i])), f.py(static_cast<double>(c.reserved[i])));
    }
    if (single)
      std::fprintf(out, "<polyline points=\"%s\" fill=\"none\" stroke=\"#555\" "
                   "stroke-dasharray=\"5,3\" vector-effect=\"non-scaling-stroke\"><title>reserved</title></polyline>\n",
                   res_pts.c_str());
    std::fprintf(out, "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                 "vector-effect=\"non-scaling-stroke\"><title>allocated: %s</title></polyline>\n",
                 alloc_pts.c_str(), color, esc(c.label).c_str());
    if (c.peak_index) {
      const double x = f.px(share(c, *c.peak_index)), y = f.py(static_cast<double>(c.peak_allocated));
      std::snprintf(buf, sizeof buf, "<circle class=\"zx\" data-x=\"%.1f\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>"
                    "<text class=\"zx\" data-x=\"%.1f\" data-dx=\"6\" x=\"%.1f\" y=\"%.1f\" fill=\"%s\">peak %s</text>\n",
                    x, x, y, color, x, x + 6, y - 6, color, esc(human_bytes(c.peak_allocated)).c_str());
      labels += buf;
    }
    if (c.oom_index) {
      const double x = f.px(share(c, *c.oom_index));
      std::fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" "
                   "stroke-width=\"2\" vector-effect=\"non-scaling-stroke\"/>\n",
                   x, x, Frame::kTop, f.bottom());
      labels += "<text class=\"zx\" data-x=\"" + std::to_string(x) + "\" data-dx=\"-4\" x=\"" +
                std::to_string(x - 4) + "\" y=\"" + std::to_string(Frame::kTop + 26) +
                "\" fill=\"#c00\" text-anchor=\"end\">OOM" + (single ? "" : " (" + esc(c.label) + ")") +
                "</text>\n";
    }
  }
  std::fputs("</g></g>\n", out);
  if (draw_capacity) {
    const double y = f.py(static_cast<double>(*r.capacity));
    std::fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" "
                 "stroke-dasharray=\"8,4\"/><text x=\"%.1f\" y=\"%.1f\" fill=\"#c00\" "
                 "text-anchor=\"end\">capacity %s</text>\n",
                 // Label under the line: the phase-band labels sit along the top edge.
                 f.px(0), f.px(1), y, y, f.px(1) - 4, y + 14,
                 esc(human_bytes(*r.capacity)).c_str());
  }
  std::fputs(labels.c_str(), out);
  // The drag-to-zoom selection (tools/cli/html_zoom.h), hidden until a drag.
  std::fprintf(out, "<rect id=\"memsim-brush\" x=\"0\" y=\"%.1f\" width=\"0\" height=\"%.1f\" "
               "fill=\"#1f77b4\" fill-opacity=\"0.15\" style=\"display:none\"/>\n",
               Frame::kTop, f.bottom() - Frame::kTop);
  std::fputs("</svg>\n", out);
}

void write_legend(std::FILE* out, const HtmlReport& r) {
  std::fputs("<p class=\"legend\">", out);
  if (r.curves.size() == 1) {
    if (!r.curves[0].stack.empty())
      for (int k = 0; k < kBreakdownCount; ++k)
        std::fprintf(out, "<span><i style=\"background:%s\"></i>%s</span>", kCategoryColors[k],
                     kCategoryNames[k]);
    std::fputs("<span><i style=\"background:#222;height:2px\"></i>allocated</span>"
               "<span><i style=\"border-top:2px dashed #555;background:none\"></i>reserved</span>",
               out);
    for (Phase p : {Phase::forward, Phase::backward, Phase::optimizer})
      std::fprintf(out, "<span><i style=\"background:%s\"></i>%s</span>", band_color(p),
                   to_string(p));
  } else {
    for (size_t ci = 0; ci < r.curves.size(); ++ci)
      std::fprintf(out, "<span><i style=\"background:%s\"></i>%s: peak %s</span>",
                   kCurveColors[ci % 8], esc(r.curves[ci].label).c_str(),
                   esc(human_bytes(r.curves[ci].peak_allocated)).c_str());
  }
  std::fputs("</p>\n", out);
}

void write_tables(std::FILE* out, const Analysis& a) {
  std::fputs("<h2>Breakdown at the peak</h2>\n<table><tr><th>category</th><th>bytes</th>"
             "<th>share</th></tr>\n", out);
  const auto cats = categories(a.breakdown_at_peak);
  const uint64_t total = a.breakdown_at_peak.total();
  for (int k = 0; k < kBreakdownCount; ++k) {
    const uint64_t v = cats[static_cast<size_t>(k)];
    std::fprintf(out, "<tr><td><i style=\"background:%s\"></i>%s</td><td>%s</td>"
                 "<td>%.1f%%</td></tr>\n",
                 kCategoryColors[k], kCategoryNames[k], esc(bytes_text(v)).c_str(),
                 total ? 100.0 * static_cast<double>(v) / static_cast<double>(total) : 0.0);
  }
  std::fprintf(out, "<tr><th>total</th><th>%s</th><th></th></tr></table>\n",
               esc(bytes_text(total)).c_str());

  std::fputs("<h2>Largest live tensors at the peak</h2>\n<table><tr><th>tensor</th>"
             "<th>kind</th><th>bytes</th><th>op</th><th>phase</th><th>layer</th></tr>\n", out);
  for (const LiveTensor& t : a.live_at_peak.largest) {
    std::fprintf(out, "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
                 "<td>%s</td></tr>\n",
                 esc(t.name).c_str(), to_string(t.kind), esc(human_bytes(t.bytes)).c_str(),
                 esc(t.op).c_str(), to_string(t.phase),
                 t.layer >= 0 ? std::to_string(t.layer).c_str() : "");
  }
  std::fputs("</table>\n", out);

  // Every live tensor, repeats collapsed ("32 x model.layers.N.mlp.up_proj.weight"): the
  // largest groups (program/tensor_names.h, LiveSet::by_name).
  const LiveSet& live = a.live_at_peak;
  if (live.by_name.empty()) return;
  std::fputs("<h2>Live tensors at the peak, repeats collapsed</h2>\n<table><tr><th>tensor</th>"
             "<th>count</th><th>each</th><th>bytes</th><th>kind</th><th>layers</th><th>op</th></tr>\n",
             out);
  const size_t rows = std::min<size_t>(live.by_name.size(), 20);
  for (size_t i = 0; i < rows; ++i) {
    const NameGroup& g = live.by_name[i];
    std::string layers;
    if (g.first_layer >= 0) {
      layers = std::to_string(g.first_layer);
      if (g.last_layer != g.first_layer) layers += "-" + std::to_string(g.last_layer);
    }
    std::fprintf(out, "<tr><td>%s</td><td>%zu</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
                 "<td>%s</td></tr>\n",
                 esc(g.tensors == 1 ? g.example : g.name).c_str(), g.tensors,
                 esc(human_bytes(g.bytes_each)).c_str(), esc(human_bytes(g.bytes)).c_str(),
                 to_string(g.kind), layers.c_str(), esc(g.op).c_str());
  }
  std::fputs("</table>\n", out);
}

}  // namespace

HtmlCurve downsample_timeline(const Timeline& timeline, const Analysis& analysis,
                              std::string label, size_t max_points) {
  HtmlCurve c;
  c.label = std::move(label);
  const size_t n = timeline.size();
  c.events = n;
  c.peak_allocated = analysis.peak_allocated;
  if (analysis.peak) c.peak_index = analysis.peak->index;
  if (timeline.oom) c.oom_index = timeline.oom->event_index;
  if (c.oom_index) c.events = std::max(c.events, *c.oom_index + 1);
  const bool kinds = timeline.by_kind.size() == n;
  const size_t bucket = std::max<size_t>(1, (n + std::max<size_t>(max_points, 1) - 1) /
                                                std::max<size_t>(max_points, 1));
  for (size_t b = 0; b < n; b += bucket) {
    const size_t e = std::min(n, b + bucket);
    size_t m = b;
    uint64_t res = 0;
    for (size_t i = b; i < e; ++i) {
      if (timeline.allocated[i] > timeline.allocated[m]) m = i;
      res = std::max(res, timeline.reserved[i]);
    }
    c.x.push_back(m);
    c.allocated.push_back(timeline.allocated[m]);
    c.reserved.push_back(res);
    if (kinds) c.stack.push_back(categories(to_breakdown(timeline.by_kind[m])));
  }
  return c;
}

HtmlCurve downsample_timeline(const Program& program, const Timeline& timeline,
                              const Analysis& analysis, std::string label, size_t max_points) {
  HtmlCurve c = downsample_timeline(timeline, analysis, std::move(label), max_points);
  const size_t n = timeline.size();
  for (size_t i = 0; i < n; ++i) {
    const Phase p = program.events[i].phase;
    if (c.bands.empty() || c.bands.back().phase != p) c.bands.push_back({p, i, i + 1});
    else c.bands.back().end = i + 1;
  }
  return c;
}

void write_html_report(std::FILE* out, const HtmlReport& r, const Analysis* detail) {
  std::fprintf(out,
               "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
               "<title>memsim: %s</title>\n<style>\n"
               "body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1100px}\n"
               "table{border-collapse:collapse;margin:.5em 0}\n"
               "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}\n"
               "td:nth-child(3){text-align:right}\n"
               "i{display:inline-block;width:12px;height:12px;margin-right:4px;"
               "vertical-align:middle}\n"
               ".legend span{margin-right:14px}\n.fits{color:#080}.oom{color:#c00}\n"
               "pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em}\n"
               ".zoom{color:#666;font-size:90%%}\n"
               "</style></head><body>\n<h1>%s</h1>\n",
               esc(r.title).c_str(), esc(r.title).c_str());
  std::fputs("<table>\n", out);
  for (const auto& [label, text] : r.facts)
    std::fprintf(out, "<tr><th>%s</th><td>%s</td></tr>\n", esc(label).c_str(), esc(text).c_str());
  std::fprintf(out, "<tr><th>capacity</th><td>%s</td></tr>\n</table>\n",
               r.capacity ? esc(bytes_text(*r.capacity) + " usable").c_str() : "unlimited");
  if (detail != nullptr) {
    const Analysis& a = *detail;
    std::fprintf(out, "<p><b class=\"%s\">%s</b> &mdash; peak allocated <b>%s</b>, "
                 "peak reserved <b>%s</b>",
                 a.fits() ? "fits" : "oom", a.fits() ? "FITS" : "OUT OF MEMORY",
                 esc(bytes_text(a.peak_allocated)).c_str(),
                 esc(bytes_text(a.peak_reserved)).c_str());
    if (a.peak) {
      std::fprintf(out, " at event %zu (%s, %s", a.peak->index, esc(a.peak->op).c_str(),
                   to_string(a.peak->phase));
      if (a.peak->layer >= 0) std::fprintf(out, ", layer %d", a.peak->layer);
      std::fputs(")", out);
    }
    std::fputs("</p>\n", out);
  }
  for (const std::string& note : r.notes) std::fprintf(out, "<p>%s</p>\n", esc(note).c_str());
  if (!r.curves.empty()) {
    std::fputs("<p class=\"zoom\"><button id=\"memsim-zoom-reset\" type=\"button\">reset zoom</button> "
               "drag across the chart to zoom into a range, scroll to zoom around the pointer, "
               "double-click to see the whole run</p>\n", out);
    write_svg(out, r);
    write_legend(out, r);
    write_zoom_script(out);
  }
  if (r.capacity && !r.curves.empty()) {
    uint64_t top = 0;
    for (const HtmlCurve& c : r.curves)
      for (uint64_t v : c.reserved) top = std::max(top, v);
    if (*r.capacity > top * 4)
      std::fprintf(out, "<p>The capacity (%s) is off the chart's scale.</p>\n",
                   esc(human_bytes(*r.capacity)).c_str());
  }
  if (detail != nullptr) {
    if (detail->oom) {
      const OomReport& o = *detail->oom;
      std::fprintf(out, "<h2 class=\"oom\">Out of memory at event %zu</h2>\n<p>%s (%s) in %s, "
                   "requesting %s</p>\n<pre>%s</pre>\n",
                   o.index, esc(o.tensor).c_str(), to_string(o.kind), esc(o.op).c_str(),
                   esc(bytes_text(o.requested_bytes)).c_str(), esc(o.message).c_str());
    }
    write_tables(out, *detail);
  }
  if (r.layers) write_layer_view(out, *r.layers);
  std::fputs("<p style=\"color:#888\">Generated by memsim.</p>\n</body></html>\n", out);
}

}  // namespace memsim::cli
