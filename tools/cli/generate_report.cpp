// generate_json / generate_fact (tools/cli/generate_report.h).
#include "tools/cli/generate_report.h"

#include "allocator/units.h"

namespace memsim::cli {
namespace {

bool quantized(const Scenario& s) {
  return s.generate.cache == GenerateCache::quantized_int4 || s.generate.cache == GenerateCache::quantized_int2 ||
         s.generate.cache == GenerateCache::quantized_int8;
}

bool hqq(const Scenario& s) { return s.generate.cache == GenerateCache::quantized_int8; }

// bytes_per_token: the unquantized states' (the formula), whatever the cache stores.
uint64_t bytes_per_token(const Scenario& s) {
  const int64_t hd = s.model.arch.head_dim > 0 ? s.model.arch.head_dim : s.model.d_model / s.model.heads;
  return 2ull * static_cast<uint64_t>(s.model.layers) * static_cast<uint64_t>(s.model.kv_heads) *
         static_cast<uint64_t>(hd) * static_cast<uint64_t>(dtype_bytes(s.precision.params)) *
         static_cast<uint64_t>(s.batch.micro_batch);
}

}  // namespace

Json generate_json(const Scenario& s, const GenerateFacts& f) {
  Json j = {{"prompt_len", s.generate.prompt_len},
            {"new_tokens", s.generate.new_tokens},
            {"cache", to_string(s.generate.cache)},
            {"logits_to_keep", s.generate.logits_to_keep},
            {"weights_bytes", f.weights_bytes},
            {"kv_cache_bytes_end", f.cache_bytes_end},
            {"kv_cache_tokens_end", f.cache_tokens_end},
            {"kv_cache_bytes_per_token", bytes_per_token(s)}};
  // Only where set, so the v4.45 reports keep their keys.
  if (s.generate.cache_classes_v5) j["cache_classes"] = "v5";
  if (s.generate.cache == GenerateCache::offloaded) {
    // Device bytes above; the layers' pinned host copies here (checkpoint.offload's
    // host_offload_bytes is the same peak, at the top level).
    j["kv_cache_host_bytes_end"] = f.cache_host_bytes_end;
    j["kv_cache_host_peak_bytes"] = f.cache_host_peak_bytes;
  }
  if (quantized(s)) {
    // QuantizedCache's cache_config (graph/models/quanto_kv.h): kv_cache_bytes_end above is
    // the packed data, scales, shifts and residual the run left.
    // quantized:int8 is the HQQ backend (graph/models/hqq_kv.h).
    j["quantization"] = {{"backend", hqq(s) ? "hqq" : "quanto"},
                         {"nbits", hqq(s) ? 8 : s.generate.cache == GenerateCache::quantized_int4 ? 4 : 2},
                         {"q_group_size", s.generate.q_group_size},
                         {"residual_length", s.generate.residual_length}};
  }
  return j;
}

std::string generate_fact(const Scenario& s, const GenerateFacts& f) {
  return std::to_string(s.batch.micro_batch) + " x (" + std::to_string(s.generate.prompt_len) +
         " prompt + " + std::to_string(s.generate.new_tokens) + " new tokens), " +
         to_string(s.generate.cache) + " KV cache " + human_bytes(f.cache_bytes_end) + " at the end (" +
         std::to_string(f.cache_tokens_end) + " tokens, " + human_bytes(bytes_per_token(s)) +
         " per token), weights " + human_bytes(f.weights_bytes) +
         (s.generate.cache == GenerateCache::offloaded
              ? ", host copies " + human_bytes(f.cache_host_peak_bytes) + " at most"
              : std::string()) +
         (quantized(s) ? std::string(hqq(s) ? " (hqq" : " (quanto") + ", q_group_size " + std::to_string(s.generate.q_group_size) +
                             ", residual_length " + std::to_string(s.generate.residual_length) +
                             "; per token: unquantized)"
                       : std::string());
}

}  // namespace memsim::cli
