#include "sim/parallel/fsdp_flat_layout.h"

#include <algorithm>
#include <unordered_map>

namespace memsim {

FlatLayout flat_layout(const std::vector<uint64_t>& numel, uint64_t aligned_numel, uint64_t world) {
  FlatLayout l;
  l.params.reserve(numel.size());
  uint64_t total = 0;
  for (uint64_t n : numel) {
    // _init_flat_param_and_metadata: numel_to_pad = aligned - total % aligned, a padding
    // tensor when 0 < numel_to_pad < aligned (so never before the first parameter).
    if (aligned_numel > 0) {
      const uint64_t pad = aligned_numel - total % aligned_numel;
      if (pad > 0 && pad < aligned_numel) {
        l.padding.push_back({total, pad});
        total += pad;
      }
    }
    l.params.push_back({total, n});
    total += n;
  }
  const uint64_t tail = (world - total % world) % world;
  if (tail > 0 && aligned_numel > 0) l.padding.push_back({total, tail});
  l.padded_numel = total + tail;
  return l;
}

uint64_t local_numel(const FlatSegment& p, uint64_t shard_numel, uint64_t rank) {
  const uint64_t lo = rank * shard_numel, hi = lo + shard_numel;
  const uint64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
  return b > a ? b - a : 0;
}

namespace {
// "<module>" of "<module>.lora_A.default.weight" / "<module>.lora_B.default.weight", or
// empty when `name` is not an adapter.
std::string adapter_module(const std::string& name) {
  for (const char* tail : {".lora_A.default.weight", ".lora_B.default.weight"}) {
    const std::string t(tail);
    if (name.size() > t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0)
      return name.substr(0, name.size() - t.size());
  }
  return {};
}
// "<module>" of "<module>.weight" / "<module>.bias".
std::string base_module(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}
}  // namespace

std::vector<int32_t> peft_flatten_order(const std::vector<int32_t>& ids,
                                        const std::vector<std::string>& names) {
  // Position of each id in registration order; an adapter sorts right after the last
  // base parameter of its module (stable among adapters: lora_A before lora_B).
  std::unordered_map<std::string, size_t> last_of_module;
  for (size_t i = 0; i < ids.size(); ++i)
    if (adapter_module(names[i]).empty()) last_of_module[base_module(names[i])] = i;
  std::vector<std::pair<std::pair<size_t, size_t>, int32_t>> keyed;
  keyed.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string m = adapter_module(names[i]);
    const auto it = m.empty() ? last_of_module.end() : last_of_module.find(m);
    keyed.push_back({it == last_of_module.end() ? std::make_pair(i, size_t{0})
                                                : std::make_pair(it->second, 1 + i),
                     ids[i]});
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (const auto& k : keyed) out.push_back(k.second);
  return out;
}

}  // namespace memsim
