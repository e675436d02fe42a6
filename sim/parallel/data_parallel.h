// Data parallelism on one simulated rank: which parallel.* settings each family models,
// the RankInfo of a data-parallel run, and torch DistributedDataParallel's gradient
// buckets (cs336, hf-gpt2, hf-llama).
//
// torch DDP (torch 1.13, nn/parallel/distributed.py and c10d reducer.cpp; checked by
// tools/fixtures/gen_ddp_fixtures.py -> tests/data/ddp/*.json):
//  - The reducer takes only the parameters that require grad (_build_params_for_reducer):
//    a LoRA / QLoRA model's adapters, not its frozen base weights; a 16-bit model trained
//    with fp32 master weights buckets its 16-bit parameters (tools/fixtures/
//    gen_ddp_lora_master_fixtures.py -> tests/data/ddp_combos/*.json).
//  - At construction, with find_unused_parameters=False (the default) and no static
//    graph, ALL those parameters go into ONE bucket (bucket_size_limits = [sys.maxsize]): the
//    reducer allocates its flat gradient buffer, sum of the parameters' bytes, at once.
//  - gradient_as_bucket_view=False (the default): .grad tensors are allocated by autograd
//    as without DDP and COPIED into the bucket (mul_out by 1/world_size, no temporary);
//    the all-reduce is in place and the result is copied back into .grad. So DDP adds
//    the bucket buffers on top of the gradients, from construction on.
//  - gradient_as_bucket_view=True (parallel.gradient_as_bucket_view): the hook copies the
//    fresh gradient into the bucket and makes .grad a view of it, so the fresh tensor
//    dies at once and gradients cost only the buckets (allocated up front); the views
//    keep a bucket alive after a rebuild until they are moved to the new one.
//  - Rebuild: the first forward after the first backward (DDP.forward ->
//    reducer._rebuild_buckets) reassigns the buckets in the order gradients became ready
//    in that backward, with size limits [1 MiB, bucket_cap_mb (25 MiB), 25 MiB, ...]
//    (a bucket closes once it reaches its limit), frees the old buffers and allocates
//    the new ones (initialize_buckets clears buckets_ before building the new ones).
//  - _sync_module_states' broadcast from rank 0 (coalesced into 250 MB temporaries for
//    world_size > 1) is not modelled.
//
// Megatron's own DDP (sim/megatron/megatron_step.cpp) already keeps one grad buffer that the
// all-reduce / reduce-scatter works in place on: data parallelism adds no memory there.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/runtime.h"
#include "program/rank_info.h"
#include "scenario/scenario.h"

namespace memsim {

// Throws ScenarioError ("SOURCE: parallel.KEY: ...") for data-parallel settings the
// scenario's family does not model (tensor/pipeline are checked elsewhere).
void require_data_parallel_modelled(const Scenario& scenario);
// Megatron: parallel.zero 0 (DDP) and 1 (distributed optimizer) are modelled; throws
// std::runtime_error for 2 and 3.
void require_megatron_data_parallel_modelled(const Scenario& scenario);

// The rank simulated for a data-parallel run (index 0; world = data * tensor * pipeline),
// with why rank 0 stands for all. The default RankInfo when data == 1 and zero == 0.
RankInfo data_parallel_rank(const Scenario& scenario);

// Megatron distributed optimizer: elements of each parameter (by id) owned by the
// simulated rank (sim/parallel/zero_sharding.h). `elem`: bytes per parameter element.
std::vector<uint64_t> megatron_owned_numel(const graph::Runtime& rt, uint64_t elem,
                                           const Scenario& scenario);

// compute_bucket_assignment_by_size for tensors of one dtype, visited in `order`:
// `limits` are used in turn, the last repeating. Returns the buckets (indices into
// `bytes`) in creation order.
std::vector<std::vector<int32_t>> ddp_bucket_assignment(const std::vector<uint64_t>& bytes,
                                                        const std::vector<int32_t>& order,
                                                        const std::vector<uint64_t>& limits);

inline constexpr uint64_t kDdpFirstBucketBytes = 1024 * 1024;      // _DEFAULT_FIRST_BUCKET_BYTES
inline constexpr uint64_t kDdpBucketCapBytes = 25 * 1024 * 1024;   // bucket_cap_mb = 25

// torch DDP's reducer buckets on the simulated rank.
class TorchDdp : public graph::RuntimeHooks {
 public:
  // DistributedDataParallel(model): the one initial bucket (all parameters that require
  // grad; std::logic_error when there are none, or of mixed dtypes). Installs
  // itself as rt's grad-ready log for the first backward.
  TorchDdp(graph::Runtime& rt, bool gradient_as_bucket_view);
  ~TorchDdp();
  TorchDdp(const TorchDdp&) = delete;
  TorchDdp& operator=(const TorchDdp&) = delete;
  // DDP.forward's pre-forward: rebuilds the buckets once, after the first backward.
  void pre_forward(graph::Runtime& rt, bool grad_enabled);
  // Bucket buffer sizes in bytes, current assignment.
  std::vector<uint64_t> bucket_bytes() const;
  void grad_ready(graph::Runtime& rt, int32_t param) override;
  void layer_entered(graph::Runtime&, int32_t) override {}

 private:
  void allocate(graph::Runtime& rt, const std::vector<std::vector<int32_t>>& buckets);

  graph::Runtime* rt_;
  std::vector<int32_t> ready_log_;  // parameter ids, one per AccumulateGrad run
  std::vector<graph::Tensor> buffers_;
  std::vector<uint64_t> sizes_;
  std::vector<uint32_t> bucket_of_param_;  // storage of each parameter's bucket
  bool view_ = false;
  bool rebuilt_ = false;
};

}  // namespace memsim
