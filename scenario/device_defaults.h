// The CUDA context memsim assumes for a device described by hand (`device.capacity`
// without `device.preset`) when `device.cuda_context` is not given: the device memory in
// use outside the caching allocator measured on the H100 80GB after a training step
// (tests/data/h100/cuda_runs.json: 787,283,968 B = 750.8 MiB, driver 580, CUDA 13, PyTorch
// 2.11; the h100-80gb preset, scenario/scenario_presets.cpp). A real process always has a
// context, so 0 B (memsim before issue #19) overstated what the allocator may use; the
// terminal summary says when this default was taken (tools/cli/scenario_facts.cpp).
#pragma once

#include <cstdint>

#include "scenario/scenario.h"

namespace memsim {

inline constexpr uint64_t kDefaultCudaContext = 787283968ull;

// True when `d` is a hand-described device whose context is this default. (A scenario that
// writes exactly this value by hand reads the same: the numbers are the same.)
inline bool cuda_context_is_default(const DeviceConfig& d) {
  return d.preset.empty() && d.capacity > 0 && d.cuda_context == kDefaultCudaContext;
}

}  // namespace memsim
