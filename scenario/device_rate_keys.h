// Reading the time model's device keys (issue #18 item 1; internal to the scenario loader;
// documented in docs/scenario-format.md, the model in docs/time-model.md).
//
// Contract (read_device_rates, after the preset and the memory keys):
//  - device.tflops_{fp32,tf32,bf16,fp16,fp8}: dense peak TFLOP/s (10^12 FLOP/s) of that
//    math, > 0; device.hbm_gbps, nvlink_gbps, pcie_gbps, network_gbps: GB/s (10^9 bytes/s)
//    per direction, > 0 (nvlink_gbps may be 0: no NVLink). device.gpus_per_node: >= 1.
//  - Each replaces the preset's value. Errors name the key and where it was set.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void read_device_rates(const Doc& d, DeviceConfig& dev);

}  // namespace memsim::scenario_detail
