// The KV cache of a served decoder, per rank, as the serving engines lay it out
// (issue #17 item 3; docs/serve.md). Pure arithmetic over integers: no Program, no allocator.
//
// Contract:
//  - kv_layers() turns a model (graph::DecoderArch + ModelConfig numbers) into one KvLayer
//    per decoder layer: the KV heads this rank stores (TP sharding, replicated when
//    kv_heads < TP, vLLM's ModelConfig.get_num_kv_heads: max(1, kv_heads // tp)), the head
//    size, the bytes per element of the cache dtype, and the layer's sliding window (0 =
//    full attention). An MLA layer (DeepSeek-V2/V3) stores one latent of
//    kv_lora_rank + qk_rope_head_dim per token, not K and V, and is never sharded by TP.
//  - page_bytes() is vLLM's AttentionSpec.page_size_bytes: 2 x block_size x kv_heads x
//    head_size x dtype bytes (MLA: block_size x latent x dtype bytes, one "head").
//  - plan_vllm_blocks() is vLLM V1's get_kv_cache_config (vllm/v1/core/kv_cache_utils.py
//    at bbf906a8, mid-2025): one group when every layer has the same spec
//    (num_blocks = available // page // layers), else the hybrid grouping by uniform page
//    size (Gemma-2/3: group_size = the fewest layers of one type, padded groups,
//    num_blocks = available // page // group_size); the token count and the maximum
//    concurrency it logs; and check_enough_kv_cache_memory's refusal as a flag.
//  - contiguous_kv_bytes() is the textbook formula (2 x layers x seq x kv_heads x head_dim x
//    bytes, a sliding layer holding min(seq, window) tokens): the seed values of issue #17.
// Every product is checked for int64 overflow (throws std::overflow_error).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memsim::serve {

struct KvLayer {
  int64_t kv_heads = 0;   // stored on this rank (after TP sharding / replication)
  int64_t head_dim = 0;   // per head; MLA: the latent width (kv_lora_rank + rope dim)
  int64_t elem_bytes = 2; // the cache dtype's bytes per element
  int64_t window = 0;     // sliding window in tokens; 0 = full attention
  bool mla = false;       // one latent per token (no separate K and V)
};

// Bytes of one token's K and V (MLA: its latent) in one layer.
int64_t token_bytes(const KvLayer& layer);
// vLLM's page_size_bytes for block_size tokens.
int64_t page_bytes(const KvLayer& layer, int64_t block_size);

// KV heads one of `tp` ranks stores; throws std::invalid_argument (vLLM's wording) when
// the heads cannot be split that way.
int64_t kv_heads_per_rank(int64_t kv_heads, int64_t tp);

// Bytes a request of `tokens` tokens needs at most in vLLM's paged cache
// (KVCacheSpec.max_memory_usage_bytes summed over layers): full layers
// cdiv(tokens, block) pages, sliding layers cdiv(min(window - 1 + max_batched, tokens),
// block) + 1 pages.
int64_t request_kv_bytes(const std::vector<KvLayer>& layers, int64_t tokens, int64_t block_size,
                         int64_t max_num_batched_tokens);

// The textbook contiguous KV of one sequence (HF's cache, no paging).
int64_t contiguous_kv_bytes(const std::vector<KvLayer>& layers, int64_t seq_len);

struct VllmKvPlan {
  int64_t page_bytes = 0;       // one block of one layer
  int64_t group_size = 0;       // layers per KV cache group (all layers when uniform)
  int64_t groups = 0;           // KV cache groups (1 when uniform)
  int64_t padding_layers = 0;   // hybrid grouping's padding (wasted share)
  int64_t num_gpu_blocks = 0;   // "# GPU blocks"
  int64_t kv_cache_bytes = 0;   // what the KV tensors take: num_blocks x page x group_size
  int64_t kv_cache_tokens = 0;  // "GPU KV cache size: N tokens"
  int64_t blocks_per_request = 0;  // blocks one max_model_len request needs (all groups)
  double max_concurrency = 0;   // "Maximum concurrency for L tokens per request: Xx"
  int64_t request_bytes = 0;    // KV one max_model_len request needs
  bool enough = true;           // false: check_enough_kv_cache_memory would raise
  // Largest max_model_len whose one request fits in `available` (vLLM's
  // estimate_max_model_len binary search, capped at max_len_cap); 0 when none does.
  int64_t max_model_len_that_fits = 0;
  bool uniform_type = true;
};

// vLLM V1's KV cache config for `available` bytes (may be <= 0: blocks 0, enough false).
// Throws std::invalid_argument when the layers' page sizes differ (vLLM raises
// NotImplementedError there).
VllmKvPlan plan_vllm_blocks(const std::vector<KvLayer>& layers, int64_t available,
                            int64_t block_size, int64_t max_model_len,
                            int64_t max_num_batched_tokens, int64_t max_len_cap);

// Largest L in [1, cap] with request_kv_bytes(L) <= available (0 if none).
int64_t largest_fitting_len(const std::vector<KvLayer>& layers, int64_t available,
                            int64_t block_size, int64_t max_num_batched_tokens, int64_t cap);

// "full" / "sliding(4096)" / "mla" summary of the layer kinds, for reports.
std::string describe_layers(const std::vector<KvLayer>& layers);

}  // namespace memsim::serve
