#include "scenario/fsdp2_keys.h"

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
}

void reject_fsdp2_keys(const Doc& d, const ParallelConfig&) {
  for (const char* key : {"parallel.replicate", "parallel.reduce_dtype"}) {
    if (const Field* f = d.find(key))
      fail(f->where, key,
           "only applies with parallel.sharding: fsdp2 (FSDP1 is modelled with "
           "MixedPrecision(param_dtype = reduce_dtype) and without HYBRID_SHARD)");
  }
  // FSDP1's MixedPrecision has no output_dtype (its cast_root_forward_inputs casts inputs).
  if (const Field* f = d.find("parallel.fsdp_output_dtype"))
    fail(f->where, "parallel.fsdp_output_dtype",
         "MixedPrecisionPolicy.output_dtype is FSDP2's: it only applies with "
         "parallel.sharding: fsdp2");
}

}  // namespace memsim::scenario_detail
