#include "scenario/megatron_moe_keys.h"

#include <cmath>
#include <string>
#include <vector>

namespace memsim::scenario_detail {

namespace {

const std::vector<std::string>& megatron_sub_keys() {
  static const std::vector<std::string> keys = {"dispatcher", "pad_to_capacity", "grouped_gemm",
                                                "recompute", "aux_loss_coeff", "z_loss_coeff"};
  return keys;
}

// model.moe.SUB as a Field on its own line ("--set" for an override merged into the map).
std::optional<Field> moe_sub(const Doc& d, const std::string& sub) {
  const Field* f = d.find("model.moe");
  if (f == nullptr || !f->node.IsMap()) return std::nullopt;
  for (auto it = f->node.begin(); it != f->node.end(); ++it) {
    if (!it->first.IsScalar() || it->first.Scalar() != sub) continue;
    if (f->where == "--set" || it->second.Mark().is_null()) return Field{it->second, "--set"};
    const std::string file = f->where.substr(0, f->where.rfind(':'));
    const int line = it->first.Mark().line >= 0 ? it->first.Mark().line + 1 : 1;
    return Field{it->second, file + ":" + std::to_string(line)};
  }
  return std::nullopt;
}

std::string where_of(const Doc& d, const std::string& key, const std::string& fallback) {
  if (const Field* f = d.find(key)) return f->where;
  if (key.rfind("model.moe.", 0) == 0)
    if (auto f = moe_sub(d, key.substr(10))) return f->where;
  if (const Field* f = d.find(fallback)) return f->where;
  return d.where_missing(fallback.substr(0, fallback.find('.')));
}

}  // namespace

bool is_megatron_moe_sub_key(const std::string& sub) {
  for (const auto& k : megatron_sub_keys())
    if (k == sub) return true;
  return false;
}

void read_megatron_moe(const Doc& d, Scenario& s) {
  MegatronMoeConfig& c = s.megatron_moe;
  if (const Field* f = d.find("parallel.expert")) c.expert = read_int(*f, "parallel.expert", 1);
  // Megatron's default ETP is the tensor-parallel size (megatron/training/arguments.py:
  // "if args.expert_tensor_parallel_size is None: args.expert_tensor_parallel_size =
  // args.tensor_model_parallel_size"; parallel_state.initialize_model_parallel likewise).
  if (const Field* f = d.find("parallel.expert_tensor"))
    c.expert_tensor = read_int(*f, "parallel.expert_tensor", 1);
  else if (s.model.family == ModelFamily::megatron && s.model.arch.moe.experts > 0)
    c.expert_tensor = s.parallel.tensor;
  if (auto f = moe_sub(d, "dispatcher")) {
    const std::string v = f->node.IsScalar() ? f->node.Scalar() : "";
    if (v == "flex")
      fail(f->where, "model.moe.dispatcher",
           "the flex dispatcher (DeepEP / HybridEP kernels with their own buffers) is not "
           "modelled: use allgather or alltoall");
    c.dispatcher = read_enum(*f, "model.moe.dispatcher",
                             std::vector<std::pair<std::string, MoeDispatcher>>{
                                 {"allgather", MoeDispatcher::allgather},
                                 {"alltoall", MoeDispatcher::alltoall}});
  }
  if (auto f = moe_sub(d, "capacity_factor")) {
    const double cf = read_number(*f, "model.moe.capacity_factor");
    if (!(cf > 0.0) || !std::isfinite(cf))
      fail(f->where, "model.moe.capacity_factor",
           "expected a number > 0, got '" + (f->node.IsScalar() ? f->node.Scalar() : describe(f->node)) + "'");
    c.capacity_factor = cf;
  }
  if (auto f = moe_sub(d, "pad_to_capacity")) c.pad_to_capacity = read_bool(*f, "model.moe.pad_to_capacity");
  if (auto f = moe_sub(d, "grouped_gemm")) c.grouped_gemm = read_bool(*f, "model.moe.grouped_gemm");
  // --moe-aux-loss-coeff (the aux_loss load-balancing type, Megatron's default) and
  // --moe-z-loss-coeff (issue #15 Megatron part 2; graph/models/megatron_moe_loss.cpp).
  for (const char* sub : {"aux_loss_coeff", "z_loss_coeff"}) {
    auto f = moe_sub(d, sub);
    if (!f) continue;
    const std::string key = std::string("model.moe.") + sub;
    const double v = read_number(*f, key);
    if (!(v >= 0.0) || !std::isfinite(v))
      fail(f->where, key,
           "expected a number >= 0, got '" + (f->node.IsScalar() ? f->node.Scalar() : describe(f->node)) + "'");
    if (std::string(sub) == "aux_loss_coeff") c.aux_loss_coeff = v;
    else c.z_loss_coeff = v;
  }
  if (auto f = moe_sub(d, "recompute")) {
    std::vector<std::string> items;
    if (f->node.IsScalar()) items.push_back(f->node.Scalar());
    else items = read_string_list(*f, "model.moe.recompute");
    for (const auto& item : items) {
      if (item == "moe") c.recompute_moe = true;
      else if (item == "shared_experts") c.recompute_shared_experts = true;
      else if (item == "moe_act") c.recompute_moe_act = true;
      else
        fail(f->where, "model.moe.recompute",
             "expected a list of moe, shared_experts, moe_act (Megatron's --recompute-modules "
             "for MoE), got '" + item + "'");
    }
  }
}

void check_megatron_moe(const Doc& d, const Scenario& s) {
  const MegatronMoeConfig& c = s.megatron_moe;
  const graph::MoeSpec& m = s.model.arch.moe;
  if (s.model.family != ModelFamily::megatron) {
    for (const char* key : {"parallel.expert", "parallel.expert_tensor"})
      if (const Field* f = d.find(key))
        fail(f->where, key, "expert parallelism is modelled for Megatron-Core's MoE (model.family megatron) only");
    for (const auto& sub : megatron_sub_keys())
      if (auto f = moe_sub(d, sub))
        fail(f->where, "model.moe." + sub, "a Megatron-Core MoE setting (model.family megatron); "
                                           "transformers' MoE blocks have no such option");
    return;
  }
  const std::string moe_at = where_of(d, "model.moe", "model.family");
  if (m.experts == 0) {
    for (const char* key : {"parallel.expert", "parallel.expert_tensor"})
      if (const Field* f = d.find(key))
        if ((std::string(key) == "parallel.expert" ? c.expert : c.expert_tensor) > 1)
          fail(f->where, key, "there are no experts (give model.moe)");
    return;
  }
  const ParallelConfig& p = s.parallel;
  // Without the key ETP is parallel.tensor (read_megatron_moe): say so where it matters.
  const std::string etp_default =
      d.find("parallel.expert_tensor") != nullptr
          ? ""
          : " (parallel.expert_tensor not given: Megatron's default is the tensor-parallel "
            "size, parallel.tensor " + std::to_string(p.tensor) + ")";
  const int64_t world = p.data * p.tensor * p.pipeline;
  if (m.experts % c.expert != 0)
    fail(where_of(d, "parallel.expert", "model.moe"), "parallel.expert",
         std::to_string(c.expert) + " expert-parallel ranks do not divide model.moe.experts " +
             std::to_string(m.experts) + " (Megatron: num_moe_experts % expert_model_parallel_size == 0)");
  if (world % (c.expert * c.expert_tensor * p.pipeline) != 0) {
    // Name ETP when EP alone would have divided the world.
    const char* key = c.expert_tensor > 1 && world % (c.expert * p.pipeline) == 0
                          ? "parallel.expert_tensor" : "parallel.expert";
    fail(where_of(d, key, "parallel.data"), key,
         "parallel.expert x parallel.expert_tensor x parallel.pipeline = " +
             std::to_string(c.expert) + " x " + std::to_string(c.expert_tensor) + " x " +
             std::to_string(p.pipeline) + " does not divide the world of parallel.data x "
             "parallel.tensor x parallel.pipeline = " + std::to_string(world) +
             " ranks (the expert data-parallel size must be a whole number)" + etp_default);
  }
  // Expert tensor parallelism (--expert-tensor-parallel-size; graph/models/megatron_moe.cpp):
  // each expert's fc1 columns and fc2 rows split over ETP (experts.py / transformer_engine.py
  // divide(ffn, tp_size), which asserts divisibility), and Megatron's TransformerConfig
  // asserts "Bias in Moe is only supported when ETP==1" for add_bias_linear.
  if (c.expert_tensor > 1) {
    const std::string etp_at = where_of(d, "parallel.expert_tensor", "parallel.tensor");
    if (m.expert_d_ff % c.expert_tensor != 0)
      fail(etp_at, "parallel.expert_tensor",
           std::to_string(c.expert_tensor) + " expert-tensor-parallel ranks do not divide "
           "model.moe.expert_d_ff " + std::to_string(m.expert_d_ff) +
               " (Megatron splits each expert's FFN columns over ETP: divide(ffn, etp))" + etp_default);
    if (s.megatron_arch.bias_linear)
      fail(etp_at, "parallel.expert_tensor",
           "Megatron-Core asserts \"Bias in Moe is only supported when ETP==1\" "
           "(TransformerConfig with add_bias_linear): set model.o_bias and model.mlp_bias "
           "false (--disable-bias-linear) or use parallel.expert_tensor 1" + etp_default);
  }
  if (p.tensor > 1 && !p.sequence)
    fail(where_of(d, "parallel.sequence", "parallel.tensor"), "parallel.sequence",
         "Megatron-Core's MoELayer raises ValueError in training when tensor parallelism is "
         "on without sequence parallelism: set parallel.sequence: true");
  // Pipeline stages (sim/megatron/megatron_pipeline_moe.h): each stage's MoE layers follow
  // the global layer index. TEGroupedMLP's workspaces and dummy wgrads are process-wide
  // (one set per rank, shared by the interleaved chunks: graph/models/megatron.h).
  if (c.pad_to_capacity && !c.capacity_factor)
    fail(where_of(d, "model.moe.pad_to_capacity", "model.moe"), "model.moe.pad_to_capacity",
         "needs model.moe.capacity_factor (Megatron asserts --moe-expert-capacity-factor for "
         "--moe-pad-expert-input-to-capacity)");
  if (c.grouped_gemm && !s.megatron_arch.swiglu)
    fail(where_of(d, "model.moe.grouped_gemm", "model.moe"), "model.moe.grouped_gemm",
         "TEGroupedMLP is modelled with SwiGLU experts only (model.mlp glu, model.activation "
         "silu, no biases): with GeLU experts and biases its fused bias-activation raises "
         "ValueError (swiglu / quick_gelu only) and the unfused path hands the biases to "
         "Transformer Engine's GroupedLinear; use false (SequentialMLP)");
  if (!m.norm_topk)
    fail(where_of(d, "model.moe.norm_topk", "model.moe"), "model.moe.norm_topk",
         "Megatron's softmax router normalises over the top-k scores (the pre-softmax router, "
         "--moe-router-pre-softmax, is not modelled): remove it");
  if (m.output_router_logits)
    fail(where_of(d, "model.moe.output_router_logits", "model.moe"), "model.moe.output_router_logits",
         "transformers' router-logits output has no Megatron counterpart: Megatron's "
         "load-balancing and z losses are model.moe.aux_loss_coeff and model.moe.z_loss_coeff");
  if (auto f = moe_sub(d, "experts_implementation"))
    fail(f->where, "model.moe.experts_implementation",
         "transformers' experts implementations do not apply to Megatron (see model.moe.grouped_gemm)");
  if (m.shared_d_ff > 0 && m.shared_d_ff % p.tensor != 0)
    fail(where_of(d, "model.moe.shared_experts", "model.moe"), "model.moe.shared_experts",
         "the shared experts' intermediate size " + std::to_string(m.shared_d_ff) +
             " must be divisible by parallel.tensor " + std::to_string(p.tensor));
  if (m.code == graph::MoeRouterCode::deepseek_v3)
    fail(moe_at, "model.moe", "DeepSeek-V3's group-limited router is not modelled for Megatron");
  // --recompute-modules moe_act (TEGroupedMLP's CheckpointWithoutOutput around the weighted
  // SwiGLU, graph/ops/ops_megatron_arch.h). Megatron-LM d98e8a64 transformer_config.py
  // raises "moe_act in recompute_modules is only supported with moe_grouped_gemm."; fp8 is
  // not modelled for this family. Inside --recompute-modules moe the MoE layer's re-run
  // would nest it (CheckpointFunction's re-run registers the hook on its own fc2 output),
  // which memsim's reentrant checkpoint engine does not model: refused.
  if (c.recompute_moe_act) {
    const std::string at = where_of(d, "model.moe.recompute", "model.moe");
    if (!c.grouped_gemm)
      fail(at, "model.moe.recompute",
           "moe_act needs model.moe.grouped_gemm: true (Megatron-Core raises \"moe_act in "
           "recompute_modules is only supported with moe_grouped_gemm.\")");
    if (c.recompute_moe)
      fail(at, "model.moe.recompute",
           "moe_act together with moe (the activation checkpoint nested in the MoE layer's "
           "reentrant re-run) is not modelled: use one of them");
  }
  if (c.recompute_moe || c.recompute_shared_experts || c.recompute_moe_act) {
    const CheckpointPolicy pol = s.checkpoint.policy;
    if (pol != CheckpointPolicy::none && pol != CheckpointPolicy::selective)
      fail(where_of(d, "model.moe.recompute", "model.moe"), "model.moe.recompute",
           std::string("Megatron's --recompute-modules apply with --recompute-granularity "
                       "selective only; checkpoint.policy is ") + to_string(pol) +
               " (use none or selective)");
  }
}

}  // namespace memsim::scenario_detail
