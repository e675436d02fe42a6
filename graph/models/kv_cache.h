// The KV cache of Hugging Face generation (issue #17 item 1): transformers' DynamicCache and
// StaticCache as they allocate and free device memory, over graph::Runtime.
//
// Modelled from transformers v4.45 src/transformers/cache_utils.py (main just before the
// v4.46.0.dev0 bump, a55adee890b0757461e1588d8847fd385ce5c214):
//  - DynamicCache.update(k, v, layer): the first call of a layer stores the layer's key and
//    value states themselves (the RoPE output and the view of v_proj's output: no copy, the
//    cache keeps those storages); every later call rebinds key_cache[layer] to
//    torch.cat([old, k], dim=-2) -- the new (B, KV, T, hd) tensor is allocated before the
//    old one is freed, so each layer holds two copies of its K for a moment, then of its V;
//  - StaticCache.__init__: torch.zeros((B, KV, max_cache_len, hd)) for K, then V, per layer,
//    before the prefill; update() is index_copy_ in place (no allocation) and returns the
//    whole buffers, so the attention sees max_cache_len keys every step;
//    get_seq_length() = key_cache[0][0, 0].any(dim=-1).sum(): a (max_cache_len,) bool and a
//    0-d int64 temporary (DecoderModel::forward_generate emits them).
// Sliding-window layers, quantized and offloaded caches are not modelled here (the scenario
// reader refuses them: scenario/generate_keys.h).
//
// Contract: the cache owns one Tensor handle per layer for K and V; bytes() is what it holds
// right now (the storages' bytes, the measured "cache size"); contiguous() tells the
// attention whether the key/value it returned are dense (B, KV, T, hd) tensors (a cat
// output or a static buffer), which matmul's reshape uses without a copy.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/models/hf_shape.h"
#include "graph/runtime.h"

namespace memsim::graph {

enum class KvCacheKind : uint8_t { dynamic, static_buffers };

class KvCache {
 public:
  // max_len: StaticCache's max_cache_len (generation_config.max_length); unused by dynamic.
  KvCache(Runtime& rt, const HfShape& shape, KvCacheKind kind, int64_t max_len);

  KvCacheKind kind() const { return kind_; }
  int64_t max_len() const { return max_len_; }
  // StaticCache.__init__: the zero buffers, K then V per layer (nothing for dynamic).
  void allocate();
  // Cache.update for layer `layer`: replaces key/value with the tensors the attention uses.
  void update(int32_t layer, Tensor& key, Tensor& value);
  // Whether the tensors update() last returned are dense (B, KV, T, hd).
  bool contiguous() const { return contiguous_; }
  // Tokens the layer-0 entry holds (dynamic) or max_len (static).
  int64_t seq_length() const { return seq_; }
  // Bytes of the storages the cache holds now.
  uint64_t bytes() const;
  // Drops every entry (the cache object dies with generate's model_kwargs).
  void clear();

 private:
  uint64_t entry_bytes(int64_t tokens) const;

  Runtime& rt_;
  const HfShape& s_;
  KvCacheKind kind_;
  int64_t max_len_;
  std::vector<Tensor> k_, v_;
  // "KV cache key of layer 3" / "... value ...": interned once per layer (names()).
  std::vector<uint32_t> k_names_, v_names_;
  void name_layer(size_t l);
  bool contiguous_ = false;
  int64_t seq_ = 0;
};

}  // namespace memsim::graph
