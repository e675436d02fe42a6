#include "tools/cli/headroom_report.h"

#include "tools/cli/api.h"

#include <algorithm>

#include "allocator/units.h"
#include "tools/cli/setup_cache_report.h"

namespace memsim::cli {

RunHeadroom run_headroom_known(const Scenario& scenario, const MemoryStats& final_stats,
                               const Analysis& analysis, std::optional<uint64_t> needed) {
  RunHeadroom h;
  h.usable = allocator_limit(scenario.device, scenario.allocator);
  h.cuda_context = scenario.device.cuda_context;
  h.fraction_limited = scenario.allocator.memory_fraction.has_value();
  if (analysis.fits()) {
    h.warnings = fits_warnings(analysis, final_stats, h.usable);
    // FSDP built on the GPU: the setup's cached segments (one or two more simulations).
    if (std::optional<FitsWarning> w = setup_cache_warning(scenario, analysis)) h.warnings.push_back(*w);
  } else {
    h.needed = needed;
  }
  return h;
}

RunHeadroom run_headroom(const Scenario& scenario, const Program& program,
                         const MemoryStats& final_stats, const Analysis& analysis) {
  RunHeadroom h = run_headroom_known(scenario, final_stats, analysis, std::nullopt);
  if (analysis.fits()) return h;
  if (program.event_count() == program.events.size()) {
    h.needed = unlimited_peak_reserved(program, scenario.allocator, scenario.device.cuda_context);
  } else {
    // A streamed run kept no events: build the same Program again, stored this time.
    GenerateFacts facts;
    const Program stored = build_run_program(scenario, facts);
    h.needed = unlimited_peak_reserved(stored, scenario.allocator, scenario.device.cuda_context);
  }
  return h;
}

void add_headroom_json(Json& run, const RunHeadroom& h) {
  if (h.needed && run.contains("oom") && run["oom"].is_object()) {
    Json& oom = run["oom"];
    oom["needed_bytes"] = *h.needed;
    oom["usable_bytes"] = h.usable ? Json(*h.usable) : Json(nullptr);
    oom["over_bytes"] = h.usable ? Json(*h.needed > *h.usable ? *h.needed - *h.usable : 0) : Json(nullptr);
    // With memory_fraction the limit is a share of the total: no single total to name.
    oom["needed_capacity_bytes"] = h.fraction_limited ? Json(nullptr) : Json(*h.needed + h.cuda_context);
  }
  Json warnings = Json::array();
  for (const FitsWarning& w : h.warnings) warnings.push_back({{"kind", w.kind}, {"message", w.message}});
  run["warnings"] = std::move(warnings);
}

std::string needed_text(const RunHeadroom& h) {
  if (!h.needed) return "";
  std::string s = "needs " + human_bytes(*h.needed) + " reserved";
  if (h.usable) {
    const uint64_t over = *h.needed > *h.usable ? *h.needed - *h.usable : 0;
    s += ", " + human_bytes(over) + " over the " + human_bytes(*h.usable) + " usable";
  }
  return s;
}

}  // namespace memsim::cli
