#include "tools/cli/compare_html.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "allocator/units.h"
#include "tools/cli/html_report.h"

namespace memsim::cli {

namespace {

// Line colours per policy (cycled), and the phase bands' fills (as the single-run page).
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                   "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
constexpr size_t kColorCount = sizeof kColors / sizeof kColors[0];

const char* band_fill(Phase p) {
  switch (p) {
    case Phase::forward: return "#dbe9f6";
    case Phase::loss: return "#e4f2dc";
    case Phase::backward: return "#fbe3cf";
    case Phase::optimizer: return "#e9def3";
    case Phase::setup: return "#eeeeee";
    case Phase::other: return nullptr;
  }
  return nullptr;
}

// Plot area inside the SVG.
constexpr double kWidth = 1000, kLeft = 90, kRight = 20, kTop = 24, kBottom = 40;
constexpr double kLine = 14;  // one label line

// The smallest 1/2/5 x 10^k step of the binary unit labelling `top`, ~6 ticks.
double tick_step(double top) {
  double unit = 1;
  while (top / unit >= 1024 && unit < 1099511627776.0) unit *= 1024;
  const double raw = top / unit / 6.0;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return unit * m * p;
  return unit * 10.0 * p;
}

void point(std::string& s, double x, double y) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x, y);
  s += buf;
}

}  // namespace

PhaseAxis phase_axis(const std::vector<HtmlCurve>& curves) {
  PhaseAxis axis;
  size_t ref = 0;
  for (size_t i = 1; i < curves.size(); ++i)
    if (curves[i].bands.size() > curves[ref].bands.size()) ref = i;
  axis.aligned.assign(curves.size(), false);
  if (curves.empty() || curves[ref].bands.empty()) return axis;
  const std::vector<HtmlCurve::Band>& bands = curves[ref].bands;
  std::vector<double> raw(bands.size(), 0.0);
  for (size_t ci = 0; ci < curves.size(); ++ci) {
    const HtmlCurve& c = curves[ci];
    bool prefix = !c.bands.empty() && c.bands.size() <= bands.size();
    for (size_t k = 0; prefix && k < c.bands.size(); ++k) prefix = c.bands[k].phase == bands[k].phase;
    axis.aligned[ci] = prefix;
    if (!prefix) continue;
    for (size_t k = 0; k < c.bands.size(); ++k)
      raw[k] = std::max(raw[k], static_cast<double>(c.bands[k].end - c.bands[k].begin));
  }
  double total = 0;
  for (double w : raw) total += w;
  double at = 0;
  for (size_t k = 0; k < bands.size(); ++k) {
    const double w = total > 0 ? raw[k] / total : 0.0;
    axis.segments.push_back({bands[k].phase, at, w});
    at += w;
  }
  return axis;
}

double PhaseAxis::x(const std::vector<HtmlCurve>& curves, size_t ci, size_t index) const {
  const HtmlCurve& c = curves[ci];
  if (!aligned[ci] || segments.empty()) {  // its own event-share axis
    return c.events > 1 ? static_cast<double>(index) / static_cast<double>(c.events - 1) : 0.0;
  }
  // The band holding `index` (bands are contiguous and ascending); past the last band (the
  // event an OOM stopped at), the last band.
  auto it = std::upper_bound(c.bands.begin(), c.bands.end(), index,
                             [](size_t i, const HtmlCurve::Band& b) { return i < b.begin; });
  const size_t k = it == c.bands.begin() ? 0 : static_cast<size_t>(it - c.bands.begin()) - 1;
  const HtmlCurve::Band& b = c.bands[k];
  const Segment& s = segments[k];
  double len = static_cast<double>(b.end - b.begin);
  // A run that stopped (OOM) inside its last band: place its events at the pace of the
  // longest band there, so the stop shows how far into the phase it got.
  const bool truncated = c.oom_index.has_value() && k + 1 == c.bands.size();
  if (truncated) {
    double widest = 0;
    for (size_t o = 0; o < curves.size(); ++o)
      if (aligned[o] && k < curves[o].bands.size() && !(curves[o].oom_index && k + 1 == curves[o].bands.size()))
        widest = std::max(widest, static_cast<double>(curves[o].bands[k].end - curves[o].bands[k].begin));
    len = std::max(len, widest);
  }
  const double off = static_cast<double>(index >= b.begin ? index - b.begin : 0);
  const double frac = len > 1 ? std::min(1.0, off / (truncated ? len : len - 1)) : 0.0;
  return s.begin + frac * s.width;
}

void write_compare_html(std::FILE* out, const HtmlReport& r, const std::vector<CompareRow>& rows) {
  std::fprintf(out,
               "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
               "<title>memsim compare: %s</title>\n<style>\n"
               "body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1100px}\n"
               "table{border-collapse:collapse;margin:.5em 0}\n"
               "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}\n"
               "table.compare td.num{text-align:right}\n"
               "i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}\n"
               ".legend span{margin-right:14px}\n.fits{color:#080}.oom{color:#c00}\n"
               "</style></head><body>\n<h1>%s</h1>\n",
               html_escape(r.title).c_str(), html_escape(r.title).c_str());
  std::fputs("<table class=\"facts\">\n", out);
  for (const auto& [label, text] : r.facts)
    std::fprintf(out, "<tr><th>%s</th><td>%s</td></tr>\n", html_escape(label).c_str(), html_escape(text).c_str());
  std::fprintf(out, "<tr><th>capacity</th><td>%s</td></tr>\n</table>\n",
               r.capacity ? html_escape(human_bytes(*r.capacity) + " usable").c_str() : "unlimited");
  for (const std::string& note : r.notes) std::fprintf(out, "<p>%s</p>\n", html_escape(note).c_str());

  const std::vector<HtmlCurve>& curves = r.curves;
  const PhaseAxis axis = phase_axis(curves);
  // The OOM labels are stacked one line each under the top edge; the plot grows with them.
  size_t ooms = 0;
  for (const HtmlCurve& c : curves) ooms += c.oom_index ? 1 : 0;
  const double top_pad = kTop + kLine * static_cast<double>(ooms);
  const double height = 420 + kLine * static_cast<double>(ooms);
  uint64_t top = 1;
  for (const HtmlCurve& c : curves) {
    for (uint64_t v : c.reserved) top = std::max(top, v);
    for (uint64_t v : c.allocated) top = std::max(top, v);
  }
  const bool draw_capacity = r.capacity && *r.capacity <= top * 4;
  if (draw_capacity) top = std::max(top, *r.capacity);
  const double ymax = static_cast<double>(top) * 1.05;
  auto px = [](double share) { return kLeft + share * (kWidth - kLeft - kRight); };
  const double bottom = height - kBottom;
  auto py = [&](double bytes) { return top_pad + (1.0 - bytes / ymax) * (bottom - top_pad); };

  std::fprintf(out, "<svg class=\"compare\" viewBox=\"0 0 %.0f %.0f\" width=\"100%%\" role=\"img\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n", kWidth, height);
  for (const PhaseAxis::Segment& s : axis.segments) {  // the common phase bands
    const char* fill = band_fill(s.phase);
    if (fill == nullptr) continue;
    const double x0 = px(s.begin), w = std::max(0.5, px(s.begin + s.width) - x0);
    std::fprintf(out, "<rect class=\"phase\" data-phase=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                 "height=\"%.1f\" fill=\"%s\"><title>%s</title></rect>\n",
                 to_string(s.phase), x0, top_pad, w, bottom - top_pad, fill, to_string(s.phase));
    if (w > 50)
      std::fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#666\">%s</text>\n", x0 + 3,
                   bottom - 4, to_string(s.phase));
  }
  const double step = tick_step(ymax);
  for (double v = 0; v <= ymax; v += step)
    std::fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                 "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                 px(0), px(1), py(v), py(v), kLeft - 6, py(v) + 4,
                 html_escape(human_bytes(static_cast<uint64_t>(v))).c_str());
  std::fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px(0.5),
               height - 8,
               "the run's phases, aligned across policies (each phase as wide as the policy "
               "that spends most events in it)");
  size_t oom_row = 0;
  for (size_t ci = 0; ci < curves.size(); ++ci) {
    const HtmlCurve& c = curves[ci];
    const char* color = kColors[ci % kColorCount];
    std::string alloc_pts, res_pts;
    for (size_t i = 0; i < c.x.size(); ++i) {
      const double x = px(axis.x(curves, ci, c.x[i]));
      point(alloc_pts, x, py(static_cast<double>(c.allocated[i])));
      point(res_pts, x, py(static_cast<double>(c.reserved[i])));
    }
    std::fprintf(out, "<polyline class=\"reserved\" points=\"%s\" fill=\"none\" stroke=\"%s\" "
                 "stroke-dasharray=\"5,3\" stroke-opacity=\"0.8\"><title>reserved: %s</title></polyline>\n",
                 res_pts.c_str(), color, html_escape(c.label).c_str());
    std::fprintf(out, "<polyline class=\"allocated\" points=\"%s\" fill=\"none\" stroke=\"%s\" "
                 "stroke-width=\"1.5\"><title>allocated: %s</title></polyline>\n",
                 alloc_pts.c_str(), color, html_escape(c.label).c_str());
    if (c.peak_index)
      std::fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"><title>%s: peak "
                   "allocated %s</title></circle>\n",
                   px(axis.x(curves, ci, *c.peak_index)), py(static_cast<double>(c.peak_allocated)),
                   color, html_escape(c.label).c_str(), html_escape(human_bytes(c.peak_allocated)).c_str());
    if (c.oom_index) {
      const double x = px(axis.x(curves, ci, *c.oom_index));
      const double y = kTop + kLine * static_cast<double>(oom_row++);  // one line per OOM label
      const bool right = x < px(0.5);  // keep the label inside the plot
      std::fprintf(out, "<line class=\"oom\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" "
                   "stroke=\"%s\" stroke-width=\"2\"/><text class=\"oom\" x=\"%.1f\" y=\"%.1f\" "
                   "fill=\"%s\" text-anchor=\"%s\">OOM: %s</text>\n",
                   x, x, y - 4, bottom, color, right ? x + 4 : x - 4, y + 6, color,
                   right ? "start" : "end", html_escape(c.label).c_str());
    }
  }
  if (draw_capacity) {
    const double y = py(static_cast<double>(*r.capacity));
    std::fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" "
                 "stroke-dasharray=\"8,4\"/><text x=\"%.1f\" y=\"%.1f\" fill=\"#c00\" "
                 "text-anchor=\"end\">capacity %s</text>\n",
                 px(0), px(1), y, y, px(1) - 4, y + 14, html_escape(human_bytes(*r.capacity)).c_str());
  }
  std::fputs("</svg>\n<p class=\"legend\">", out);
  for (size_t ci = 0; ci < curves.size(); ++ci)
    std::fprintf(out, "<span><i style=\"background:%s\"></i>%s</span>", kColors[ci % kColorCount],
                 html_escape(curves[ci].label).c_str());
  std::fputs("<span>solid: allocated, dashed: reserved</span></p>\n", out);
  for (size_t ci = 0; ci < curves.size(); ++ci)
    if (!axis.aligned[ci])
      std::fprintf(out, "<p>%s: its phases differ from the other runs'; drawn on its own "
                   "event-share axis.</p>\n", html_escape(curves[ci].label).c_str());
  if (r.capacity && !draw_capacity)
    std::fprintf(out, "<p>The capacity (%s) is off the chart's scale.</p>\n",
                 html_escape(human_bytes(*r.capacity)).c_str());

  // The table under the plot: the text table's cells (tools/cli/compare_rows.h).
  const std::vector<std::vector<std::string>> cells = compare_table_cells(rows);
  std::fputs("<h2>Policies</h2>\n<table class=\"compare\">\n<tr>", out);
  for (const std::string& h : cells[0]) std::fprintf(out, "<th>%s</th>", html_escape(h).c_str());
  std::fputs("</tr>\n", out);
  for (size_t ri = 1; ri < cells.size(); ++ri) {
    const CompareRow& row = rows[ri - 1];
    std::fputs("<tr>", out);
    for (size_t c = 0; c < cells[ri].size(); ++c) {
      if (c == 0)
        std::fprintf(out, "<td><i style=\"background:%s\"></i>%s</td>",
                     kColors[(ri - 1) % kColorCount], html_escape(cells[ri][c]).c_str());
      else if (c == 1)
        std::fprintf(out, "<td class=\"%s\">%s</td>", row.fits ? "fits" : "oom", html_escape(cells[ri][c]).c_str());
      else
        std::fprintf(out, "<td%s>%s</td>", c + 1 < cells[ri].size() ? " class=\"num\"" : "",
                     html_escape(cells[ri][c]).c_str());
    }
    std::fputs("</tr>\n", out);
  }
  std::fputs("</table>\n<p style=\"color:#888\">Generated by memsim.</p>\n</body></html>\n", out);
}

}  // namespace memsim::cli
