#include "sim/analysis/step_time.h"

#include <algorithm>

namespace memsim {

double peak_flops(const DeviceConfig& d, MathDtype dtype) {
  switch (dtype) {
    case MathDtype::fp32: return d.flops_fp32;
    case MathDtype::tf32: return d.flops_tf32;
    case MathDtype::bf16: return d.flops_bf16;
    case MathDtype::fp16: return d.flops_fp16;
    case MathDtype::fp8: return d.flops_fp8;
  }
  return 0;
}

const char* peak_key(MathDtype dtype) {
  switch (dtype) {
    case MathDtype::fp32: return "device.tflops_fp32";
    case MathDtype::tf32: return "device.tflops_tf32";
    case MathDtype::bf16: return "device.tflops_bf16";
    case MathDtype::fp16: return "device.tflops_fp16";
    case MathDtype::fp8: return "device.tflops_fp8";
  }
  return "device.tflops_fp32";
}

namespace {

StepTime refuse(std::string why) {
  StepTime t;
  t.refused = std::move(why);
  return t;
}

}  // namespace

StepTime estimate_step_time(const StepCost& cost, const DeviceConfig& device) {
  if (!cost.unmodelled.empty()) return refuse(cost.unmodelled);
  const std::string preset = device.preset.empty() ? "this device" : "preset " + device.preset;
  if (device.hbm_bandwidth <= 0)
    return refuse("device.hbm_gbps: not known for " + preset + "; set it to estimate step time");
  const double hbm = device.hbm_bandwidth * kHbmEfficiency;
  StepTime t;
  double by_dtype[kMathDtypeCount] = {0, 0, 0, 0, 0};
  for (const GemmCost& g : cost.gemms) {
    const double peak = peak_flops(device, g.dtype);
    if (peak <= 0 && g.flops > 0)
      return refuse(std::string(peak_key(g.dtype)) + ": " + preset + " has no " + to_string(g.dtype) +
                    " peak; the step multiplies in " + to_string(g.dtype));
    const double one = std::max(g.flops > 0 ? g.flops / (peak * kGemmEfficiency) : 0.0, g.bytes / hbm);
    t.part[static_cast<int>(g.part)] += one * static_cast<double>(g.count);
    const double flops = g.flops * static_cast<double>(g.count);
    if (g.part == CostPart::forward || g.part == CostPart::backward) {
      t.model_flops += flops;
      by_dtype[static_cast<int>(g.dtype)] += flops;
    } else if (g.part == CostPart::recompute) {
      t.recompute_flops += flops;
    }
  }
  for (int p = 0; p < kCostPartCount; ++p) t.part[p] += cost.traffic[p] / hbm;
  for (const CollectiveCost& c : cost.collectives) {
    const bool in_node = c.ranks <= device.gpus_per_node;
    double link = 0;
    const char* key = "";
    if (in_node) {
      link = device.nvlink_bandwidth > 0 ? device.nvlink_bandwidth : device.pcie_bandwidth;
      key = device.nvlink_bandwidth > 0 ? "device.nvlink_gbps" : "device.pcie_gbps";
    } else {
      link = device.network_bandwidth;
      key = "device.network_gbps";
    }
    if (link <= 0)
      return refuse(std::string(key) + ": not known for " + preset + "; a " + to_string(c.kind) +
                    " over " + std::to_string(c.ranks) + " ranks needs it");
    const double n = static_cast<double>(c.ranks);
    const double moved = (c.kind == Collective::all_reduce ? 2.0 : 1.0) * (n - 1) / n * c.bytes;
    t.part[static_cast<int>(CostPart::communication)] +=
        moved / (link * kLinkEfficiency) * static_cast<double>(c.count);
  }
  if (cost.host_bytes > 0) {
    if (device.pcie_bandwidth <= 0)
      return refuse("device.pcie_gbps: not known for " + preset + "; host transfers need it");
    t.part[static_cast<int>(CostPart::transfer)] += cost.host_bytes / (device.pcie_bandwidth * kLinkEfficiency);
  }
  for (double p : t.part) t.seconds += p;
  int main = 0;
  for (int d = 1; d < kMathDtypeCount; ++d)
    if (by_dtype[d] > by_dtype[main]) main = d;
  t.mfu_dtype = static_cast<MathDtype>(main);
  const double peak = peak_flops(device, t.mfu_dtype);
  if (t.model_flops > 0 && t.seconds > 0 && peak > 0) t.mfu = t.model_flops / (t.seconds * peak);
  t.estimated = true;
  return t;
}

}  // namespace memsim
