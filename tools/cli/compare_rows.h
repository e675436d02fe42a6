// `memsim compare`'s table (issue #18 item 3): one row per policy, the same numbers in the
// text table, the JSON "rows" array and the HTML page's table, so the three cannot drift.
//
// Row fields: policy label; fits, or where it ran out of memory; peak allocated and peak
// reserved bytes of the measured step; where the allocated peak is (phase, op, layer,
// event); recompute FLOPs of the measured step and their share of all FLOPs; the time
// model's recompute seconds and step seconds (null when it refused the scenario); the
// pinned host bytes of activation offload (checkpoint.offload; 0 without it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tools/cli/api.h"
#include "tools/cli/json_report.h"

namespace memsim::cli {

struct CompareRow {
  std::string policy;
  bool fits = true;
  std::string verdict;  // "fits" or "OOM at OP (PHASE, layer L)"
  uint64_t peak_allocated = 0;
  uint64_t peak_reserved = 0;
  std::optional<EventPoint> peak;  // the measured step's allocated peak
  double recompute_flops = 0;      // the measured step's (time model); whole run if refused
  double recompute_share = 0;      // of forward + backward + recompute FLOPs (whole run)
  std::optional<double> recompute_seconds, step_seconds;
  uint64_t host_offload_bytes = 0;
};

CompareRow compare_row(const PolicyRun& run);
std::vector<CompareRow> compare_rows(const std::vector<PolicyRun>& runs);
// "backward, MmBackward0, layer 3" (phase, op, layer when there is one); "-" for none.
std::string where_text(const std::optional<EventPoint>& at);
Json compare_row_json(const CompareRow& row);
// The text table's cells, header first (the verb prints them aligned).
std::vector<std::vector<std::string>> compare_table_cells(const std::vector<CompareRow>& rows);

}  // namespace memsim::cli
