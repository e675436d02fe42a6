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
// generate.cache_classes v5 (use_layers()): the layered Cache classes transformers 5.x kept
// (cache_utils.py of huggingface/transformers 004999d972e478164dd7e8e508350937c803531e):
// DynamicCache(config=...) holds one layer object per model layer from the start --
//  - DynamicLayer: lazy_initialization stores torch.tensor([]) (no bytes), then every update,
//    the prefill's too, is keys = torch.cat([keys, k], -2) (the prefill copies the states):
//    K allocated, the old K freed, then V;
//  - DynamicSlidingWindowLayer (the config's sliding layers): full = cat([keys, k]) and
//    cat([values, v]) (both allocated first), then keys = full[:, :, -window + 1:, :] -- a view,
//    so the layer keeps the whole cat output (at most `window` tokens once decoding, the
//    prompt's length after a prefill longer than the window), the previous one freed -- and
//    the full states are returned to the attention (window - 1 + S keys when full);
//  - get_mask_sizes: (seq + S, 0) for DynamicLayer; for a sliding layer with cumulative length
//    c, (window - 1 + S if c >= window else c + S, max(c - window + 1, 0)).
// Offloading (generate.cache offloaded: 5.x `DynamicCache(config, offloading=True)`,
// offload_only_non_sliding False): Cache.update(k, v, idx) first prefetches layer idx + 1
// (layer 0 after the last) -- CacheLayerMixin.prefetch: when initialized and on the host,
// keys.to(device, non_blocking=True) then values, allocated on the prefetch stream
// (kPrefetchStream) -- then the layer's update, then offload(idx): keys.to("cpu"), values.to
// ("cpu"): contiguous host copies of what the layer stores (a sliding layer's window - 1
// token view); the device tensors die when the attention drops them. Host bytes (the copies
// alive) and their peak are counted here; the device holds about one layer besides the one
// being computed.
// set_lazy (generate.cache static with cache_classes v5): 5.x's StaticLayer allocates its
// zeros((B, KV, max_cache_len, hd)) keys, then values, at the layer's first update (inside
// the prefill), not in _prepare_cache_for_generation; get_seq_length() makes no tensors until
// layer 0 is initialized. StaticSlidingWindowLayer is not modelled here (the scenario reader
// refuses it: scenario/generate_keys.h).
// set_quantized (generate.cache quantized:int4 / int2): QuantizedCache with the optimum-quanto
// backend -- v4.45 cache_utils.py QuantizedCache.update (5.x's QuantizedLayer.update, read in
// transformers 5.17.0, is the same per layer; its cache holds its layers from the start, so it is
// truthy at the prefill: truthy_from_start). The first call of a layer quantizes
// key_states.contiguous() (a copy unless the states are dense: states_layout), then the
// values, keeps an empty residual (zeros(0): no bytes) and returns the states themselves;
// every later call dequantizes K then V (graph/models/quanto_kv.h), returns
// cat([dequant, residual, new], -2) for each (dense), then either re-quantizes those returned
// tensors whole when the residual is 4-D and holds residual_length - 1 tokens (K, the old
// quantized K freed; V; then the residuals freed) or appends the new token to the residual
// (cat; the first decode step's from the empty 1-D zeros(0): a copy). The dequantized locals
// die when update returns. get_seq_length is a Python int (no tensors). use_hqq: the same
// update with HQQQuantizedLayer's _quantize / _dequantize (5.x; graph/models/hqq_kv.h).
//
// Contract: the cache owns one Tensor handle per layer for K and V; bytes() is what it holds
// right now (the storages' bytes, the measured "cache size"); contiguous() tells the
// attention whether the key/value it returned are dense (B, KV, T, hd) tensors (a cat
// output or a static buffer), which matmul's reshape uses without a copy.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "graph/models/hf_shape.h"
#include "graph/models/hqq_kv.h"
#include "graph/models/quanto_kv.h"
#include "graph/runtime.h"

namespace memsim::graph {

enum class KvCacheKind : uint8_t { dynamic, static_buffers, quantized };

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

  // generate.cache_classes v5 (dynamic only): one layer object per model layer, sliding[l]
  // != 0 a DynamicSlidingWindowLayer of `window`, else a DynamicLayer.
  void use_layers(const std::vector<uint8_t>& sliding, int64_t window);
  bool layered() const { return layered_; }
  bool layer_sliding(size_t l) const { return layered_ && l < sliding_.size() && sliding_[l] != 0; }
  bool has_layer_type(bool sliding) const;
  // Cache.get_mask_sizes for the first layer of that type, before this forward's updates:
  // {kv_length, kv_offset} for a forward of `queries` tokens.
  std::pair<int64_t, int64_t> mask_sizes(bool sliding, int64_t queries) const;
  // Tokens of the keys the last update() handed the attention.
  int64_t returned_tokens() const { return returned_; }
  // StaticCache of 5.x: buffers allocated at each layer's first update.
  void set_lazy(bool on) { lazy_ = on; }
  // Whether layer l's static buffers exist (get_seq_length's any/sum runs only then).
  bool initialized(size_t l) const { return l < k_.size() && k_[l].defined(); }
  // Offloading of the v5 layers (after use_layers).
  void set_offloading(bool on) { offloading_ = on; }
  bool offloading() const { return offloading_; }
  // Host bytes of the offloaded copies alive now, and the most at once.
  uint64_t host_bytes() const { return host_bytes_; }
  uint64_t host_peak_bytes() const { return host_peak_; }
  // QuantizedCache (kind quantized): the backend's spec, residual_length, and whether the
  // cache object is truthy before the prefill (5.x's layers) or only after it (v4.45).
  void set_quantized(const QuantoSpec& spec, int64_t residual_length, bool truthy_from_start);
  bool truthy_from_start() const { return truthy_from_start_; }
  // After set_quantized: the HQQ backend (generate.cache quantized:int8, graph/models/hqq_kv.h)
  // quantizes and dequantizes instead of quanto; the same update and storages.
  void use_hqq(const HqqSpec& spec) { hqq_ = spec; use_hqq_ = true; }
  // Whether the key/value states the next update() receives are dense (B, KV, S, hd):
  // `.contiguous()` copies them otherwise before quantizing (the attention tells).
  void states_layout(bool key_dense, bool value_dense) {
    key_dense_ = key_dense;
    value_dense_ = value_dense;
  }
  // The allocator stream of the prefetches (CUDA's prefetch_stream: a side stream).
  static constexpr uint8_t kPrefetchStream = 1;

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
  // v5 layers: sliding flags, the window, per layer the tokens the stored (viewed) keys
  // expose and the cumulative length (DynamicSlidingWindowLayer.cumulative_length).
  void update_layered(size_t l, Tensor& key, Tensor& value);
  bool layered_ = false;
  std::vector<uint8_t> sliding_;
  int64_t window_ = 0;
  std::vector<int64_t> held_, cumulative_;
  int64_t returned_ = 0;
  // Offloading: which layers are on the host; the host bytes now and at most.
  void prefetch(size_t l);
  void offload(size_t l);
  bool offloading_ = false;
  bool lazy_ = false;
  std::vector<uint8_t> on_host_;
  uint64_t host_bytes_ = 0, host_peak_ = 0;
  // QuantizedCache: per layer the quantized K/V (quanto), the tokens they hold, the residual's
  // tokens (k_/v_ hold the residual tensors) and whether it is 4-D yet.
  void update_quantized(size_t l, Tensor& key, Tensor& value);
  void name_quantized(size_t l);
  QuantoTensor quantize_states(const Tensor& states, bool dense);
  QuantoSpec quant_;
  Tensor dequantize(const QuantoTensor& q);
  HqqSpec hqq_;
  bool use_hqq_ = false;
  int64_t residual_length_ = 0;
  bool truthy_from_start_ = false;
  bool key_dense_ = false, value_dense_ = false;
  std::vector<QuantoTensor> qk_, qv_;
  std::vector<int64_t> q_tokens_, res_tokens_;
};

}  // namespace memsim::graph
