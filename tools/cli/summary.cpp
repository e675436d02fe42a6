#include "tools/cli/summary.h"
#include "tools/cli/terminal_text.h"

#include <algorithm>
#include <cstdio>

#include "allocator/units.h"

namespace memsim::cli {
namespace {

// Left-aligned first column, right-aligned numbers: a table of plain strings, padded
// before styling so ANSI codes never upset the alignment.
struct Table {
  std::vector<std::vector<std::string>> rows;
  std::vector<bool> right;  // per column: right-align

  void print(std::FILE* out, const std::string& indent, const Style& style,
             bool bold_header) const {
    std::vector<size_t> width;
    for (const auto& row : rows) {
      if (width.size() < row.size()) width.resize(row.size(), 0);
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      std::string line = indent;
      for (size_t c = 0; c < rows[r].size(); ++c) {
        const std::string& cell = rows[r][c];
        const std::string pad(width[c] - cell.size(), ' ');
        const bool is_last = c + 1 == rows[r].size();
        const bool align_right = c < right.size() && right[c];
        line += align_right ? pad + cell : (is_last ? cell : cell + pad);
        if (!is_last) line += "  ";
      }
      if (r == 0 && bold_header) line = style.bold(line);
      std::fprintf(out, "%s\n", line.c_str());
    }
  }
};

std::string percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return buf;
}

// Which part of the run an event is in, when something comes before the measured step
// (SummaryHeader::measured_from > 0): the model's setup, then the warm-up steps, whose
// events carry the same op and phase names as the measured step's, so the label says
// which. "" when the whole run is measured.
std::string step_of(size_t measured_from, size_t index, Phase phase) {
  if (measured_from == 0) return "";
  if (index >= measured_from) return "measured step";
  return phase == Phase::setup ? "" : "warm-up";  // the setup phase names itself
}

std::string where(const std::string& op, Phase phase, int32_t layer, const std::string& step = "") {
  std::string s = (op.empty() ? std::string("?") : op) + " (" + to_string(phase);
  if (layer >= 0) s += ", layer " + std::to_string(layer);
  if (!step.empty()) s += ", " + step;
  return s + ")";
}

void section(std::FILE* out, const Style& style, const char* title) {
  std::fprintf(out, "\n%s\n", style.bold(title).c_str());
}

void print_verdict(std::FILE* out, const SummaryHeader& h, const Analysis& a,
                   const Style& style) {
  std::string capacity = h.capacity ? human_bytes(*h.capacity) + " usable" : h.capacity_text;
  if (a.fits()) {
    std::string used = h.capacity ? ", " + percent(a.peak_reserved, *h.capacity) + " reserved" : "";
    std::string verdict = style.good("FITS");
    if (!h.warnings.empty()) {
      std::string tags;
      for (const auto& [tag, message] : h.warnings) tags += (tags.empty() ? "" : "; ") + tag;
      verdict = style.warn("FITS (warning: " + tags + ")");
    }
    std::fprintf(out, "\n%s  peak allocated %s, peak reserved %s of %s%s\n", verdict.c_str(),
                 human_bytes(a.peak_allocated).c_str(), human_bytes(a.peak_reserved).c_str(),
                 capacity.c_str(), used.c_str());
    for (const auto& [tag, message] : h.warnings)
      std::fprintf(out, "  %s\n", style.warn("warning: " + message).c_str());
  } else {
    const OomReport& o = *a.oom;
    const std::string cap = o.capacity_bytes > 0 ? human_bytes(o.capacity_bytes) : capacity;
    std::fprintf(out, "\n%s  at event %zu: %s requesting %s (capacity %s)\n",
                 style.bad("OUT OF MEMORY").c_str(), o.index,
                 where(o.op, o.phase, o.layer, step_of(h.measured_from, o.index, o.phase)).c_str(), human_bytes(o.requested_bytes).c_str(),
                 cap.c_str());
    std::fprintf(out, "  allocated %s, reserved %s when it failed\n",
                 human_bytes(o.allocated_bytes).c_str(), human_bytes(o.reserved_bytes).c_str());
    if (!h.needed.empty()) std::fprintf(out, "  %s\n", style.bold(h.needed).c_str());
    const Breakdown& b = o.breakdown;
    if (b.total() > 0) {
      std::fprintf(out, "  live then: parameters %s, gradients %s, optimizer state %s, "
                   "activations %s, temporaries %s, other %s\n",
                   human_bytes(b.parameters).c_str(), human_bytes(b.gradients).c_str(),
                   human_bytes(b.optimizer_state).c_str(), human_bytes(b.activations).c_str(),
                   human_bytes(b.temporaries).c_str(), human_bytes(b.other).c_str());
    }
    if (!o.message.empty()) std::fprintf(out, "  %s\n", style.warn(o.message).c_str());
    std::fprintf(out, "  before the failure: peak allocated %s, peak reserved %s\n",
                 human_bytes(a.peak_allocated).c_str(), human_bytes(a.peak_reserved).c_str());
  }
  if (a.peak) {
    std::fprintf(out, "  peak at event %zu: %s\n", a.peak->index,
                 where(a.peak->op, a.peak->phase, a.peak->layer, step_of(h.measured_from, a.peak->index, a.peak->phase)).c_str());
  }
  if (h.measured_from > 0) {
    std::fprintf(out, "  %s: events 0-%zu; measured step: events %zu-%zu (peaks and marks are "
                 "the measured step's)\n",
                 h.warmup_steps > 0 ? ("setup and " + std::to_string(h.warmup_steps) + " warm-up step" +
                                       (h.warmup_steps > 1 ? "s" : ""))
                                          .c_str()
                                    : "setup",
                 h.measured_from - 1, h.measured_from, a.events > 0 ? a.events - 1 : 0);
  }
}

void print_breakdown(std::FILE* out, const Analysis& a, const Style& style) {
  const Breakdown& b = a.breakdown_at_peak;
  const uint64_t total = b.total();
  Table t;
  t.right = {false, true, true};
  t.rows.push_back({"kind", "bytes", "share"});
  const std::pair<const char*, uint64_t> entries[] = {
      {"parameters", b.parameters},   {"gradients", b.gradients},
      {"optimizer_state", b.optimizer_state}, {"activations", b.activations},
      {"temporaries", b.temporaries}, {"other", b.other}};
  for (const auto& [name, bytes] : entries) {
    t.rows.push_back({name, human_bytes(bytes), percent(bytes, total)});
  }
  t.rows.push_back({"total", human_bytes(total), percent(total, total)});
  section(out, style, "Breakdown at the peak (allocated)");
  t.print(out, "  ", style, false);
}

// One row per group of live tensors that differ only in a layer number (LiveSet::by_name),
// largest total first: "32 x model.layers.N.mlp.up_proj.weight, 86.00 MiB each".
void print_tensors(std::FILE* out, const Analysis& a, const Style& style) {
  const LiveSet& live = a.live_at_peak;
  if (live.by_name.empty() && live.largest.empty()) return;
  Table t;
  t.right = {true, false, true, false, false};
  t.rows.push_back({"bytes", "kind", "layer", "op", "tensor"});
  const size_t rows = std::min(live.by_name.size(), live.largest.size());  // top_n groups
  for (size_t i = 0; i < rows; ++i) {
    const NameGroup& g = live.by_name[i];
    std::string layer = "-";
    if (g.first_layer >= 0) {
      layer = std::to_string(g.first_layer);
      if (g.last_layer != g.first_layer) layer += "-" + std::to_string(g.last_layer);
    }
    std::string name = g.tensors == 1 ? g.example : g.name;
    if (name.empty()) name = "-";
    if (g.tensors > 1)
      name = std::to_string(g.tensors) + " x " + name + ", " + human_bytes(g.bytes_each) + " each";
    t.rows.push_back({human_bytes(g.bytes), to_string(g.kind), layer, g.op.empty() ? "-" : g.op,
                      printable(name)});
  }
  char title[96];
  std::snprintf(title, sizeof title, "Largest live tensors at the peak (%zu live, %s)",
                live.tensors, human_bytes(live.bytes).c_str());
  section(out, style, title);
  t.print(out, "  ", style, true);
}

void print_peaks(std::FILE* out, const Analysis& a, size_t measured_from, const Style& style) {
  if (a.top_peaks.size() < 2) return;
  Table t;
  t.right = {true, true, true, false};
  t.rows.push_back({"event", "allocated", "reserved", "where"});
  for (const EventPoint& p : a.top_peaks) {
    t.rows.push_back({std::to_string(p.index), human_bytes(p.allocated), human_bytes(p.reserved),
                      where(p.op, p.phase, p.layer, step_of(measured_from, p.index, p.phase))});
  }
  section(out, style, "Distinct peaks");
  t.print(out, "  ", style, true);
}

void print_marks(std::FILE* out, const Analysis& a, size_t measured_from, const Style& style) {
  Table t;
  t.right = {false, true, true};
  t.rows.push_back({"after", "allocated", "reserved"});
  bool any = false;
  for (const auto& [name, mark] : a.marks) {
    if (!mark) continue;
    any = true;
    t.rows.push_back({name, human_bytes(mark->allocated), human_bytes(mark->reserved)});
  }
  if (!any) return;
  section(out, style, measured_from > 0 ? "Marks (measured step)" : "Marks");
  t.print(out, "  ", style, true);
}

}  // namespace

std::string human_flops(double flops) {
  static const char* units[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
  int u = 0;
  while (flops >= 1000.0 && u < 6) {
    flops /= 1000.0;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", flops, units[u]);
  return buf;
}

void print_summary(std::FILE* out, const SummaryHeader& header, const Analysis& a,
                   const Style& style) {
  std::fprintf(out, "%s\n", style.bold(printable(header.title)).c_str());
  Table facts;
  for (const auto& [label, text] : header.facts) facts.rows.push_back({label, text});
  facts.print(out, "  ", style, false);

  print_verdict(out, header, a, style);
  if (a.peak) {
    print_breakdown(out, a, style);
    print_tensors(out, a, style);
    print_peaks(out, a, header.measured_from, style);
  }
  print_marks(out, a, header.measured_from, style);
  if (a.flops.forward + a.flops.backward + a.flops.recompute > 0) {
    std::fprintf(out, "\n%s  forward %s, backward %s, recompute %s\n", style.bold("FLOPs").c_str(),
                 human_flops(a.flops.forward).c_str(), human_flops(a.flops.backward).c_str(),
                 human_flops(a.flops.recompute).c_str());
  }
}

}  // namespace memsim::cli
