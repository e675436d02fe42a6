#include "tools/cli/compare_rows.h"

#include <cstdio>

#include "allocator/units.h"
#include "tools/cli/step_time_report.h"
#include "tools/cli/summary.h"

namespace memsim::cli {

std::string where_text(const std::optional<EventPoint>& at) {
  if (!at) return "-";
  std::string s = std::string(to_string(at->phase)) + ", " + at->op;
  if (at->layer >= 0) s += ", layer " + std::to_string(at->layer);
  return s;
}

CompareRow compare_row(const PolicyRun& r) {
  CompareRow row;
  const Analysis& a = r.analysis;
  row.policy = r.label;
  row.fits = a.fits();
  if (row.fits) {
    row.verdict = "fits";
  } else {
    const OomReport& o = *a.oom;
    row.verdict = "OOM at " + o.op + " (" + to_string(o.phase);
    if (o.layer >= 0) row.verdict += ", layer " + std::to_string(o.layer);
    row.verdict += ")";
  }
  row.peak_allocated = a.peak_allocated;
  row.peak_reserved = a.peak_reserved;
  row.peak = a.peak;
  const double total = a.flops.forward + a.flops.backward + a.flops.recompute;
  row.recompute_share = total > 0 ? a.flops.recompute / total : 0.0;
  row.recompute_flops = r.time.estimated ? r.time.recompute_flops : a.flops.recompute;
  if (r.time.estimated) {
    row.recompute_seconds = r.time.part[static_cast<int>(CostPart::recompute)];
    row.step_seconds = r.time.seconds;
  }
  row.host_offload_bytes = r.host_offload_bytes;
  return row;
}

std::vector<CompareRow> compare_rows(const std::vector<PolicyRun>& runs) {
  std::vector<CompareRow> rows;
  rows.reserve(runs.size());
  for (const PolicyRun& r : runs) rows.push_back(compare_row(r));
  return rows;
}

Json compare_row_json(const CompareRow& row) {
  Json peak = Json(nullptr);
  if (row.peak)
    peak = Json{{"phase", to_string(row.peak->phase)},
                {"op", row.peak->op},
                {"layer", row.peak->layer >= 0 ? Json(row.peak->layer) : Json(nullptr)},
                {"event", row.peak->index}};
  return Json{{"policy", row.policy},
              {"fits", row.fits},
              {"verdict", row.verdict},
              {"peak_allocated_bytes", row.peak_allocated},
              {"peak_reserved_bytes", row.peak_reserved},
              {"peak_at", std::move(peak)},
              {"recompute_flops", row.recompute_flops},
              {"recompute_share", row.recompute_share},
              {"recompute_seconds", row.recompute_seconds ? Json(*row.recompute_seconds) : Json(nullptr)},
              {"step_seconds", row.step_seconds ? Json(*row.step_seconds) : Json(nullptr)},
              {"host_offload_bytes", row.host_offload_bytes}};
}

std::vector<std::vector<std::string>> compare_table_cells(const std::vector<CompareRow>& rows) {
  bool offload = false;
  for (const CompareRow& r : rows) offload = offload || r.host_offload_bytes > 0;
  std::vector<std::string> head = {"policy", "verdict", "peak allocated", "peak reserved",
                                   "recompute", "recompute time", "step time"};
  if (offload) head.push_back("host offload");
  head.push_back("peak at");
  std::vector<std::vector<std::string>> cells = {head};
  for (const CompareRow& r : rows) {
    char share[64];
    std::snprintf(share, sizeof share, "%.1f%% (%s)", 100.0 * r.recompute_share,
                  human_flops(r.recompute_flops).c_str());
    std::vector<std::string> line = {
        r.policy, r.verdict, human_bytes(r.peak_allocated), human_bytes(r.peak_reserved), share,
        r.recompute_seconds ? human_seconds(*r.recompute_seconds) : "-",
        r.step_seconds ? human_seconds(*r.step_seconds) : "-"};
    if (offload) line.push_back(r.host_offload_bytes ? human_bytes(r.host_offload_bytes) : "-");
    line.push_back(where_text(r.peak));
    cells.push_back(std::move(line));
  }
  return cells;
}

}  // namespace memsim::cli
