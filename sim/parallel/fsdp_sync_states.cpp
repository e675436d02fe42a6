#include "sim/parallel/fsdp_sync_states.h"

#include <algorithm>
#include <deque>
#include <map>

#include "sim/parallel/data_parallel.h"

namespace memsim {

std::vector<int64_t> sync_broadcast_events(const std::vector<uint64_t>& bytes, uint64_t limit,
                                           const std::vector<int>& dtypes) {
  // One accumulator per dtype, each visiting its tensors in order; then every bucket
  // sorted by its smallest index (the tensors' order: buckets are disjoint).
  std::map<int, std::vector<int32_t>> by_dtype;
  for (size_t i = 0; i < bytes.size(); ++i)
    by_dtype[dtypes.empty() ? 0 : dtypes[i]].push_back(static_cast<int32_t>(i));
  std::vector<std::vector<int32_t>> buckets;
  for (const auto& [dtype, order] : by_dtype)
    for (std::vector<int32_t>& b : ddp_bucket_assignment(bytes, order, {limit})) buckets.push_back(std::move(b));
  std::sort(buckets.begin(), buckets.end(), [](const auto& a, const auto& b) {
    return *std::min_element(a.begin(), a.end()) < *std::min_element(b.begin(), b.end());
  });
  std::vector<int64_t> out;
  std::deque<int64_t> in_flight;  // each in-flight bucket's flat bytes (0: a view)
  auto finish_front = [&] {
    if (in_flight.front() != 0) out.push_back(-in_flight.front());
    in_flight.pop_front();
  };
  for (const std::vector<int32_t>& bucket : buckets) {
    if (in_flight.size() >= 2) finish_front();
    uint64_t flat = 0;
    if (bucket.size() > 1)
      for (int32_t i : bucket) flat += bytes[static_cast<size_t>(i)];
    if (flat != 0) out.push_back(static_cast<int64_t>(flat));
    in_flight.push_back(static_cast<int64_t>(flat));
  }
  while (!in_flight.empty()) finish_front();
  return out;
}

}  // namespace memsim
