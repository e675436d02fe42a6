#include "scenario/fsdp_keys.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scenario/fsdp2_keys.h"
#include "scenario/fsdp_lora_keys.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

namespace {
const std::vector<std::pair<std::string, Sharding>> kSharding = {
    {"none", Sharding::none}, {"fsdp", Sharding::fsdp}, {"deepspeed", Sharding::deepspeed},
    {"fsdp2", Sharding::fsdp2}};
const std::vector<std::pair<std::string, bool>> kInit = {{"gpu", false}, {"cpu", true}};
const std::vector<std::pair<std::string, std::optional<DType>>> kMixedPrecision = {
    {"none", std::nullopt}, {"bf16", DType::bf16}, {"fp16", DType::fp16}};
// Accelerate's fsdp_backward_prefetch spellings (FSDP_BACKWARD_PREFETCH + NO_PREFETCH),
// lower-cased; true = BACKWARD_PRE. BACKWARD_POST (prefetch from the post-backward hook,
// after the reshard and before the reduce-scatter) is not modelled: refused below.
const std::vector<std::pair<std::string, int>> kPrefetch = {
    {"backward_pre", 1}, {"no_prefetch", 0}, {"backward_post", 2}};

// parallel.fsdp_backward_prefetch: FSDP1 only (FSDP2 prefetches one group ahead itself).
void read_backward_prefetch(const Doc& d, ParallelConfig& p) {
  const Field* f = d.find("parallel.fsdp_backward_prefetch");
  if (f == nullptr) return;
  if (p.sharding != Sharding::fsdp)
    fail(f->where, "parallel.fsdp_backward_prefetch",
         "only applies with parallel.sharding: fsdp (FSDP1's backward_prefetch; FSDP2 "
         "always prefetches one group ahead)");
  const int v = read_enum(*f, "parallel.fsdp_backward_prefetch", kPrefetch);
  if (v == 2)
    fail(f->where, "parallel.fsdp_backward_prefetch",
         "backward_post (BackwardPrefetch.BACKWARD_POST: the next unit gathered from the "
         "post-backward hook) is not modelled; modelled: backward_pre (torch's default) and "
         "no_prefetch (HF Trainer's default)");
  p.fsdp_backward_prefetch = v == 1;
}

// parallel.fsdp_sync_module_states: FSDP1's sync_module_states (FSDP2 has none).
void read_sync_module_states(const Doc& d, ParallelConfig& p) {
  const Field* f = d.find("parallel.fsdp_sync_module_states");
  if (f == nullptr) return;
  if (p.sharding != Sharding::fsdp)
    fail(f->where, "parallel.fsdp_sync_module_states",
         "only applies with parallel.sharding: fsdp (FSDP1's sync_module_states; FSDP2 has "
         "none)");
  p.fsdp_sync_module_states = read_bool(*f, "parallel.fsdp_sync_module_states");
}
}  // namespace

void read_sharding(const Doc& d, ParallelConfig& p) {
  if (const Field* f = d.find("parallel.gradient_as_bucket_view"))
    p.gradient_as_bucket_view = read_bool(*f, "parallel.gradient_as_bucket_view");
  if (const Field* f = d.find("parallel.sharding"))
    p.sharding = read_enum(*f, "parallel.sharding", kSharding);
  // fully_shard reads its own keys; theirs are refused elsewhere (scenario/fsdp2_keys.h).
  read_fsdp_lora_keys(d, p);  // parallel.fsdp_wrap, parallel.use_orig_params (FSDP1 only)
  read_backward_prefetch(d, p);  // parallel.fsdp_backward_prefetch (FSDP1 only)
  read_sync_module_states(d, p);  // parallel.fsdp_sync_module_states (FSDP1 only)
  if (p.sharding == Sharding::fsdp2) return read_fsdp2(d, p);
  reject_fsdp2_keys(d, p);
  const Field* reshard = d.find("parallel.reshard_after_forward");
  if (reshard != nullptr) {
    if (p.sharding != Sharding::fsdp)
      fail(reshard->where, "parallel.reshard_after_forward",
           "only applies with parallel.sharding: fsdp");
    p.reshard_after_forward = read_bool(*reshard, "parallel.reshard_after_forward");
  }
  if (const Field* f = d.find("parallel.fsdp_init")) {
    if (p.sharding != Sharding::fsdp)
      fail(f->where, "parallel.fsdp_init", "only applies with parallel.sharding: fsdp");
    p.fsdp_init_on_cpu = read_enum(*f, "parallel.fsdp_init", kInit);
  }
  if (const Field* f = d.find("parallel.cpu_offload")) {
    if (p.sharding != Sharding::fsdp)
      fail(f->where, "parallel.cpu_offload",
           "only applies with parallel.sharding: fsdp (FSDP's CPUOffload(offload_params=True)); "
           "ZeroRedundancyOptimizer and DDP keep everything on the GPU");
    p.cpu_offload = read_bool(*f, "parallel.cpu_offload");
  }
  if (const Field* f = d.find("parallel.fsdp_mixed_precision")) {
    if (p.sharding != Sharding::fsdp)
      fail(f->where, "parallel.fsdp_mixed_precision",
           "only applies with parallel.sharding: fsdp (FSDP's MixedPrecision policy); use "
           "precision.autocast for a single GPU");
    p.fsdp_mixed_precision = read_enum(*f, "parallel.fsdp_mixed_precision", kMixedPrecision);
  }
  if (p.sharding != Sharding::fsdp) return;
  const Field* zero = d.find("parallel.zero");
  if (zero == nullptr) {
    p.zero = p.reshard_after_forward ? 3 : 2;
    return;
  }
  if (p.zero != 2 && p.zero != 3)
    fail(zero->where, "parallel.zero",
         "FSDP shards gradients and optimizer state (2, SHARD_GRAD_OP) or also parameters "
         "(3, FULL_SHARD); stage " + std::to_string(p.zero) + " has no FSDP strategy");
  if (reshard == nullptr) {
    p.reshard_after_forward = p.zero == 3;
  } else if (p.reshard_after_forward != (p.zero == 3)) {
    fail(reshard->where, "parallel.reshard_after_forward",
         std::string("disagrees with parallel.zero ") + std::to_string(p.zero) +
             " (FULL_SHARD = zero 3 reshards after forward, SHARD_GRAD_OP = zero 2 does not)");
  }
}

}  // namespace memsim::scenario_detail
