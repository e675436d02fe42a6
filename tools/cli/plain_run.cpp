#include "tools/cli/plain_run.h"

#include <algorithm>
#include <utility>

#include "program/tensor_names.h"
#include "sim/analysis/headroom.h"
#include "sim/analysis/live_set.h"
#include "sim/analysis/stream_run.h"
#include "tools/cli/api.h"

namespace memsim::cli {

PlainRun run_plain(const Scenario& scenario, GenerateFacts& generate_facts, bool live_set) {
  PlainRun out;
  StreamOptions options;
  options.analysis = run_analysis_options(scenario);
  options.analysis.live_set = live_set;
  options.keep_live_allocs = live_set;  // renamed from the complete build after an OOM
  options.stop_at_oom = true;
  options.pipelined = true;  // the builder and the allocator on two cores
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
  whole.pipelined = true;
  // The failing tensor and the live set at the peak, named as the complete build names
  // them (a later op may name a tensor, e.g. "saved input of ... (recomputed)").
  whole.name_serials.push_back(r.oom_serial);
  for (const LiveAlloc& l : r.live_allocs) whole.name_serials.push_back(l.tensor);
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
  if (u.final_infos[0]) out.analysis.oom->tensor = tensor_name(program, *u.final_infos[0], r.oom_alloc);
  if (live_set && out.analysis.peak) {
    for (size_t k = 0; k < r.live_allocs.size(); ++k)
      if (u.final_infos[k + 1]) r.live_allocs[k].info = *u.final_infos[k + 1];
    out.analysis.live_at_peak = summarize_live_set(program, out.analysis.live_at_peak.event_index,
                                                   r.live_allocs, options.analysis.top_tensors);
  }
  out.measured_from = u.measured_mark.value_or(0);
  out.program = std::move(program);
  generate_facts = std::move(facts);
  return out;
}

}  // namespace memsim::cli
