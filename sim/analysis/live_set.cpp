#include "sim/analysis/live_set.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "program/tensor_names.h"

namespace memsim {

namespace {

// LiveSet::by_name: one pass over the live tensors, oldest first. From the live set's own
// copies of the allocations (a streamed run keeps no event array, sim/analysis/stream_run.h).
void group_by_name(const Program& program, const std::vector<LiveAlloc>& all, LiveSet& out) {
  std::vector<const LiveAlloc*> live;
  live.reserve(all.size());
  for (const LiveAlloc& l : all) live.push_back(&l);
  std::sort(live.begin(), live.end(), [](const LiveAlloc* x, const LiveAlloc* y) {
    return x->event != y->event ? x->event < y->event : x->tensor < y->tensor;
  });
  // (pattern, kind, bytes) -> group. Groups are numbered in order of their first member,
  // so a hash table gives the same as ordered keys. Each name and its pattern are built in
  // two reused buffers and the pattern is numbered (a few dozen distinct ones), so a
  // tensor costs no string of its own (1,587 live tensors at cs336-xl's peak).
  std::unordered_map<std::string, uint32_t> pattern_ids;
  std::vector<const std::string*> patterns;  // by number (the map's nodes stay put)
  struct Key {
    uint32_t pattern;
    uint8_t kind;
    uint64_t bytes;
    bool operator==(const Key& o) const {
      return pattern == o.pattern && kind == o.kind && bytes == o.bytes;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return (uint64_t{k.pattern} * 0xff51afd7ed558ccdULL) ^ (k.bytes * 0x9e3779b97f4a7c15ULL) ^ k.kind;
    }
  };
  std::unordered_map<Key, size_t, KeyHash> index;
  index.reserve(live.size());
  std::string name, pattern;
  for (const LiveAlloc* l : live) {
    const MemoryEvent& a = l->alloc;
    name.clear();
    append_tensor_name(name, program, l->info, a);
    pattern.clear();
    append_name_pattern(pattern, name);
    auto p = pattern_ids.find(pattern);
    if (p == pattern_ids.end()) {
      p = pattern_ids.emplace(pattern, static_cast<uint32_t>(patterns.size())).first;
      patterns.push_back(&p->first);
    }
    auto [it, fresh] =
        index.try_emplace(Key{p->second, static_cast<uint8_t>(a.kind), a.bytes}, out.by_name.size());
    if (fresh) {
      NameGroup g;
      g.name = *patterns[p->second];
      g.example = name;
      g.kind = a.kind;
      g.bytes_each = a.bytes;
      g.op = program.str(a.op);
      g.first_layer = g.last_layer = a.layer;
      out.by_name.push_back(std::move(g));
    }
    NameGroup& g = out.by_name[it->second];
    g.tensors += 1;
    g.bytes += a.bytes;
    if (a.layer >= 0) {
      g.first_layer = g.first_layer < 0 ? a.layer : std::min(g.first_layer, a.layer);
      g.last_layer = std::max(g.last_layer, a.layer);
    }
  }
  // Largest total first; ties keep the older group first (stable).
  std::stable_sort(out.by_name.begin(), out.by_name.end(),
                   [](const NameGroup& a, const NameGroup& b) { return a.bytes > b.bytes; });
}

}  // namespace

LiveSet live_set_at(const Program& program, size_t event_index, size_t top_n) {
  LiveSet out;
  const size_t n = program.events.size();
  const size_t last = std::min(event_index, n == 0 ? 0 : n - 1);
  out.event_index = last;
  if (n == 0) return out;

  // alloc_event[t] = index of tensor t's alloc while it is live, kDead otherwise.
  constexpr size_t kDead = SIZE_MAX;
  std::vector<size_t> alloc_event(program.tensors.size(), kDead);
  for (size_t i = 0; i <= last; ++i) {
    const MemoryEvent& e = program.events[i];
    if (e.tensor >= alloc_event.size()) continue;  // malformed Program: never crash
    if (e.type == EventType::alloc && e.bytes > 0) {
      alloc_event[e.tensor] = i;
    } else if (e.type == EventType::free) {
      alloc_event[e.tensor] = kDead;
    }
  }

  std::vector<LiveAlloc> live;
  for (uint32_t t = 0; t < alloc_event.size(); ++t)
    if (alloc_event[t] != kDead) live.push_back(LiveAlloc{t, alloc_event[t], program.events[alloc_event[t]], program.tensors[t]});
  return summarize_live_set(program, last, live, top_n);
}

LiveSet summarize_live_set(const Program& program, size_t event_index,
                           const std::vector<LiveAlloc>& live, size_t top_n) {
  LiveSet out;
  out.event_index = event_index;
  std::map<int32_t, LayerBytes> layers;
  std::unordered_map<uint32_t, NamedBytes> ops;
  std::vector<std::pair<uint64_t, size_t>> sizes;  // (bytes, index into live)
  for (size_t k = 0; k < live.size(); ++k) {
    const MemoryEvent& a = live[k].alloc;
    out.tensors += 1;
    out.bytes += a.bytes;
    out.by_kind[static_cast<size_t>(a.kind) % kTensorKindCount] += a.bytes;
    LayerBytes& lb = layers[a.layer];
    lb.layer = a.layer;
    lb.bytes += a.bytes;
    lb.tensors += 1;
    NamedBytes& ob = ops[a.op];
    ob.bytes += a.bytes;
    ob.tensors += 1;
    sizes.emplace_back(a.bytes, k);
  }

  for (auto& [layer, lb] : layers) out.by_layer.push_back(lb);
  for (auto& [op, ob] : ops) {
    ob.name = program.str(op);
    out.by_op.push_back(std::move(ob));
  }
  std::sort(out.by_op.begin(), out.by_op.end(), [](const NamedBytes& a, const NamedBytes& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
  });

  // Largest first; among equals the older tensor (smaller alloc event) first.
  auto larger = [&](const std::pair<uint64_t, size_t>& a, const std::pair<uint64_t, size_t>& b) {
    if (a.first != b.first) return a.first > b.first;
    return live[a.second].event < live[b.second].event;
  };
  const size_t keep = std::min(top_n, sizes.size());
  std::partial_sort(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(keep),
                    sizes.end(), larger);
  for (size_t k = 0; k < keep; ++k) {
    const LiveAlloc& l = live[sizes[k].second];
    const MemoryEvent& a = l.alloc;
    LiveTensor lt;
    lt.tensor = l.tensor;
    lt.name = tensor_name(program, l.info, a);
    lt.kind = a.kind;
    lt.bytes = a.bytes;
    lt.op = program.str(a.op);
    lt.phase = a.phase;
    lt.layer = a.layer;
    lt.alloc_event = l.event;
    out.largest.push_back(std::move(lt));
  }
  if (top_n > 0) group_by_name(program, live, out);
  return out;
}

}  // namespace memsim
