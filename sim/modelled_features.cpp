#include "sim/modelled_features.h"

#include <string>

#include "sim/data_parallel.h"

namespace memsim {

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
}  // namespace

void require_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  if (p.tensor != 1 || p.pipeline != 1) {
    const char* key = p.tensor != 1 ? "parallel.tensor" : "parallel.pipeline";
    refuse(s, key,
           "multi-GPU memory of tensor, sequence and pipeline parallelism is not modelled "
           "yet (set parallel.tensor and parallel.pipeline to 1)");
  }
  require_data_parallel_modelled(s);  // sim/data_parallel.h
  if (s.precision.autocast.has_value()) {
    refuse(s, "precision.autocast",
           "autocast (its op dtype rules and weight-cast cache) is not modelled yet; use "
           "precision.autocast: none, or pure low-precision parameters with precision.params");
  }
  if (s.precision.master_weights && s.model.family != ModelFamily::megatron) {
    refuse(s, "precision.master_weights",
           std::string("fp32 master weights are modelled for the megatron family only, not '") +
               to_string(s.model.family) + "'");
  }
  if (s.model.family == ModelFamily::cs336 && s.model.dropout > 0.0) {
    refuse(s, "model.dropout",
           "the CS336 staff model has no dropout layers; use family hf-gpt2, hf-llama or "
           "megatron for a model with dropout");
  }
}

}  // namespace memsim
