#include "sim/parallel/zero_redundancy.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "allocator/units.h"
#include "sim/parallel/data_parallel.h"

namespace memsim {

using graph::Runtime;

std::vector<std::vector<int32_t>> zero_redundancy_partition(const std::vector<uint64_t>& numel,
                                                            int64_t d) {
  if (d < 1) throw std::invalid_argument("zero_redundancy_partition: data-parallel size < 1");
  std::vector<int32_t> order(numel.size());
  std::iota(order.begin(), order.end(), 0);
  // sorted(params, key=numel, reverse=True): stable, equal sizes keep their order.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return numel[size_t(a)] > numel[size_t(b)]; });
  std::vector<std::vector<int32_t>> parts(static_cast<size_t>(d));
  std::vector<uint64_t> sizes(static_cast<size_t>(d), 0);
  for (int32_t i : order) {
    // _get_min_index: the first rank with the smallest total so far.
    const size_t r = static_cast<size_t>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
    parts[r].push_back(i);
    sizes[r] += numel[static_cast<size_t>(i)];
  }
  return parts;
}

ZeroRedundancyRank zero_redundancy_rank(const std::vector<std::vector<int32_t>>& partition,
                                        const std::vector<uint64_t>& bytes, const Scenario& s) {
  ZeroRedundancyRank z;
  uint64_t total = 0;
  for (const std::vector<int32_t>& part : partition) {
    uint64_t b = 0;
    for (int32_t i : part) b += bytes[static_cast<size_t>(i)];
    z.partition_bytes.push_back(b);
    total += b;
  }
  z.rank = static_cast<int64_t>(std::max_element(z.partition_bytes.begin(), z.partition_bytes.end()) -
                                z.partition_bytes.begin());
  const auto [lo, hi] = std::minmax_element(z.partition_bytes.begin(), z.partition_bytes.end());
  z.info = data_parallel_rank(s);
  z.info.index = static_cast<int>(z.rank);
  const std::string head = "ZeroRedundancyOptimizer (ZeRO stage 1) gives each of the " +
                           std::to_string(partition.size()) +
                           " ranks whole parameters, largest first to the smallest partition; ";
  if (*hi == *lo)
    z.info.why = head + "every partition holds " + human_bytes(*hi) + " of the " +
                 human_bytes(total) + " of parameters: rank 0 stands for all";
  else
    z.info.why = head + "rank " + std::to_string(z.rank) + " has the largest (" +
                 human_bytes(*hi) + " of " + human_bytes(total) + " of parameters; smallest " +
                 human_bytes(*lo) + "), so the most optimizer state: it is simulated";
  return z;
}

namespace {

// The local optimizer of one rank: its param_groups hold that rank's partition only, in
// partition order. The inner optimizer walks rt.parameters(), so the step runs on a
// Runtime whose parameter list is, for its duration, exactly that partition.
class ZeroRedundancyOptimizer final : public OptimizerSim {
 public:
  ZeroRedundancyOptimizer(std::unique_ptr<OptimizerSim> inner, std::vector<int32_t> local)
      : inner_(std::move(inner)), local_(std::move(local)) {}

  void construct(Runtime& rt) override { with_local_params(rt, [&] { inner_->construct(rt); }); }
  void step(Runtime& rt) override {
    with_local_params(rt, [&] { inner_->step(rt); });  // _local_step
    // _sync_params: in-place broadcasts of every rank's parameters, no GPU allocation.
  }

 private:
  template <class F>
  void with_local_params(Runtime& rt, F&& run) {
    std::vector<graph::Parameter>& params = rt.parameters();
    view_.clear();
    for (int32_t i : local_) view_.push_back(params[static_cast<size_t>(i)]);
    params.swap(view_);  // params: the partition; view_: every parameter
    struct Restore {     // puts every parameter back, even if the step throws
      std::vector<graph::Parameter>& params;
      std::vector<graph::Parameter>& full;
      const std::vector<int32_t>& local;
      ~Restore() {
        for (size_t k = 0; k < local.size(); ++k) full[static_cast<size_t>(local[k])] = params[k];
        params.swap(full);
      }
    } restore{params, view_, local_};
    run();
  }

  std::unique_ptr<OptimizerSim> inner_;
  std::vector<int32_t> local_;
  std::vector<graph::Parameter> view_;
};

}  // namespace

std::unique_ptr<OptimizerSim> make_zero_redundancy_optimizer(std::unique_ptr<OptimizerSim> inner,
                                                             Runtime& rt, const Scenario& s,
                                                             uint64_t param_elem) {
  std::vector<uint64_t> numel, bytes;
  for (const graph::Parameter& p : rt.parameters()) {
    numel.push_back(numel_of(p, param_elem));
    bytes.push_back(p.bytes);
  }
  const std::vector<std::vector<int32_t>> parts = zero_redundancy_partition(numel, s.parallel.data);
  const ZeroRedundancyRank z = zero_redundancy_rank(parts, bytes, s);
  rt.program().rank = z.info;  // optimizer.type none: the rank a step would need
  if (!inner) return nullptr;
  return std::make_unique<ZeroRedundancyOptimizer>(std::move(inner),
                                                   parts[static_cast<size_t>(z.rank)]);
}

}  // namespace memsim
