#include "scenario/serve_keys.h"

#include <cstdio>
#include <string>

#include "scenario/yaml_fields.h"

namespace memsim {

const char* to_string(ServeEngine e) { return e == ServeEngine::vllm ? "vllm" : "sglang"; }
const char* to_string(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::automatic: return "auto";
    case KvCacheDtype::fp8: return "fp8";
    case KvCacheDtype::int8: return "int8";
  }
  return "?";
}
const char* to_string(WeightQuant q) {
  switch (q) {
    case WeightQuant::none: return "none";
    case WeightQuant::fp8: return "fp8";
    case WeightQuant::int8: return "int8";
    case WeightQuant::int4: return "int4";
    case WeightQuant::nf4: return "nf4";
  }
  return "?";
}

std::string ServeConfig::where_of(const std::string& key, const std::string& source) const {
  for (const auto& [k, w] : key_where)
    if (k == key) return w;
  return where.empty() ? source : where;
}

namespace scenario_detail {

namespace {

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

void read_serve(const Doc& d, Scenario& s) {
  ServeConfig& c = s.serve;
  static const char* kKeys[] = {"engine", "gpu_memory_utilization", "mem_fraction_static",
                                "max_model_len", "max_num_batched_tokens", "max_num_seqs",
                                "block_size", "kv_cache_dtype", "cuda_graphs",
                                "tensor_parallel", "prefix_caching", "quantization",
                                "nccl_memory", "fused_moe_chunk_size"};
  for (const char* k : kKeys) {
    const std::string key = std::string("serve.") + k;
    if (const Field* f = d.find(key)) c.key_where.emplace_back(key, f->where);
  }
  const auto at = d.section_at.find("serve");
  c.present = at != d.section_at.end() || !c.key_where.empty();
  // Keys of the training / HF step that the serve plan would otherwise ignore: where they
  // were set, for sim/serve/serve_plan.cpp's refusals (memsim run still uses them).
  for (const char* key : {"lora.rank", "precision.autocast", "parallel.data", "parallel.tensor",
                          "parallel.pipeline", "parallel.sharding"})
    if (const Field* f = d.find(key)) c.key_where.emplace_back(key, f->where);
  if (!c.present) return;
  c.where = at != d.section_at.end() ? at->second : c.key_where.front().second;

  if (const Field* f = d.find("serve.engine")) {
    static const std::vector<std::pair<std::string, ServeEngine>> kEngines = {
        {"vllm", ServeEngine::vllm}, {"sglang", ServeEngine::sglang}};
    c.engine = read_enum(*f, "serve.engine", kEngines);
  }
  const bool vllm = c.engine == ServeEngine::vllm;
  if (const Field* f = d.find("serve.gpu_memory_utilization")) {
    if (!vllm)
      fail(f->where, "serve.gpu_memory_utilization",
           "is vLLM's; SGLang sizes its static pool with serve.mem_fraction_static");
    const double u = read_number(*f, "serve.gpu_memory_utilization");
    // vllm/config CacheConfig: gpu_memory_utilization > 0 and <= 1 ("GPU memory
    // utilization must be less than 1.0. Got x." above 1).
    if (!(u > 0.0 && u <= 1.0))
      fail(f->where, "serve.gpu_memory_utilization",
           "must be in (0, 1]" +
               std::string(u > 1.0 ? " (vLLM: \"GPU memory utilization must be less than 1.0. Got " +
                                         number_text(u) + ".\")"
                                   : ", got " + number_text(u)));
    c.gpu_memory_utilization = u;
  }
  if (const Field* f = d.find("serve.mem_fraction_static")) {
    if (vllm)
      fail(f->where, "serve.mem_fraction_static",
           "is SGLang's; vLLM sizes its budget with serve.gpu_memory_utilization");
    const double m = read_number(*f, "serve.mem_fraction_static");
    if (!(m > 0.0 && m < 1.0))
      fail(f->where, "serve.mem_fraction_static", "must be in (0, 1), got " + number_text(m));
    c.mem_fraction_static = m;
  }
  if (const Field* f = d.find("serve.max_model_len")) {
    c.max_model_len = read_int(*f, "serve.max_model_len", 1);
    // vllm/config.py _get_and_verify_max_len (the model's max_position_embeddings).
    if (s.model.context_length > 0 && c.max_model_len > s.model.context_length)
      fail(f->where, "serve.max_model_len",
           "User-specified max_model_len (" + std::to_string(c.max_model_len) +
               ") is greater than the derived max_model_len (max_position_embeddings=" +
               std::to_string(s.model.context_length) +
               " in model's config.json). This may lead to incorrect model outputs or CUDA "
               "errors.");
  }
  if (const Field* f = d.find("serve.max_num_batched_tokens"))
    c.max_num_batched_tokens = read_int(*f, "serve.max_num_batched_tokens", 1);
  if (const Field* f = d.find("serve.max_num_seqs"))
    c.max_num_seqs = read_int(*f, "serve.max_num_seqs", 1);
  if (const Field* f = d.find("serve.block_size")) {
    c.block_size = read_int(*f, "serve.block_size", 1);
    // vllm/config CacheConfig.block_size: BlockSize = Literal[1, 8, 16, 32, 64, 128].
    const int64_t b = c.block_size;
    if (vllm && b != 1 && b != 8 && b != 16 && b != 32 && b != 64 && b != 128)
      fail(f->where, "serve.block_size",
           "argument --block-size: invalid choice: " + std::to_string(b) +
               " (choose from 1, 8, 16, 32, 64, 128)");
  }
  if (const Field* f = d.find("serve.kv_cache_dtype")) {
    static const std::vector<std::pair<std::string, KvCacheDtype>> kDtypes = {
        {"auto", KvCacheDtype::automatic}, {"fp8", KvCacheDtype::fp8}, {"int8", KvCacheDtype::int8}};
    c.kv_cache_dtype = read_enum(*f, "serve.kv_cache_dtype", kDtypes);
    if (c.kv_cache_dtype == KvCacheDtype::int8)
      fail(f->where, "serve.kv_cache_dtype",
           vllm ? "int8 is not a vLLM KV cache dtype on CUDA (argument --kv-cache-dtype: choose "
                  "from auto, fp8, fp8_e4m3, fp8_e5m2); use auto or fp8"
                : "int8 is not an SGLang KV cache dtype (--kv-cache-dtype: auto, fp8_e5m2, "
                  "fp8_e4m3); use auto or fp8");
  }
  if (const Field* f = d.find("serve.cuda_graphs")) c.cuda_graphs = read_bool(*f, "serve.cuda_graphs");
  if (const Field* f = d.find("serve.tensor_parallel"))
    c.tensor_parallel = read_int(*f, "serve.tensor_parallel", 1);
  if (const Field* f = d.find("serve.prefix_caching"))
    c.prefix_caching = read_bool(*f, "serve.prefix_caching");
  if (const Field* f = d.find("serve.quantization")) {
    static const std::vector<std::pair<std::string, WeightQuant>> kQuant = {
        {"none", WeightQuant::none}, {"fp8", WeightQuant::fp8}, {"int8", WeightQuant::int8},
        {"int4", WeightQuant::int4}, {"nf4", WeightQuant::nf4}};
    c.quantization = read_enum(*f, "serve.quantization", kQuant);
  }
  if (const Field* f = d.find("serve.nccl_memory")) c.nccl_memory = read_size(*f, "serve.nccl_memory");
  if (const Field* f = d.find("serve.fused_moe_chunk_size")) {
    if (!vllm)
      fail(f->where, "serve.fused_moe_chunk_size",
           "is vLLM's VLLM_FUSED_MOE_CHUNK_SIZE; SGLang's static pool does not depend on it");
    c.fused_moe_chunk_size = read_int(*f, "serve.fused_moe_chunk_size", 1);
  }
}

}  // namespace scenario_detail
}  // namespace memsim
