#include "program/step_cost.h"

namespace memsim {

const char* to_string(CostPart part) {
  switch (part) {
    case CostPart::forward: return "forward";
    case CostPart::backward: return "backward";
    case CostPart::recompute: return "recompute";
    case CostPart::optimizer: return "optimizer";
    case CostPart::communication: return "communication";
    case CostPart::transfer: return "transfer";
  }
  return "forward";
}

const char* to_string(MathDtype dtype) {
  switch (dtype) {
    case MathDtype::fp32: return "fp32";
    case MathDtype::tf32: return "tf32";
    case MathDtype::bf16: return "bf16";
    case MathDtype::fp16: return "fp16";
    case MathDtype::fp8: return "fp8";
  }
  return "fp32";
}

const char* to_string(Collective kind) {
  switch (kind) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
  }
  return "all_reduce";
}

void StepCost::add_gemm(CostPart part, MathDtype dtype, double flops, double bytes) {
  if (flops <= 0 && bytes <= 0) return;
  // Few distinct shapes (a dozen per layer kind and part): a linear scan finds the row.
  for (GemmCost& g : gemms)
    if (g.part == part && g.dtype == dtype && g.flops == flops && g.bytes == bytes) {
      ++g.count;
      return;
    }
  gemms.push_back({part, dtype, flops, bytes, 1});
}

void StepCost::add_collective(Collective kind, int32_t ranks, double bytes) {
  if (ranks <= 1 || bytes <= 0) return;
  for (CollectiveCost& c : collectives)
    if (c.kind == kind && c.ranks == ranks && c.bytes == bytes) {
      ++c.count;
      return;
    }
  collectives.push_back({kind, ranks, bytes, 1});
}

void StepCost::reset_step() {
  for (double& t : traffic) t = 0;
  gemms.clear();
  collectives.clear();
  host_bytes = 0;
}

double StepCost::gemm_flops(CostPart part) const {
  double sum = 0;
  for (const GemmCost& g : gemms)
    if (g.part == part) sum += g.flops * static_cast<double>(g.count);
  return sum;
}

}  // namespace memsim
