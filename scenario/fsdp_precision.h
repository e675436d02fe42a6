// The element size a cs336 / hf-* model computes in (its activations and the parameters
// its ops see): precision.params, or FSDP MixedPrecision's param_dtype
// (parallel.fsdp_mixed_precision), whose gathered parameters are cast copies of the fp32
// shards (sim/parallel/fsdp.h). The parameters' storage dtype stays precision.params.
#pragma once

#include <cstdint>

#include "scenario/scenario.h"

namespace memsim {

inline uint64_t model_compute_elem(const Scenario& s) {
  return static_cast<uint64_t>(
      dtype_bytes(s.parallel.fsdp_mixed_precision.value_or(s.precision.params)));
}

}  // namespace memsim
