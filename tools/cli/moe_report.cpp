#include "tools/cli/moe_report.h"

#include "graph/models/moe_routing.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "tools/cli/device.h"

namespace memsim::cli {

std::optional<MoeRoutingReport> moe_routing_report(const Scenario& scenario) {
  const graph::MoeSpec& moe = scenario.model.arch.moe;
  if (moe.experts <= 0) return std::nullopt;
  MoeRoutingReport r;
  r.routing = graph::describe_routing(moe);
  if (scenario.model.family != ModelFamily::megatron)
    r.experts_implementation = moe.impl == graph::ExpertsImpl::grouped_mm   ? "grouped_mm"
                               : moe.impl == graph::ExpertsImpl::batched_mm ? "batched_mm"
                                                                            : "eager";
  if (moe.routing != graph::MoeRouting::balanced) return r;
  Scenario worst = scenario;
  worst.model.arch.moe.routing = graph::MoeRouting::worst_case;
  const Program program = build_program(worst);
  auto device = make_device(worst.device);
  const Timeline timeline = execute(program, worst.allocator, *device, ExecuteOptions{});
  const Analysis analysis = analyze(program, timeline);
  r.worst_case_run = true;
  r.worst_peak_allocated = analysis.peak_allocated;
  r.worst_peak_reserved = analysis.peak_reserved;
  r.worst_fits = analysis.fits();
  return r;
}

}  // namespace memsim::cli
