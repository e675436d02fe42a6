#include "scenario/fsdp2_keys.h"

#include <cctype>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

namespace {
const std::vector<std::pair<std::string, bool>> kInit = {{"gpu", false}, {"cpu", true}};
const std::vector<std::pair<std::string, std::optional<DType>>> kParamDtype = {
    {"none", std::nullopt}, {"bf16", DType::bf16}, {"fp16", DType::fp16}};
const std::vector<std::pair<std::string, DType>> kReduceDtype = {
    {"fp32", DType::fp32}, {"bf16", DType::bf16}, {"fp16", DType::fp16}};
const std::vector<std::pair<std::string, std::optional<DType>>> kOutputDtype = {
    {"none", std::nullopt}, {"bf16", DType::bf16}, {"fp16", DType::fp16}, {"fp32", DType::fp32}};

// parallel.accelerate_version: "none", or "1.N" / "1.N.P" for the releases with FSDP2
// (fsdp2_prepare_model first in v1.6.0) up to the source read (huggingface/accelerate
// 16cb6eb8, 1.15.0.dev0). Returns 100 * major + minor, 0 for none.
int32_t read_accelerate_version(const Field& f) {
  const char* key = "parallel.accelerate_version";
  const std::string text = read_string(f, key);
  if (text == "none") return 0;
  int major = -1, minor = -1, patch = 0, used = 0, used3 = 0;
  const int n = std::sscanf(text.c_str(), "%d.%d%n.%d%n", &major, &minor, &used, &patch, &used3);
  const size_t consumed = static_cast<size_t>(n == 3 ? used3 : used);
  const bool digits = !text.empty() && std::isdigit(static_cast<unsigned char>(text[0]));
  if (n < 2 || !digits || consumed != text.size() || major < 0 || minor < 0 || patch < 0)
    fail(f.where, key,
         "'" + text + "' is not a version: write none (the loop's own fully_shard calls) or "
         "Accelerate's release as MAJOR.MINOR, e.g. \"1.14\"");
  const int32_t v = major * 100 + minor;
  if (v < 106)
    fail(f.where, key,
         "Accelerate " + text + " has no FSDP2 (fsdp2_prepare_model is first in v1.6.0)");
  if (v > 115)
    fail(f.where, key,
         "Accelerate " + text + " is newer than the source memsim read (1.15.0.dev0, "
         "huggingface/accelerate 16cb6eb8); its FSDP2 grouping is not checked");
  return v;
}

bool is_bool_text(const Field& f) {
  if (!f.node.IsScalar()) return false;
  std::string low;
  for (char c : f.node.Scalar()) low += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return low == "true" || low == "false" || low == "yes" || low == "no" || low == "on" ||
         low == "off";
}
}  // namespace

void read_fsdp2(const Doc& d, ParallelConfig& p) {
  if (const Field* f = d.find("parallel.zero"))
    fail(f->where, "parallel.zero",
         "FSDP2 (parallel.sharding: fsdp2) has no ZeRO stage switch: parameters, gradients "
         "and optimizer state are always sharded; use parallel.reshard_after_forward "
         "(true | false | N) instead, or parallel.sharding: fsdp for FSDP1's zero 2 / 3");
  p.zero = 3;  // parameters sharded at rest (rank reporting)
  if (const Field* f = d.find("parallel.replicate")) {
    p.replicate = read_int(*f, "parallel.replicate", 1);
    if (p.data % p.replicate != 0)
      fail(f->where, "parallel.replicate",
           std::to_string(p.replicate) + " replicas do not divide parallel.data " +
               std::to_string(p.data) + " (HSDP's mesh is (replicate, data / replicate))");
  }
  const int64_t shard = p.data / p.replicate;
  if (const Field* f = d.find("parallel.reshard_after_forward")) {
    if (is_bool_text(*f)) {
      p.reshard_after_forward = read_bool(*f, "parallel.reshard_after_forward");
    } else {
      const int64_t n = read_int(*f, "parallel.reshard_after_forward", 1);
      if (n > shard || shard % n != 0)
        fail(f->where, "parallel.reshard_after_forward",
             std::to_string(n) + " does not divide the shard group of " + std::to_string(shard) +
                 " ranks (parallel.data / parallel.replicate); fully_shard accepts a factor "
                 "of it");
      // torch: 1 means no resharding (False), the whole shard group means True.
      p.reshard_after_forward = n > 1;
      p.reshard_after_forward_ranks = (n > 1 && n < shard) ? n : 0;
    }
  }
  if (const Field* f = d.find("parallel.fsdp_init"))
    p.fsdp_init_on_cpu = read_enum(*f, "parallel.fsdp_init", kInit);
  if (const Field* f = d.find("parallel.cpu_offload"))
    p.cpu_offload = read_bool(*f, "parallel.cpu_offload");
  if (const Field* f = d.find("parallel.fsdp_mixed_precision"))
    p.fsdp_mixed_precision = read_enum(*f, "parallel.fsdp_mixed_precision", kParamDtype);
  if (const Field* f = d.find("parallel.reduce_dtype"))
    p.reduce_dtype = read_enum(*f, "parallel.reduce_dtype", kReduceDtype);
  if (const Field* f = d.find("parallel.fsdp_output_dtype"))
    p.fsdp_output_dtype = read_enum(*f, "parallel.fsdp_output_dtype", kOutputDtype);
  if (const Field* f = d.find("parallel.accelerate_version")) {
    p.accelerate_version = read_accelerate_version(*f);
    // FullyShardedDataParallelPlugin.__post_init__ (16cb6eb8 utils/dataclasses.py): FSDP2's
    // reshard_after_forward must be a bool.
    if (p.accelerate_version != 0 && p.reshard_after_forward_ranks != 0)
      fail(f->where, "parallel.accelerate_version",
           "Accelerate's FSDP2 plugin takes reshard_after_forward as a bool only; set "
           "parallel.reshard_after_forward to true or false");
  }
}

void reject_fsdp2_keys(const Doc& d, const ParallelConfig&) {
  for (const char* key : {"parallel.replicate", "parallel.reduce_dtype"}) {
    if (const Field* f = d.find(key))
      fail(f->where, key,
           "only applies with parallel.sharding: fsdp2 (FSDP1 is modelled with "
           "MixedPrecision(param_dtype = reduce_dtype) and without HYBRID_SHARD)");
  }
  // Accelerate's FSDP1 path (FullyShardedDataParallel with its auto-wrap policy) is not
  // this key's: it selects fsdp2_prepare_model's grouping.
  if (const Field* f = d.find("parallel.accelerate_version"))
    fail(f->where, "parallel.accelerate_version",
         "selects the modules Accelerate's fsdp2_prepare_model shards: it only applies with "
         "parallel.sharding: fsdp2");
  // FSDP1's MixedPrecision has no output_dtype (its cast_root_forward_inputs casts inputs).
  if (const Field* f = d.find("parallel.fsdp_output_dtype"))
    fail(f->where, "parallel.fsdp_output_dtype",
         "MixedPrecisionPolicy.output_dtype is FSDP2's: it only applies with "
         "parallel.sharding: fsdp2");
}

}  // namespace memsim::scenario_detail
