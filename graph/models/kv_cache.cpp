// KvCache: transformers' DynamicCache / StaticCache over graph::Runtime (graph/models/kv_cache.h).
#include "graph/models/kv_cache.h"
#include <string>

#include "graph/ops/ops.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

KvCache::KvCache(Runtime& rt, const HfShape& shape, KvCacheKind kind, int64_t max_len)
    : rt_(rt), s_(shape), kind_(kind), max_len_(max_len) {}

uint64_t KvCache::entry_bytes(int64_t tokens) const {
  return static_cast<uint64_t>(s_.batch) * s_.kv_dim() * static_cast<uint64_t>(tokens) * s_.elem;
}

void KvCache::allocate() {
  if (kind_ != KvCacheKind::static_buffers) return;
  // StaticCache.__init__: per layer torch.zeros(cache_shape) for K, then V.
  k_.resize(static_cast<size_t>(s_.layers));
  v_.resize(static_cast<size_t>(s_.layers));
  const uint64_t bytes = entry_bytes(max_len_);
  for (int64_t l = 0; l < s_.layers; ++l) {
    rt_.ctx.layer = static_cast<int32_t>(l);
    k_[l] = rt_.alloc(bytes, TensorKind::other, OpKind::zeros);
    v_[l] = rt_.alloc(bytes, TensorKind::other, OpKind::zeros);
    name_layer(static_cast<size_t>(l));
  }
  rt_.ctx.layer = -1;
  seq_ = max_len_;
}

void KvCache::update(int32_t layer, Tensor& key, Tensor& value) {
  const auto l = static_cast<size_t>(layer);
  if (kind_ == KvCacheKind::static_buffers) {
    // k_out.index_copy_(2, cache_position, key_states): in place; the attention gets the
    // whole (B, KV, max_cache_len, hd) buffers.
    key = k_[l];
    value = v_[l];
    contiguous_ = true;
    return;
  }
  if (k_.size() <= l) {
    // DynamicCache.update, first call of this layer: the states themselves are stored.
    k_.resize(l + 1);
    v_.resize(l + 1);
    k_[l] = key;
    v_[l] = value;
    contiguous_ = false;  // RoPE's output keeps q's layout; v is a transposed view
  } else {
    // key_cache[l] = torch.cat([key_cache[l], key_states], dim=-2): the new tensor first,
    // then the old one is released by the rebinding; then the same for V.
    k_[l] = cat2(rt_, k_[l], key);
    v_[l] = cat2(rt_, v_[l], value);
    contiguous_ = true;
  }
  name_layer(l);
  if (layer == 0) seq_ = static_cast<int64_t>(k_[0].bytes / entry_bytes(1));
  key = k_[l];
  value = v_[l];
}

void KvCache::name_layer(size_t l) {
  // The names in the reports (program/tensor_names.h). DynamicCache's first entry is the
  // layer's key/value states themselves: they become the cache.
  if (k_names_.size() <= l) {
    k_names_.resize(l + 1, 0);
    v_names_.resize(l + 1, 0);
  }
  if (k_names_[l] == 0) {
    k_names_[l] = rt_.program().intern("KV cache key of layer " + std::to_string(l));
    v_names_[l] = rt_.program().intern("KV cache value of layer " + std::to_string(l));
  }
  rt_.name(k_[l].storage, k_names_[l]);
  rt_.name(v_[l].storage, v_names_[l]);
}

uint64_t KvCache::bytes() const {
  uint64_t total = 0;
  const Program& p = const_cast<Runtime&>(rt_).program();
  for (const auto* list : {&k_, &v_})
    for (const Tensor& t : *list)
      if (t.defined()) total += p.tensors[t.storage].bytes;
  return total;
}

void KvCache::clear() {
  // Layer 0 to the last, K then V: each Tensor's free is an event, and std::vector::clear's
  // order is the library's (libstdc++ first to last, libc++, the WebAssembly build's, last
  // to first); same-sized entries freed in another order land in other allocator blocks.
  for (Tensor& t : k_) t.reset();
  for (Tensor& t : v_) t.reset();
  k_.clear();
  v_.clear();
  seq_ = 0;
}

}  // namespace memsim::graph
