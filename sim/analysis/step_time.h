// The time model (issue #18 item 1; docs/time-model.md): the measured step's work
// (Program::cost, program/step_cost.h) on a device's datasheet rates, as seconds.
//
// Contract (estimate_step_time):
//  - Each GEMM is a roofline: max(FLOPs / (peak of its dtype x kGemmEfficiency),
//    bytes / (HBM bandwidth x kHbmEfficiency)), times its count, summed by part.
//  - Other ops are bandwidth-bound: their HBM bytes / (HBM bandwidth x kHbmEfficiency).
//  - Collectives: ring algorithms (NCCL's default for these sizes): an all-reduce moves
//    2(n-1)/n of the buffer through each rank's link, an all-gather or reduce-scatter
//    (n-1)/n of the full tensor; over NVLink when the group fits in one node
//    (device.gpus_per_node) and the device has NVLink, over PCIe when it fits but has
//    none, else over the network (the slowest link of a ring sets its rate), at
//    kLinkEfficiency. Host transfers: bytes / (PCIe x kLinkEfficiency).
//  - Parts add up: nothing overlaps (no compute/communication overlap, no stream
//    concurrency), no launch overhead, no kernel fusion beyond what the op list says.
//  - Refused (estimated == false, `refused` names the key and why) when the Program says
//    some work is not modelled (StepCost::unmodelled) or the device lacks a rate the step
//    needs (a dtype's peak, HBM, a link). Nothing is approximated silently.
//  - MFU = model FLOPs (forward + backward GEMM FLOPs, recompute excluded) / (step
//    seconds x the dense peak of the dtype most of those FLOPs run in); 0 with no FLOPs.
#pragma once

#include <string>

#include "program/step_cost.h"
#include "scenario/scenario.h"

namespace memsim {

// Efficiencies: stated constants, not fitted to any measurement of memsim's
// (docs/time-model.md §3 gives the sources).
inline constexpr double kGemmEfficiency = 0.8;  // of the dense datasheet peak
inline constexpr double kHbmEfficiency = 0.9;   // of the datasheet HBM bandwidth
inline constexpr double kLinkEfficiency = 0.8;  // of NVLink / PCIe / network per direction

struct StepTime {
  bool estimated = false;
  std::string refused;                     // "KEY: why" when !estimated
  double seconds = 0;                      // sum of the parts
  double part[kCostPartCount] = {0, 0, 0, 0, 0, 0};
  double model_flops = 0;                  // forward + backward GEMM FLOPs of the step
  double recompute_flops = 0;
  double mfu = 0;
  MathDtype mfu_dtype = MathDtype::fp32;   // whose peak the MFU divides by
};

StepTime estimate_step_time(const StepCost& cost, const DeviceConfig& device);

// A device's dense peak for `dtype` in FLOP/s (0 = unknown), and the key that sets it.
double peak_flops(const DeviceConfig& device, MathDtype dtype);
const char* peak_key(MathDtype dtype);

}  // namespace memsim
