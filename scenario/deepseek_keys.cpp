#include "scenario/deepseek_keys.h"

#include <cstring>
#include <string>

namespace memsim::scenario_detail {

namespace {

std::string where_of(const Doc& d, const char* key, const std::string& fallback) {
  const Field* f = d.find(key);
  return f ? f->where : fallback;
}

// PEFT LoRA (lora.targets) on DeepSeek-V2 / V3 (docs/deepseek.md "LoRA"): target_modules
// wraps nn.Linear modules, matched by name suffix. The attention has q_proj (q_lora_rank null)
// or q_a_proj and q_b_proj, kv_a_proj_with_mqa, kv_b_proj and o_proj; gate/up/down_proj are
// the dense layers' MLP and the MoE layers' shared_experts; the routed experts are 3-D
// parameters and the routers (DeepseekV3TopkRouter / V2's) are not nn.Linear, so neither is
// wrapped (all-linear included).
void check_deepseek_lora(const Doc& d, const Scenario& s, const std::string& at) {
  const graph::DecoderArch& a = s.model.arch;
  const std::string targets_at = where_of(d, "lora.targets", where_of(d, "lora.rank", at));
  const bool q_lora = a.mla.q_lora_rank > 0;
  for (const std::string& t : s.lora.targets) {
    std::string why;
    if (t == "k_proj" || t == "v_proj")
      why = "multi-head latent attention has no " + t + " (its keys and values come from "
            "kv_a_proj_with_mqa and kv_b_proj)";
    else if (t == "q_proj" && q_lora)
      why = "this config has q_lora_rank " + std::to_string(a.mla.q_lora_rank) +
            ": the query is q_a_proj and q_b_proj, not q_proj";
    else if ((t == "q_a_proj" || t == "q_b_proj") && !q_lora)
      why = "this config's q_lora_rank is null: the query is q_proj";
    if (!why.empty()) fail(targets_at, "lora.targets", "'" + t + "': " + why);
  }
  // QLoRA (lora.base_dtype nf4): the latent attention's projections, the dense layers' MLP
  // and the shared experts are nn.Linear, so bitsandbytes makes them Linear4bit; the router
  // (a bare weight) and the 3-D routed experts stay in precision.params (docs/deepseek.md
  // "QLoRA").
  // lora.target_parameters (PEFT's ParamWrapper on the routed experts) is read and checked
  // by scenario/lora_target_parameters_key.h, as for the other MoE rows.
}

}  // namespace

void check_deepseek(const Doc& d, const Scenario& s) {
  const graph::DecoderArch& a = s.model.arch;
  const std::string at = where_of(d, "model.hf_config", where_of(d, "model.architecture", d.where_missing("model")));
  const graph::MoeSpec& moe = a.moe;
  if (moe.experts > 0 && moe.code == graph::MoeRouterCode::deepseek_v3) {
    const std::string moe_at = where_of(d, "model.moe", at);
    if (moe.score != graph::MoeScore::sigmoid)
      fail(moe_at, "model.moe.router",
           "DeepSeek-V3's router is sigmoid (DeepseekV3MoE.route_tokens_to_experts); softmax is not its code");
    if (moe.output_router_logits)
      fail(moe_at, "model.moe.output_router_logits",
           "DeepseekV3ForCausalLM computes no auxiliary load-balancing loss (its balance is the "
           "e_score_correction_bias): remove it");
    if (moe.experts % moe.n_group != 0 || moe.experts / moe.n_group < 2)
      fail(moe_at, "model.moe.experts",
           std::to_string(moe.experts) + " experts do not split into the config's n_group " +
               std::to_string(moe.n_group) + " groups of at least 2 (each group's score is its top-2 sum)");
  }
  if (moe.experts > 0 && moe.code == graph::MoeRouterCode::deepseek_v2) {
    // DeepSeek-V2 (transformers 5.17.0 DeepseekV2TopkRouter; docs/deepseek.md "DeepSeek-V2").
    const std::string moe_at = where_of(d, "model.moe", at);
    if (moe.score != graph::MoeScore::softmax)
      fail(moe_at, "model.moe.router",
           "DeepSeek-V2's router is softmax (DeepseekV2TopkRouter.forward); sigmoid is DeepSeek-V3's");
    if (moe.output_router_logits)
      fail(moe_at, "model.moe.output_router_logits",
           "DeepseekV2ForCausalLM computes no auxiliary load-balancing loss in transformers 5.17: remove it");
    if (moe.group_limited && (moe.experts % moe.n_group != 0 || moe.topk_group > moe.n_group))
      fail(moe_at, "model.moe.experts",
           std::to_string(moe.experts) + " experts do not split into the config's n_group " +
               std::to_string(moe.n_group) + " groups with topk_group " + std::to_string(moe.topk_group) +
               " (group_limited_greedy views the scores as (T, n_group, experts / n_group))");
  }
  if (!a.mla.enabled()) {
    if (std::strcmp(a.architecture, "deepseek_v3") == 0 || std::strcmp(a.architecture, "deepseek_v2") == 0)
      fail(at, "model.architecture",
           std::string(a.architecture) + " needs its config.json (model.hf_config): the latent attention's sizes "
           "(q_lora_rank, kv_lora_rank, qk_nope/qk_rope/v head dims) have no scenario keys");
    return;
  }
  if (s.model.attention != AttentionImpl::eager)
    fail(where_of(d, "model.attention", at), "model.attention",
         std::string(to_string(s.model.attention)) +
             " is not modelled with multi-head latent attention (q/k are qk_head_dim wide, v "
             "v_head_dim: which SDPA kernel torch picks, and HF's padding of v for flash "
             "attention, are not modelled); use eager");
  if (s.model.kv_heads != s.model.heads)
    fail(where_of(d, "model.kv_heads", at), "model.kv_heads",
         "multi-head latent attention has one key/value head per query head (repeat_kv of "
         "DeepseekV3Attention's keys would not match its queries): kv_heads must equal heads");
  if (s.step.kind == StepKind::generate)
    fail(where_of(d, "step.kind", at), "step.kind",
         "generate with multi-head latent attention is not modelled (DynamicCache keeps the "
         "decompressed per-head keys and values)");
  if (s.lora.rank > 0) check_deepseek_lora(d, s, at);
  if (s.model.arch.impl != graph::ModelImpl::hf)
    fail(where_of(d, "model.implementation", at), "model.implementation",
         "multi-head latent attention is modelled for transformers' code (hf) only");
  if (s.precision.float8 != Float8Recipe::none)
    fail(where_of(d, "precision.float8", at), "precision.float8",
         "float8 linears with multi-head latent attention are not modelled");
}

}  // namespace memsim::scenario_detail
