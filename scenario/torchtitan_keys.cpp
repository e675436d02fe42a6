#include "scenario/torchtitan_keys.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace memsim::scenario_detail {

namespace {

// torchao float8 training as torchtitan converts it (model.converters = ["float8"]):
// Float8Linear for every nn.Linear of the decoder layers, the output head kept
// (torchtitan's filter_fqns ["output"]). Modelled: the tensorwise, rowwise and
// rowwise_with_gw_hp recipes on the hf-llama family's llama row with bf16 parameters, one
// GPU or DDP (graph/ops/ops_float8.h, ops_float8_rowwise.h, docs/float8.md).
// Everything else is refused by key.
std::string raw(const Doc& d, const char* key) {
  const Field* f = d.find(key);
  return f != nullptr && f->node.IsScalar() ? f->node.Scalar() : std::string();
}

// precision.float8_all_gather / precision.float8_precompute_scale (torchtitan's
// enable_fsdp_float8_all_gather, precompute_float8_dynamic_scale_for_fsdp): need the
// tensorwise recipe (torchao's Float8LinearConfig asserts the all-gather is tensorwise
// only; precompute only finds WeightWithDynamicFloat8CastTensor weights) and FSDP2.
void check_float8_all_gather(const Doc& d, Scenario& s, int recipe) {
  const Field* ag = d.find("precision.float8_all_gather");
  const Field* pre = d.find("precision.float8_precompute_scale");
  const bool all_gather = ag != nullptr && read_bool(*ag, "precision.float8_all_gather");
  const bool precompute = pre != nullptr && read_bool(*pre, "precision.float8_precompute_scale");
  if (precompute && !all_gather)
    fail(pre->where, "precision.float8_precompute_scale",
         "precompute_float8_dynamic_scale_for_fsdp needs FSDP2's float8 all-gather "
         "(precision.float8_all_gather: true): it scales only WeightWithDynamicFloat8CastTensor "
         "weights (docs/float8.md)");
  if (!all_gather) return;
  if (recipe == 0)
    fail(ag->where, "precision.float8_all_gather",
         "FSDP2's float8 all-gather casts Float8Linear weights: set precision.float8: tensorwise "
         "(docs/float8.md)");
  if (recipe != 1)
    fail(ag->where, "precision.float8_all_gather",
         "torchao's Float8LinearConfig asserts enable_fsdp_float8_all_gather for the tensorwise "
         "recipe only; precision.float8 is " + raw(d, "precision.float8") + " (docs/float8.md)");
  if (raw(d, "parallel.sharding") != "fsdp2")
    fail(ag->where, "precision.float8_all_gather",
         "the float8 all-gather is FSDP2's (fully_shard's fsdp_pre_all_gather extension): set "
         "parallel.sharding: fsdp2 (docs/float8.md)");
  s.precision.float8_all_gather = true;
  s.precision.float8_precompute_scale = precompute;
}

void check_float8(const Doc& d, Scenario& s) {
  const Field* f = d.find("precision.float8");
  static const std::vector<std::pair<std::string, int>> kRecipes = {
      {"none", 0}, {"tensorwise", 1}, {"rowwise", 2}, {"rowwise_with_gw_hp", 3}};
  const int recipe = f == nullptr ? 0 : read_enum(*f, "precision.float8", kRecipes);
  check_float8_all_gather(d, s, recipe);
  if (recipe == 0) return;
  const bool all_gather = s.precision.float8_all_gather;
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
  const std::string sharding = raw(d, "parallel.sharding");
  if (sharding == "fsdp2" && !all_gather)
    fail(f->where, "precision.float8",
         recipe == 1 ? "tensorwise float8 with parallel.sharding fsdp2 is modelled with FSDP2's "
                       "float8 all-gather only (torchtitan's enable_fsdp_float8_all_gather): set "
                       "precision.float8_all_gather: true (docs/float8.md)"
                     : "rowwise float8 with parallel.sharding fsdp2 (a bf16 all-gather: torchao's "
                       "float8 all-gather is tensorwise only) is not modelled yet; use "
                       "precision.float8: none (docs/float8.md)");
  // Named at the offending key where the file sets it, else at precision.float8.
  auto refuse = [&](const char* key, const std::string& why) {
    const Field* k = d.find(key);
    fail(k != nullptr ? k->where : f->where, key,
         "precision.float8: " + f->node.Scalar() + ": " + why + " (docs/float8.md)");
  };
  if (s.model.family != ModelFamily::hf_llama)
    refuse("model.family", std::string(to_string(s.model.family)) +
                               " is not modelled; float8 is modelled for the hf-llama family");
  const graph::DecoderArch& a = s.model.arch;
  if (std::string(a.architecture) != "llama")
    refuse("model.architecture", std::string(a.architecture) +
                                     " is not modelled; float8 is modelled for the llama row");
  if (a.qkv_bias || a.o_bias || a.mlp_bias || a.fused_qkv || a.fused_gate_up ||
      a.linear != graph::LinearKind::linear || a.code != graph::ModelCode::llama)
    refuse("model.architecture", "the llama row's knobs were changed (biases or fused "
                                 "projections); only bias-free separate nn.Linear projections");
  const int64_t hd = a.head_dim > 0 ? a.head_dim : s.model.d_model / std::max<int64_t>(1, s.model.heads);
  const int64_t kv = s.model.kv_heads > 0 ? s.model.kv_heads : s.model.heads;
  for (int64_t dim : {s.model.d_model, s.model.heads * hd, kv * hd, s.model.d_ff})
    if (dim % 16 != 0)
      refuse("model.d_model", "a linear dimension " + std::to_string(dim) +
                                  " is not a multiple of 16 (torchao's converter skips such "
                                  "linears; a mixed model is not modelled)");
  // Under FSDP2's float8 all-gather torchtitan shards fp32 parameters with a bf16
  // param_dtype: the blocks compute in bf16 and the shards are cast from fp32.
  if (s.precision.params != DType::bf16 && !(all_gather && fsdp_bf16))
    refuse("precision.params", "bf16 compute through autocast or FSDP mixed precision is not "
                               "modelled (FSDP2's with precision.float8_all_gather is); use "
                               "precision.params: bf16");
  if (s.precision.autocast)
    refuse("precision.autocast", "Float8Linear under autocast is not modelled");
  if (s.precision.master_weights)
    refuse("precision.master_weights", "fp32 master weights are not modelled with float8");
  if (s.lora.rank > 0) refuse("lora.rank", "LoRA adapters on Float8Linear are not modelled");
  if (s.step.compile)
    refuse("step.compile", "compiled float8 (fused casts) is not modelled; the eager casts are");
  // Plain (non-selective) checkpointing re-runs the block's Float8Linear forwards
  // as they ran (graph/checkpoint.h); torchtitan's op SAC would have to map the float8
  // ops onto its save list (the Function's aten.mm on Float8TrainingTensors counts as an
  // mm, aten.max is tensorwise's amax), which memsim does not.
  if (s.checkpoint.policy == CheckpointPolicy::sac_op)
    refuse("checkpoint.policy", "sac-op is not modelled with float8 (torchtitan's save list "
                                "meets the Float8Linear's aten.mm and aten.max); use full or "
                                "sac-layer:N");
  if (s.checkpoint.policy != CheckpointPolicy::none &&
      s.checkpoint.policy != CheckpointPolicy::full &&
      s.checkpoint.policy != CheckpointPolicy::sac_layer)
    refuse("checkpoint.policy", std::string(to_string(s.checkpoint.policy)) +
                                    " is not checked with float8; torchtitan's full and "
                                    "sac-layer:N are");
  if (!sharding.empty() && sharding != "none" && !(sharding == "fsdp2" && all_gather))
    refuse("parallel.sharding", sharding + " is not modelled; one GPU or DDP (sharding none), "
                                "or fsdp2 with precision.float8_all_gather");
  for (const char* key : {"parallel.tensor", "parallel.pipeline", "parallel.context"}) {
    const std::string v = raw(d, key);
    if (!v.empty() && v != "1") refuse(key, "only one GPU or DDP is modelled");
  }
  static const Float8Recipe kRecipe[] = {Float8Recipe::none, Float8Recipe::tensorwise,
                                         Float8Recipe::rowwise, Float8Recipe::rowwise_with_gw_hp};
  s.precision.float8 = kRecipe[recipe];
}

}  // namespace

void check_torchtitan_keys(const Doc& d, Scenario& s) {
  check_float8(d, s);
}

}  // namespace memsim::scenario_detail
