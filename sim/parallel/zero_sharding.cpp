#include "sim/parallel/zero_sharding.h"

#include <algorithm>
#include <stdexcept>

namespace memsim {

uint64_t padded_numel(uint64_t numel, int64_t d) {
  if (d < 1) throw std::invalid_argument("padded_numel: data-parallel size < 1");
  const uint64_t du = static_cast<uint64_t>(d);
  return (numel + du - 1) / du * du;
}

std::vector<uint64_t> megatron_shard_numel(const std::vector<uint64_t>& numel, int64_t d,
                                           int64_t rank) {
  if (rank < 0 || rank >= d) throw std::invalid_argument("megatron_shard_numel: bad rank");
  uint64_t total = 0;
  for (uint64_t n : numel) total += n;
  const uint64_t shard = padded_numel(total, d) / static_cast<uint64_t>(d);
  const uint64_t lo = shard * static_cast<uint64_t>(rank), hi = lo + shard;
  std::vector<uint64_t> owned(numel.size(), 0);
  // The buffer holds the parameters last-registered first.
  uint64_t start = 0;
  for (size_t k = numel.size(); k-- > 0;) {
    const uint64_t end = start + numel[k];
    const uint64_t a = std::max(start, lo), b = std::min(end, hi);
    owned[k] = b > a ? b - a : 0;
    start = end;
  }
  return owned;
}

ModelStateBytes zero_stage_model_states(const ModelStateBytes& u, int stage, int64_t d) {
  if (stage < 0 || stage > 3) throw std::invalid_argument("ZeRO stage must be 0-3");
  if (d < 1) throw std::invalid_argument("data-parallel size < 1");
  const double n = static_cast<double>(d);
  ModelStateBytes r = u;
  if (stage >= 1) r.optimizer_state /= n;  // P_os
  if (stage >= 2) r.gradients /= n;        // P_os+g
  if (stage >= 3) r.parameters /= n;       // P_os+g+p
  return r;
}

}  // namespace memsim
