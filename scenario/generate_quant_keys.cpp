// generate.residual_length and generate.q_group_size: the cache_config of transformers'
// QuantizedCache with the optimum-quanto backend (generate.cache quantized:int4 / int2;
// scenario/generate_keys.h, graph/models/quanto_kv.h, docs/generate.md "Quantized caches").
//
// Defaults are QuantizedCacheConfig's (v4.45) / QuantizedCache.__init__'s (5.x):
// residual_length 128, q_group_size 64 (axis_key = axis_value = 0, the defaults, are the only
// axes modelled). Refused by key: either key without a quantized cache (it would be ignored),
// and a q_group_size that does not divide kv_heads x head_dim -- optimum-quanto's group()
// raises "Group size (g) must be a divisor of (KV x T x hd)" for the cache lengths T it does
// not divide, and the lengths quantized (the prompt, then every re-quantization) run through
// consecutive values.
#include <string>

#include "scenario/generate_keys.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

void read_quantized_cache(const Doc& d, Scenario& s) {
  GenerateConfig& g = s.generate;
  const bool quantized = g.cache == GenerateCache::quantized_int4 || g.cache == GenerateCache::quantized_int2 ||
                         g.cache == GenerateCache::quantized_int8;  // int8: HQQ (graph/models/hqq_kv.h)
  for (const char* key : {"generate.residual_length", "generate.q_group_size"}) {
    const Field* f = d.find(key);
    if (f == nullptr) continue;
    if (!quantized)
      fail(f->where, key, std::string("is QuantizedCache's cache_config: it applies to generate.cache "
                                      "quantized:int8 / int4 / int2 only (generate.cache is ") +
                              to_string(g.cache) + "); remove it");
    if (std::string(key) == "generate.residual_length")
      g.residual_length = read_int(*f, key, 0);
    else
      g.q_group_size = read_int(*f, key, 1);
  }
  if (!quantized) return;
  const int64_t hd = s.model.arch.head_dim > 0 ? s.model.arch.head_dim
                                               : (s.model.heads > 0 ? s.model.d_model / s.model.heads : 0);
  const int64_t kv = s.model.kv_heads > 0 ? s.model.kv_heads : s.model.heads;
  const int64_t width = kv * hd;
  if (width > 0 && width % g.q_group_size != 0) {
    const Field* f = d.find("generate.q_group_size");
    fail(f != nullptr ? f->where : d.where_missing("generate"), "generate.q_group_size",
         "q_group_size " + std::to_string(g.q_group_size) + " does not divide kv_heads x head_dim = " +
             std::to_string(width) + ": optimum-quanto's group() raises \"Group size must be a "
             "divisor\" for the cache lengths it does not divide; choose a divisor of " +
             std::to_string(width));
  }
}

}  // namespace memsim::scenario_detail
