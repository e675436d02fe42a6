#include "tools/cli/html_layers.h"

#include <algorithm>

#include "allocator/units.h"
#include "sim/analysis/layer_bytes.h"
#include "tools/cli/html_report.h"

namespace memsim::cli {

namespace {

std::array<uint64_t, kHtmlCategoryCount> categories(const std::array<uint64_t, kTensorKindCount>& by_kind) {
  const Breakdown b = to_breakdown(by_kind);
  return {b.parameters, b.gradients, b.optimizer_state, b.activations, b.temporaries, b.other};
}

uint64_t sum(const std::array<uint64_t, kHtmlCategoryCount>& a) {
  uint64_t s = 0;
  for (uint64_t v : a) s += v;
  return s;
}

void json_array(std::FILE* out, const std::array<uint64_t, kHtmlCategoryCount>& a) {
  std::fputc('[', out);
  for (int k = 0; k < kHtmlCategoryCount; ++k)
    std::fprintf(out, "%s%llu", k ? "," : "", static_cast<unsigned long long>(a[static_cast<size_t>(k)]));
  std::fputc(']', out);
}

// One bar: its label, then a rect per non-empty category, then the total.
void bar(std::FILE* out, const std::string& label, const std::array<uint64_t, kHtmlCategoryCount>& a,
         double y, double scale) {
  constexpr double kLabel = 110, kRow = 12;
  std::fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", kLabel - 6,
               y + kRow - 2, html_escape(label).c_str());
  double x = kLabel;
  for (int k = 0; k < kHtmlCategoryCount; ++k) {
    const uint64_t v = a[static_cast<size_t>(k)];
    if (v == 0) continue;
    const double w = static_cast<double>(v) * scale;
    std::fprintf(out, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\">"
                 "<title>%s %s: %s</title></rect>\n",
                 x, y, std::max(w, 0.3), kRow, kHtmlCategoryColors[k], html_escape(label).c_str(),
                 kHtmlCategoryNames[k], html_escape(human_bytes(v)).c_str());
    x += w;
  }
  std::fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#444\">%s</text>\n", x + 4, y + kRow - 2,
               html_escape(human_bytes(sum(a))).c_str());
}

}  // namespace

std::optional<HtmlLayerView> layer_view(const Program& program, const Analysis& analysis) {
  if (!analysis.peak) return std::nullopt;
  HtmlLayerView v;
  v.event = analysis.peak->index;
  v.where = analysis.peak->op + " (" + to_string(analysis.peak->phase) +
            (analysis.peak->layer >= 0 ? ", layer " + std::to_string(analysis.peak->layer) : "") + ")";
  const LiveBytes live = live_bytes_after_event(program, v.event);
  for (const auto& layer : live.by_layer) v.by_layer.push_back(categories(layer));
  v.outside = categories(live.outside);
  return v;
}

void write_layer_view(std::FILE* out, const HtmlLayerView& v) {
  uint64_t top = std::max<uint64_t>(1, sum(v.outside));
  for (const auto& l : v.by_layer) top = std::max(top, sum(l));
  const size_t rows = v.by_layer.size() + 1;
  constexpr double kWidth = 1000, kLabel = 110, kRight = 90, kRow = 12, kGap = 3, kTop = 4;
  const double scale = (kWidth - kLabel - kRight) / static_cast<double>(top);
  const double height = kTop * 2 + static_cast<double>(rows) * (kRow + kGap);

  std::fprintf(out, "<h2 id=\"layers\">Bytes per layer at the peak</h2>\n<p>Live tensors after event "
               "%zu, %s, by the layer of the op that allocated them and by kind (requested bytes: "
               "the allocator's rounding is not included). The optimizer allocates its state "
               "and its step's temporaries outside the layers: they count there.</p>\n",
               v.event, html_escape(v.where).c_str());
  std::fprintf(out, "<svg id=\"memsim-layer-chart\" viewBox=\"0 0 %.0f %.0f\" width=\"100%%\" "
               "role=\"img\" font-family=\"sans-serif\" font-size=\"10\">\n", kWidth, height);
  double y = kTop;
  for (size_t l = 0; l < v.by_layer.size(); ++l, y += kRow + kGap)
    bar(out, "layer " + std::to_string(l), v.by_layer[l], y, scale);
  bar(out, "outside layers", v.outside, y, scale);
  std::fputs("</svg>\n", out);

  std::fputs("<details><summary>Table</summary>\n<table class=\"layers\"><tr><th>layer</th>", out);
  for (const char* name : kHtmlCategoryNames) std::fprintf(out, "<th>%s</th>", name);
  std::fputs("<th>total</th></tr>\n", out);
  auto row = [&](const std::string& label, const std::array<uint64_t, kHtmlCategoryCount>& a) {
    std::fprintf(out, "<tr><td>%s</td>", html_escape(label).c_str());
    for (uint64_t b : a) std::fprintf(out, "<td>%s</td>", html_escape(human_bytes(b)).c_str());
    std::fprintf(out, "<td>%s</td></tr>\n", html_escape(human_bytes(sum(a))).c_str());
  };
  for (size_t l = 0; l < v.by_layer.size(); ++l) row(std::to_string(l), v.by_layer[l]);
  row("outside layers", v.outside);
  std::fputs("</table></details>\n", out);

  // The numbers, exact, for scripts and tests.
  std::fprintf(out, "<script type=\"application/json\" id=\"memsim-layers\">{\"event\":%zu,\"categories\":[",
               v.event);
  for (int k = 0; k < kHtmlCategoryCount; ++k) std::fprintf(out, "%s\"%s\"", k ? "," : "", kHtmlCategoryNames[k]);
  std::fputs("],\"layers\":[", out);
  for (size_t l = 0; l < v.by_layer.size(); ++l) {
    std::fprintf(out, "%s{\"layer\":%zu,\"bytes\":", l ? "," : "", l);
    json_array(out, v.by_layer[l]);
    std::fputc('}', out);
  }
  std::fputs("],\"outside\":", out);
  json_array(out, v.outside);
  std::fputs("}</script>\n", out);
}

}  // namespace memsim::cli
