// What `memsim run` says about its distance to the memory limit (issue #19 item 2;
// sim/analysis/headroom.h computes it): an OOM's needed bytes, a FITS run's warnings.
//
// JSON, added to the run object by add_headroom_json:
//   oom.needed_bytes    the peak reserved of the same Program with unlimited memory
//   oom.usable_bytes    what the allocator may reserve here (capacity - cuda_context, or
//                       less with allocator.memory_fraction)
//   oom.over_bytes      needed - usable (how far over)
//   oom.needed_capacity_bytes  needed + cuda_context: a device.capacity with which the
//                       run fits (null with allocator.memory_fraction)
//   warnings            [{kind, message}]: always present, empty for an OOM or a run with
//                       room to spare; kind "cache_flush", "near_capacity" or
//                       "setup_cache" (tools/cli/setup_cache_report.h)
// The exit status does not change: 0 for FITS with or without warnings, 3 for an OOM.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/headroom.h"
#include "sim/step/execute.h"
#include "tools/cli/json_report.h"

namespace memsim::cli {

struct RunHeadroom {
  std::optional<uint64_t> usable;  // nullopt: unlimited device
  uint64_t cuda_context = 0;
  bool fraction_limited = false;   // allocator.memory_fraction set
  std::optional<uint64_t> needed;  // OOM runs: unlimited_peak_reserved
  std::vector<FitsWarning> warnings;
};

// For an OOM, re-executes `program` on an unlimited device (one more simulation). A
// streamed Program (issue #20: its events were handed on, not kept) is built again first.
// `final_stats`: the allocator's memory_stats() at the end of the run.
RunHeadroom run_headroom(const Scenario& scenario, const Program& program,
                         const MemoryStats& final_stats, const Analysis& analysis);

// The same when an OOM's needed bytes are known already (tools/cli/plain_run.h: the
// unlimited rebuild of a run stopped at its OOM); `needed` is ignored for a run that fits.
RunHeadroom run_headroom_known(const Scenario& scenario, const MemoryStats& final_stats,
                               const Analysis& analysis, std::optional<uint64_t> needed);

void add_headroom_json(Json& run, const RunHeadroom& headroom);

// "needs 95.2 GiB reserved, 16.1 GiB over the 79.1 GiB usable"; "" when not an OOM or
// when the unlimited run failed too.
std::string needed_text(const RunHeadroom& headroom);

}  // namespace memsim::cli
