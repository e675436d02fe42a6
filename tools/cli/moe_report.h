// The routing assumption of a mixture-of-experts run in the reports (model.moe.routing;
// docs/moe.md): which assumption the numbers are for and, when it is `balanced`, the peaks
// of a second simulation with `worst-case` routing beside them (every token to the same
// top_k experts: the bound a user needs to be safe); and which experts implementation ran.
//
// Contract: nullopt for a dense model. The second simulation is the same scenario with
// only model.moe.routing changed, built and executed as `memsim run` does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "scenario/scenario.h"

namespace memsim::cli {

struct MoeRoutingReport {
  std::string routing;  // "balanced", "worst-case", "skew:1.2", "counts:[...]"
  // transformers' experts code that ran (model.moe.experts_implementation, else transformers
  // 5.x's default grouped_mm: scenario/moe_keys.cpp): "eager", "batched_mm", "grouped_mm";
  // empty for Megatron-Core's layers, which have no such switch.
  std::string experts_implementation;
  bool worst_case_run = false;
  uint64_t worst_peak_allocated = 0, worst_peak_reserved = 0;
  bool worst_fits = true;
};

std::optional<MoeRoutingReport> moe_routing_report(const Scenario& scenario);

}  // namespace memsim::cli
