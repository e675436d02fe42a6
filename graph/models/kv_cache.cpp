// KvCache: transformers' DynamicCache / StaticCache over graph::Runtime (graph/models/kv_cache.h).
#include "graph/models/kv_cache.h"
#include <algorithm>
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
  if (kind_ != KvCacheKind::static_buffers || lazy_) return;
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

void KvCache::use_layers(const std::vector<uint8_t>& sliding, int64_t window) {
  layered_ = true;
  sliding_ = sliding;
  sliding_.resize(static_cast<size_t>(s_.layers), 0);
  window_ = window;
  held_.assign(static_cast<size_t>(s_.layers), 0);
  cumulative_.assign(static_cast<size_t>(s_.layers), 0);
  on_host_.assign(static_cast<size_t>(s_.layers), 0);
}

void KvCache::prefetch(size_t l) {
  if (l >= held_.size()) l = 0;  // Cache.prefetch wraps to the first layer
  if (on_host_[l] == 0 || held_[l] == 0) return;
  // keys.to(device, non_blocking=True) under the prefetch stream, then values: the host
  // copies die at the rebinding.
  const uint64_t b = entry_bytes(held_[l]);
  k_[l] = rt_.alloc(b, TensorKind::other, OpKind::to_copy);
  rt_.program().events.back().stream = kPrefetchStream;
  host_bytes_ -= b;
  v_[l] = rt_.alloc(b, TensorKind::other, OpKind::to_copy);
  rt_.program().events.back().stream = kPrefetchStream;
  host_bytes_ -= b;
  on_host_[l] = 0;
  name_layer(l);
}

void KvCache::offload(size_t l) {
  // keys.to("cpu", non_blocking=True), then values: host copies of the stored tokens; the
  // device tensors are released here (the attention's key/value still hold them).
  const uint64_t b = entry_bytes(held_[l]);
  for (Tensor* t : {&k_[l], &v_[l]}) {
    t->reset();
    host_bytes_ += b;
    host_peak_ = std::max(host_peak_, host_bytes_);
  }
  on_host_[l] = 1;
}

bool KvCache::has_layer_type(bool sliding) const {
  for (size_t l = 0; l < sliding_.size(); ++l)
    if ((sliding_[l] != 0) == sliding) return true;
  return false;
}

std::pair<int64_t, int64_t> KvCache::mask_sizes(bool sliding, int64_t queries) const {
  for (size_t l = 0; l < sliding_.size(); ++l) {
    if ((sliding_[l] != 0) != sliding) continue;
    if (!sliding) return {held_[l] + queries, 0};  // DynamicLayer.get_mask_sizes
    const int64_t c = cumulative_[l];              // DynamicSlidingWindowLayer's
    const int64_t offset = std::max<int64_t>(c - window_ + 1, 0);
    return {c >= window_ ? window_ - 1 + queries : c + queries, offset};
  }
  return {queries, 0};
}

void KvCache::update_layered(size_t l, Tensor& key, Tensor& value) {
  if (k_.size() <= l) {
    k_.resize(l + 1);
    v_.resize(l + 1);
  }
  if (offloading_) prefetch(l + 1);
  const int64_t queries = static_cast<int64_t>(key.bytes / entry_bytes(1));
  const int64_t full = held_[l] + queries;  // cat([kept keys, key_states], -2)
  if (sliding_[l] != 0) {
    // full_key_states, full_value_states = cat(...), cat(...); then the rebinding of
    // self.keys / self.values to their last window - 1 tokens (views) frees the old ones.
    Tensor fk = new_tensor(rt_, entry_bytes(full), OpKind::cat2, TensorKind::activation);
    Tensor fv = new_tensor(rt_, entry_bytes(full), OpKind::cat2, TensorKind::activation);
    k_[l] = fk;
    v_[l] = fv;
    cumulative_[l] += queries;
    held_[l] = std::min(full, window_ - 1);
  } else {
    // DynamicLayer: keys = cat([keys, key_states]) (the prefill's from torch.tensor([]):
    // a copy), then values.
    k_[l] = new_tensor(rt_, entry_bytes(full), OpKind::cat2, TensorKind::activation);
    v_[l] = new_tensor(rt_, entry_bytes(full), OpKind::cat2, TensorKind::activation);
    held_[l] = full;
  }
  returned_ = full;
  contiguous_ = true;
  name_layer(l);
  if (l == 0) seq_ = static_cast<int64_t>(k_[0].bytes / entry_bytes(1));
  key = k_[l];
  value = v_[l];
  if (offloading_) offload(l);
}

void KvCache::set_quantized(const QuantoSpec& spec, int64_t residual_length, bool truthy_from_start) {
  kind_ = KvCacheKind::quantized;
  quant_ = spec;
  residual_length_ = residual_length;
  truthy_from_start_ = truthy_from_start;
}

QuantoTensor KvCache::quantize_states(const Tensor& states, bool dense) {
  // self._quantize(states.contiguous(), axis=0): the copy (if any) dies when _quantize returns.
  Tensor x = dense ? states : clone(rt_, states);
  QuantoTensor q = use_hqq_ ? hqq_quantize(rt_, x.bytes / s_.elem, s_.elem, hqq_)
                            : quanto_quantize(rt_, x.bytes / s_.elem, s_.elem, quant_);
  x.reset();
  return q;
}

Tensor KvCache::dequantize(const QuantoTensor& q) {
  return use_hqq_ ? hqq_dequantize(rt_, q, s_.elem) : quanto_dequantize(rt_, q, s_.elem, quant_);
}

void KvCache::update_quantized(size_t l, Tensor& key, Tensor& value) {
  const int64_t S = static_cast<int64_t>(key.bytes / entry_bytes(1));
  if (qk_.size() <= l) {
    // First call: quantize the states (K, then V), an empty residual; return the states.
    qk_.resize(l + 1);
    qv_.resize(l + 1);
    k_.resize(l + 1);
    v_.resize(l + 1);
    q_tokens_.resize(l + 1, 0);
    res_tokens_.resize(l + 1, 0);
    qk_[l] = quantize_states(key, key_dense_);
    qv_[l] = quantize_states(value, value_dense_);
    q_tokens_[l] = S;
    res_tokens_[l] = 0;
    contiguous_ = false;  // the states themselves (RoPE's layout; v a transposed view)
  } else {
    Tensor dk = dequantize(qk_[l]);
    Tensor dv = dequantize(qv_[l]);
    const int64_t T = q_tokens_[l] + res_tokens_[l] + S;
    Tensor kr = new_tensor(rt_, entry_bytes(T), OpKind::cat_n, TensorKind::activation);
    Tensor vr = new_tensor(rt_, entry_bytes(T), OpKind::cat_n, TensorKind::activation);
    // `self.key_cache[l].dim() == 4 and shape[-2] + 1 >= residual_length`: the residual is
    // 4-D once a decode step appended to it (the prefill's zeros(0) is 1-D).
    if (k_[l].defined() && res_tokens_[l] + 1 >= residual_length_) {
      QuantoTensor nk = quantize_states(kr, true);
      qk_[l].reset();  // the old WeightQBitsTensor dies: data, scale, shift
      qk_[l] = nk;
      QuantoTensor nv = quantize_states(vr, true);
      qv_[l].reset();
      qv_[l] = nv;
      k_[l].reset();  // key_cache[l] = zeros(0), then value_cache[l]
      v_[l].reset();
      q_tokens_[l] = T;
      res_tokens_[l] = 0;
    } else {
      k_[l] = new_tensor(rt_, entry_bytes(res_tokens_[l] + S), OpKind::cat2, TensorKind::activation);
      v_[l] = new_tensor(rt_, entry_bytes(res_tokens_[l] + S), OpKind::cat2, TensorKind::activation);
      res_tokens_[l] += S;
    }
    dk.reset();  // update returns: dequant_key, then dequant_value
    dv.reset();
    key = kr;
    value = vr;
    contiguous_ = true;
  }
  returned_ = q_tokens_[l] + res_tokens_[l];
  if (l == 0) seq_ = returned_;
  name_quantized(l);
}

void KvCache::name_quantized(size_t l) {
  if (k_names_.size() <= l) {
    k_names_.resize(l + 1, 0);
    v_names_.resize(l + 1, 0);
  }
  if (k_names_[l] == 0) {
    k_names_[l] = rt_.program().intern("KV cache key of layer " + std::to_string(l));
    v_names_[l] = rt_.program().intern("KV cache value of layer " + std::to_string(l));
  }
  for (const Tensor* t : {&qk_[l].data, &qk_[l].scale, &qk_[l].shift, &k_[l]})
    if (t->defined()) rt_.name(t->storage, k_names_[l]);
  for (const Tensor* t : {&qv_[l].data, &qv_[l].scale, &qv_[l].shift, &v_[l]})
    if (t->defined()) rt_.name(t->storage, v_names_[l]);
}

void KvCache::update(int32_t layer, Tensor& key, Tensor& value) {
  const auto l = static_cast<size_t>(layer);
  if (kind_ == KvCacheKind::quantized) {
    update_quantized(l, key, value);
    return;
  }
  if (layered_) {
    update_layered(l, key, value);
    return;
  }
  if (kind_ == KvCacheKind::static_buffers) {
    if (lazy_ && !initialized(l)) {
      // StaticLayer.lazy_initialization (5.x): zeros for the keys, then the values.
      k_.resize(std::max(k_.size(), l + 1));
      v_.resize(std::max(v_.size(), l + 1));
      k_[l] = rt_.alloc(entry_bytes(max_len_), TensorKind::other, OpKind::zeros);
      v_[l] = rt_.alloc(entry_bytes(max_len_), TensorKind::other, OpKind::zeros);
      name_layer(l);
      seq_ = max_len_;
    }
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
  for (const auto* list : {&qk_, &qv_})
    for (const QuantoTensor& q : *list)
      for (const Tensor* t : {&q.data, &q.scale, &q.shift})
        if (t->defined()) total += p.tensors[t->storage].bytes;
  return total;
}

void KvCache::clear() {
  // Layer 0 to the last, K then V: each Tensor's free is an event, and std::vector::clear's
  // order is the library's (libstdc++ first to last, libc++, the WebAssembly build's, last
  // to first); same-sized entries freed in another order land in other allocator blocks.
  // QuantizedCache's attributes die in the order its __init__ set them: the quantized keys
  // of every layer, the quantized values, then the residual keys and values.
  for (QuantoTensor& q : qk_) q.reset();
  for (QuantoTensor& q : qv_) q.reset();
  qk_.clear();
  qv_.clear();
  q_tokens_.clear();
  res_tokens_.clear();
  for (Tensor& t : k_) t.reset();
  for (Tensor& t : v_) t.reset();
  k_.clear();
  v_.clear();
  seq_ = 0;
  if (layered_) {
    held_.assign(held_.size(), 0);
    cumulative_.assign(cumulative_.size(), 0);
    on_host_.assign(on_host_.size(), 0);
    host_bytes_ = 0;  // the host copies die with the cache
  }
}

}  // namespace memsim::graph
