#include "scenario/device_rate_keys.h"

#include <string>

#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

namespace {

// A rate key: a number >= `min` (strictly above 0 unless zero_ok), times `unit`.
void read_rate(const Doc& d, const std::string& key, double unit, bool zero_ok, double& out) {
  const Field* f = d.find(key);
  if (f == nullptr) return;
  const double v = read_number(*f, key);
  if (!(v > 0.0) && !(zero_ok && v == 0.0))
    fail(f->where, key,
         std::string("expected a number ") + (zero_ok ? ">= 0" : "> 0") + ", got '" + f->node.Scalar() + "'");
  out = v * unit;
}

}  // namespace

void read_device_rates(const Doc& d, DeviceConfig& dev) {
  constexpr double kTera = 1e12, kGiga = 1e9;
  read_rate(d, "device.tflops_fp32", kTera, false, dev.flops_fp32);
  read_rate(d, "device.tflops_tf32", kTera, false, dev.flops_tf32);
  read_rate(d, "device.tflops_bf16", kTera, false, dev.flops_bf16);
  read_rate(d, "device.tflops_fp16", kTera, false, dev.flops_fp16);
  read_rate(d, "device.tflops_fp8", kTera, false, dev.flops_fp8);
  read_rate(d, "device.hbm_gbps", kGiga, false, dev.hbm_bandwidth);
  read_rate(d, "device.nvlink_gbps", kGiga, true, dev.nvlink_bandwidth);
  read_rate(d, "device.pcie_gbps", kGiga, false, dev.pcie_bandwidth);
  read_rate(d, "device.network_gbps", kGiga, false, dev.network_bandwidth);
  if (const Field* f = d.find("device.gpus_per_node"))
    dev.gpus_per_node = read_int(*f, "device.gpus_per_node", 1);
}

}  // namespace memsim::scenario_detail
