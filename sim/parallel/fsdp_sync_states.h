// FSDP(sync_module_states=True) (parallel.fsdp_sync_module_states): before a unit is
// flattened, its not-yet-synced buffers and then its parameters are broadcast from rank 0
// with dist._broadcast_coalesced(group, module_states, PARAM_BROADCAST_BUCKET_SIZE, src=0)
// (pytorch/pytorch @00743e70 torch/distributed/fsdp/_init_utils.py
// _init_param_handle_from_module -> _sync_module_params_and_buffers;
// PARAM_BROADCAST_BUCKET_SIZE = int(250 * 1024 * 1024)). What that allocates on the GPU
// (pytorch/pytorch @b5e035bd torch/csrc/distributed/c10d/comm.cpp broadcast_coalesced):
// the tensors go into compute_bucket_assignment_by_size buckets (one dtype: in order, a
// bucket closes once it reaches the limit); each bucket is flattened
// (torch/csrc/utils/tensor_flatten.h flatten_dense_tensors: a cat of the bucket's tensors,
// a view when it holds one), broadcast in place, and at most two buckets are in flight:
// before bucket i is flattened, bucket i - 2 is finished and its flat tensor freed; the
// rest are freed in order at the end.
//
// Tensors of several dtypes (a model loaded in bf16: its fp32 rotary buffers and bf16
// parameters; docs/fsdp-accelerate.md "A model loaded in bf16") are bucketed per dtype
// (compute_bucket_assignment_by_size keys its accumulators by dtype and device: a bucket
// closes when its own dtype's bytes reach the limit, the unfinished ones are added at the
// end), and the buckets are then sorted by their smallest tensor index
// (torch/csrc/distributed/c10d/reducer.cpp, the same file's bucketing).
//
// Contract: sync_broadcast_events(bytes, limit, dtypes) returns the flat tensors'
// allocations (+bytes) and frees (-bytes) in order, for tensors of `bytes` (module order:
// buffers first), each of dtype key `dtypes[i]` (empty: one dtype), and bucket limit
// `limit` (kFsdpSyncBucketBytes in FSDP). Checked against torch's own routine on a gloo
// group of one rank (tests/data/torch_cpu/accelerate_fsdp1.json, mixed-dtype cases too).
#pragma once

#include <cstdint>
#include <vector>

namespace memsim {

inline constexpr uint64_t kFsdpSyncBucketBytes = 250ull * 1024 * 1024;  // PARAM_BROADCAST_BUCKET_SIZE

std::vector<int64_t> sync_broadcast_events(const std::vector<uint64_t>& bytes, uint64_t limit,
                                           const std::vector<int>& dtypes = {});

}  // namespace memsim
