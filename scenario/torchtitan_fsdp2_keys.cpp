// torchtitan's own model code under FSDP2 (scenario/torchtitan_fsdp2_keys.h). Source:
// pytorch/torchtitan 5077be6ef889de93fc7a246197e33967d4307531
// torchtitan/models/llama3/infra/parallelize.py (apply_fsdp), torchtitan/train.py (the
// model built under torch.device("meta"), parallelized, then to_empty and init_weights),
// torchtitan/config/job_config.py (Parallelism.fsdp_reshard_after_forward "default").
#include "scenario/torchtitan_fsdp2_keys.h"

#include <string>

#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

void read_torchtitan_sharding(const Doc& d, Scenario& s) {
  if (s.model.arch.impl != graph::ModelImpl::torchtitan || s.parallel.sharding != Sharding::fsdp2)
    return;
  const Field* impl = d.find("model.implementation");
  auto refuse = [&](const std::string& key, const std::string& why) {
    const Field* o = d.find(key);
    fail(o != nullptr ? o->where : impl->where, key,
         why + " (model.implementation torchtitan with parallel.sharding fsdp2; "
               "docs/implementations.md)");
  };
  const ParallelConfig& p = s.parallel;
  if (p.reshard_after_forward_ranks > 0)
    refuse("parallel.reshard_after_forward",
           "torchtitan's fsdp_reshard_after_forward is a policy: true is \"default\", false "
           "\"never\" (\"always\", which also reshards [norm, output], is not modelled)");
  if (const Field* f = d.find("parallel.fsdp_init"); f != nullptr && !p.fsdp_init_on_cpu)
    refuse("parallel.fsdp_init", "torchtitan builds the model on the meta device and "
                                 "materializes the shards with to_empty (fsdp_init: cpu, the "
                                 "default here)");
  if (p.context > 1)
    refuse("parallel.context", "context parallelism with torchtitan's own model code is not "
                               "modelled yet (the hf-llama rows model it)");
  if (s.precision.float8_all_gather)
    refuse("precision.float8_all_gather", "float8 with torchtitan's own model code is not "
                                          "modelled (the hf-llama rows model it)");
  if (s.recipe.offload_activations)
    refuse("checkpoint.offload_activations", "torchtitan has no activation offloading");
  s.parallel.fsdp_init_on_cpu = true;  // torch.device("meta") in train.py
}

}  // namespace memsim::scenario_detail
