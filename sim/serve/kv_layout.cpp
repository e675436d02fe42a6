#include "sim/serve/kv_layout.h"

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>

namespace memsim::serve {

namespace {

int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw std::overflow_error("KV cache size overflows int64");
  return r;
}
int64_t add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw std::overflow_error("KV cache size overflows int64");
  return r;
}
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// vLLM's KVCacheSpec.type_id: layers of one type share a block table. Full attention is
// one type per page size; each sliding window size is its own type.
struct TypeKey {
  int64_t window;
  int64_t page;
  bool operator<(const TypeKey& o) const {
    return window != o.window ? window < o.window : page < o.page;
  }
};

// Pages one layer needs for a request of `tokens` tokens (max_memory_usage_bytes / page).
int64_t layer_pages(const KvLayer& l, int64_t tokens, int64_t block, int64_t max_batched) {
  if (l.window <= 0) return cdiv(tokens, block);
  const int64_t held = std::min(add(l.window - 1, max_batched), tokens);
  return cdiv(held, block) + 1;  // +1: the window need not start at a block boundary
}

}  // namespace

int64_t token_bytes(const KvLayer& l) {
  const int64_t per = mul(mul(l.kv_heads, l.head_dim), l.elem_bytes);
  return l.mla ? per : mul(2, per);
}

int64_t page_bytes(const KvLayer& l, int64_t block_size) { return mul(block_size, token_bytes(l)); }

int64_t kv_heads_per_rank(int64_t kv_heads, int64_t tp) {
  if (kv_heads <= 0 || tp <= 0) throw std::invalid_argument("kv_heads and tensor_parallel must be positive");
  // vllm/model_executor/layers/linear.py QKVParallelLinear: "number of KV heads is greater
  // than or equal to TP size" -> split; else each KV head is replicated on tp / kv ranks.
  if (kv_heads >= tp) {
    if (kv_heads % tp != 0)
      throw std::invalid_argument("Total number of key/value heads (" + std::to_string(kv_heads) +
                                  ") must be divisible by tensor parallel size (" +
                                  std::to_string(tp) + ").");
    return kv_heads / tp;
  }
  if (tp % kv_heads != 0)
    throw std::invalid_argument("tensor parallel size (" + std::to_string(tp) +
                                ") must be divisible by the number of key/value heads (" +
                                std::to_string(kv_heads) + ") to replicate them.");
  return 1;
}

int64_t request_kv_bytes(const std::vector<KvLayer>& layers, int64_t tokens, int64_t block_size,
                         int64_t max_num_batched_tokens) {
  int64_t total = 0;
  for (const KvLayer& l : layers)
    total = add(total, mul(layer_pages(l, tokens, block_size, max_num_batched_tokens),
                           page_bytes(l, block_size)));
  return total;
}

int64_t contiguous_kv_bytes(const std::vector<KvLayer>& layers, int64_t seq_len) {
  int64_t total = 0;
  for (const KvLayer& l : layers) {
    const int64_t held = l.window > 0 ? std::min(seq_len, l.window) : seq_len;
    total = add(total, mul(held, token_bytes(l)));
  }
  return total;
}

int64_t largest_fitting_len(const std::vector<KvLayer>& layers, int64_t available,
                            int64_t block_size, int64_t max_num_batched_tokens, int64_t cap) {
  auto fits = [&](int64_t len) {
    return request_kv_bytes(layers, len, block_size, max_num_batched_tokens) <= available;
  };
  if (cap < 1 || available <= 0 || !fits(1)) return 0;
  // vLLM's estimate_max_model_len: binary search over [1, cap] (the need is monotone).
  int64_t lo = 1, hi = cap, best = 1;
  while (lo <= hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) {
      best = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return best;
}

VllmKvPlan plan_vllm_blocks(const std::vector<KvLayer>& layers, int64_t available,
                            int64_t block_size, int64_t max_model_len,
                            int64_t max_num_batched_tokens, int64_t max_len_cap) {
  if (layers.empty()) throw std::invalid_argument("a model with no attention layers has no KV cache");
  if (block_size <= 0) throw std::invalid_argument("block_size must be positive");
  VllmKvPlan p;
  p.page_bytes = page_bytes(layers.front(), block_size);
  std::map<TypeKey, int64_t> types;  // layers per type, in type order
  for (const KvLayer& l : layers) {
    const int64_t page = page_bytes(l, block_size);
    if (page != p.page_bytes)
      throw std::invalid_argument(
          "the layers' KV page sizes differ (" + std::to_string(p.page_bytes) + " vs " +
          std::to_string(page) + " bytes): vLLM's get_kv_cache_config raises NotImplementedError");
    ++types[{l.window, page}];
  }
  p.uniform_type = types.size() == 1;
  const auto n_layers = static_cast<int64_t>(layers.size());
  if (p.uniform_type) {
    p.group_size = n_layers;
    p.groups = 1;
  } else {
    // _get_kv_cache_config_uniform_page_size: the "1" of the n:1 pattern is the group size.
    p.group_size = n_layers;
    for (const auto& [key, count] : types) p.group_size = std::min(p.group_size, count);
    for (const auto& [key, count] : types) {
      p.groups += cdiv(count, p.group_size);
      const int64_t pad = p.group_size - count % p.group_size;
      if (pad != p.group_size) p.padding_layers += pad;
    }
  }
  // get_num_blocks: available // page_size // num_layers (per pool), never negative.
  p.num_gpu_blocks = available > 0 ? available / p.page_bytes / p.group_size : 0;
  p.kv_cache_bytes = mul(mul(p.num_gpu_blocks, p.page_bytes), p.group_size);
  p.kv_cache_tokens = mul(p.num_gpu_blocks / p.groups, block_size);
  // get_max_concurrency_for_kv_cache_config: blocks one request needs over all groups.
  // Every layer of a group has the same spec, so the per-group need is one layer's pages.
  int64_t pages_per_request = 0;
  for (const auto& [key, count] : types) {
    KvLayer one;
    one.window = key.window;
    const int64_t per_layer = layer_pages(one, max_model_len, block_size, max_num_batched_tokens);
    pages_per_request = add(pages_per_request, mul(per_layer, cdiv(count, p.group_size)));
  }
  p.blocks_per_request = pages_per_request;
  p.max_concurrency = static_cast<double>(p.num_gpu_blocks) / static_cast<double>(pages_per_request);
  p.request_bytes = request_kv_bytes(layers, max_model_len, block_size, max_num_batched_tokens);
  p.enough = available > 0 && p.request_bytes <= available;
  p.max_model_len_that_fits =
      largest_fitting_len(layers, available, block_size, max_num_batched_tokens, max_len_cap);
  return p;
}

std::string describe_layers(const std::vector<KvLayer>& layers) {
  std::map<int64_t, int64_t> windows;
  bool mla = false;
  for (const KvLayer& l : layers) {
    ++windows[l.window];
    mla = mla || l.mla;
  }
  std::string out;
  for (const auto& [w, n] : windows) {
    if (!out.empty()) out += " + ";
    out += std::to_string(n) + (mla ? " MLA" : w > 0 ? " sliding(" + std::to_string(w) + ")" : " full");
  }
  return out;
}

}  // namespace memsim::serve
