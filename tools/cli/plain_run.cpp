#include "tools/cli/plain_run.h"

#include <algorithm>
#include <utility>

#include "sim/analysis/headroom.h"
#include "sim/analysis/stream_run.h"
#include "tools/cli/api.h"

namespace memsim::cli {

PlainRun run_plain(const Scenario& scenario, GenerateFacts& generate_facts) {
  PlainRun out;
  StreamOptions options;
  options.analysis = run_analysis_options(scenario);
  options.stop_at_oom = true;
  StreamResult r = stream_run_program(scenario, generate_facts, out.program, options);
  out.analysis = std::move(r.analysis);
  out.final_stats = r.final_stats;
  out.measured_from = r.measured_mark.value_or(0);
  out.stopped = !r.complete;
  out.stopped_events = out.analysis.events;
  if (!out.analysis.oom) return out;

  // The whole Program on an unlimited device (sim/analysis/headroom.h's device; the
  // scenario, and so the Program, unchanged): the needed bytes, and the whole step's
  // facts the stopped build did not reach.
  SimulatedDevice device(unlimited_device_bytes(scenario.allocator), scenario.device.cuda_context);
  StreamOptions whole;
  whole.analysis = run_analysis_options(scenario);
  whole.analysis.live_set = false;  // only totals are read
  whole.name_serial = r.oom_serial;
  GenerateFacts facts;
  Program program;
  StreamResult u = stream_run_program(scenario, facts, program, whole, device);
  out.needed = u.analysis.oom ? std::nullopt
                              : std::optional<uint64_t>(std::max<uint64_t>(
                                    u.reserved_high,
                                    static_cast<uint64_t>(std::max<int64_t>(
                                        0, u.final_stats.reserved_bytes.all.peak))));
  out.analysis.events = u.analysis.events;
  out.analysis.flops = u.analysis.flops;
  if (u.named) out.analysis.oom->tensor = *u.named;
  out.measured_from = u.measured_mark.value_or(0);
  out.program = std::move(program);
  generate_facts = std::move(facts);
  return out;
}

}  // namespace memsim::cli
