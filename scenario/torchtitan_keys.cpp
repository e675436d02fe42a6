#include "scenario/torchtitan_keys.h"

#include <string>
#include <utility>
#include <vector>

namespace memsim::scenario_detail {

namespace {

// Context parallelism (torchtitan parallelism.context_parallel_degree): torch's ring
// attention, torch/distributed/tensor/experimental/_attention.py.
void check_context(const Doc& d, const Scenario& s) {
  const Field* f = d.find("parallel.context");
  if (f == nullptr) return;
  const int64_t n = read_int(*f, "parallel.context", 1);
  if (n == 1) return;  // torchtitan's default: no context parallelism
  // torchtitan's parallelize_llama asserts seq_len % (tp * 2 * cp) == 0: the causal
  // load balancer cuts the sequence into 2N chunks (rank i holds chunks i and 2N-1-i).
  const int64_t divisor = 2 * n * s.parallel.tensor;
  if (s.batch.seq_len % divisor != 0)
    fail(f->where, "parallel.context",
         "batch.seq_len " + std::to_string(s.batch.seq_len) + " is not divisible by 2 x " +
             std::to_string(n) + (s.parallel.tensor > 1 ? " x parallel.tensor " : "") +
             (s.parallel.tensor > 1 ? std::to_string(s.parallel.tensor) : "") +
             " (context parallelism's load-balanced sharding cuts it into 2N chunks)");
  if (s.model.attention == AttentionImpl::eager)
    fail(f->where, "parallel.context",
         "ring attention replaces the SDPA flash / mem-efficient kernels; model.attention "
         "eager has none to replace (use flash or mem-efficient)");
  fail(f->where, "parallel.context",
       "context parallelism is not modelled yet (the ring's KV buffers, the merged output "
       "and logsumexp; docs/torchtitan-recipes.md); use parallel.context: 1");
}

// torchao float8 training as torchtitan converts it (model.converters = ["float8"]).
void check_float8(const Doc& d, const Scenario& s) {
  const Field* f = d.find("precision.float8");
  if (f == nullptr) return;
  static const std::vector<std::pair<std::string, int>> kRecipes = {
      {"none", 0}, {"tensorwise", 1}, {"rowwise", 2}};
  if (read_enum(*f, "precision.float8", kRecipes) == 0) return;
  // Float8Linear casts bf16 activations and weights: the model must compute in bf16
  // (bf16 parameters, bf16 autocast, or FSDP's bf16 param_dtype).
  const Field* mp = d.find("parallel.fsdp_mixed_precision");
  const bool fsdp_bf16 = mp != nullptr && mp->node.IsScalar() && mp->node.Scalar() == "bf16";
  const bool bf16 = s.precision.params == DType::bf16 ||
                    (s.precision.autocast && *s.precision.autocast == DType::bf16) || fsdp_bf16;
  if (!bf16)
    fail(f->where, "precision.float8",
         "float8 training needs a bf16 compute dtype: precision.params bf16, precision.autocast "
         "bf16, or parallel.fsdp_mixed_precision bf16 (the scenario has precision.params " +
             std::string(to_string(s.precision.params)) + " and no bf16 autocast)");
  const Field* sh = d.find("parallel.sharding");
  if (sh != nullptr && sh->node.IsScalar() && sh->node.Scalar() == "fsdp2")
    fail(f->where, "precision.float8",
         "float8 with parallel.sharding fsdp2 (enable_fsdp_float8_all_gather) is not modelled "
         "yet; use precision.float8: none");
  fail(f->where, "precision.float8",
       "torchao float8 training is not modelled yet (the float8 casts, scales and what "
       "Float8Linear saves; docs/torchtitan-recipes.md); use precision.float8: none");
}

}  // namespace

void check_torchtitan_keys(const Doc& d, const Scenario& s) {
  check_context(d, s);
  check_float8(d, s);
}

}  // namespace memsim::scenario_detail
