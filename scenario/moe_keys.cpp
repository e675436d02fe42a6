#include "scenario/moe_keys.h"

#include <cmath>
#include <string>
#include <vector>

#include "scenario/megatron_moe_keys.h"
#include "scenario/scenario_family.h"
#include "scenario/scenario_lora.h"

namespace memsim::scenario_detail {

const std::vector<std::string>& moe_sub_keys() {
  static const std::vector<std::string> keys = {
      "experts",  "top_k",     "shared_experts", "expert_d_ff",           "first_dense_layers",
      "router",   "norm_topk", "routing",        "experts_implementation", "capacity_factor",
      "output_router_logits",
      // Megatron-Core's knobs (family megatron; scenario/megatron_moe_keys.h)
      "dispatcher", "pad_to_capacity", "grouped_gemm", "recompute", "aux_loss_coeff", "z_loss_coeff"};
  return keys;
}

namespace {

bool moe_row(const graph::DecoderArch& a) {
  const std::string name = a.architecture;
  return name == "mixtral" || name == "qwen2_moe" || name == "qwen3_moe" || name == "olmoe" ||
         name == "deepseek_v3" || name == "deepseek_v2";
}

// A sub-key's own line (a --set value's "--set").
Field sub_field(const Field& parent, const YAML::Node& key, const YAML::Node& value) {
  // A value merged in by merge_moe_override has no mark: it came from --set.
  if (parent.where == "--set" || value.Mark().is_null()) return Field{value, "--set"};
  const std::string file = parent.where.substr(0, parent.where.rfind(':'));
  const int line = key.Mark().line >= 0 ? key.Mark().line + 1 : 1;
  return Field{value, file + ":" + std::to_string(line)};
}

// balanced | worst-case | skew:ALPHA | counts:[...] (a YAML list, or the text form).
void read_routing(const Field& f, const std::string& key, graph::MoeSpec& m) {
  const std::string forms = "balanced, worst-case, skew:ALPHA (ALPHA >= 0) or counts:[N, ...]";
  auto counts_from = [&](const YAML::Node& list) {
    m.counts.clear();
    for (const auto& item : list) {
      const std::string v = item.IsScalar() ? item.Scalar() : "";
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 0)
        fail(f.where, key, "counts: expected non-negative integers (tokens per expert), got " +
                               describe(item));
      m.counts.push_back(n);
    }
    if (m.counts.empty()) fail(f.where, key, "counts: an empty list");
    m.routing = graph::MoeRouting::counts;
  };
  if (f.node.IsMap() && f.node.size() == 1 && f.node["counts"]) {  // {counts: [...]}
    if (!f.node["counts"].IsSequence()) fail(f.where, key, "counts: expected a list, got " + describe(f.node["counts"]));
    return counts_from(f.node["counts"]);
  }
  if (!f.node.IsScalar()) fail(f.where, key, "expected " + forms + ", got " + describe(f.node));
  const std::string text = f.node.Scalar();
  if (text == "balanced") { m.routing = graph::MoeRouting::balanced; return; }
  if (text == "worst-case") { m.routing = graph::MoeRouting::worst_case; return; }
  if (text.rfind("skew:", 0) == 0) {
    char* end = nullptr;
    const std::string a = text.substr(5);
    const double alpha = std::strtod(a.c_str(), &end);
    if (a.empty() || *end != '\0' || !(alpha >= 0.0) || !std::isfinite(alpha))
      fail(f.where, key, "skew:ALPHA needs a number ALPHA >= 0, got '" + text + "'");
    m.routing = graph::MoeRouting::skew;
    m.skew_alpha = alpha;
    return;
  }
  if (text.rfind("counts:", 0) == 0) {
    YAML::Node list;
    try {
      list = YAML::Load(text.substr(7));
    } catch (const YAML::Exception&) {
      fail(f.where, key, "counts: expected a list [N, ...], got '" + text.substr(7) + "'");
    }
    if (!list.IsSequence()) fail(f.where, key, "counts: expected a list [N, ...], got '" + text.substr(7) + "'");
    return counts_from(list);
  }
  fail(f.where, key, "expected " + forms + ", got '" + text + "'" +
                         did_you_mean(text, {"balanced", "worst-case"}));
}

// Where a model.moe value was decided (its own line, else model.moe's, else the config's).
std::string moe_where(const Doc& d, const std::string& sub) {
  if (sub == "routing")
    if (const Field* f = d.find("model.moe.routing")) return f->where;
  if (const Field* f = d.find("model.moe")) {
    if (f->node.IsMap())
      for (auto it = f->node.begin(); it != f->node.end(); ++it)
        if (it->first.IsScalar() && it->first.Scalar() == sub) return sub_field(*f, it->first, it->second).where;
    return f->where;
  }
  if (const Field* h = d.find("model.hf_config")) return h->where;
  if (const Field* a = d.find("model.architecture")) return a->where;
  return d.where_missing("model");
}

// Whether model.moe.experts_implementation was written (in the file or by --set, which
// merge_moe_override merges into model.moe's mapping).
bool experts_impl_given(const Doc& d) {
  const Field* f = d.find("model.moe");
  if (!f || !f->node.IsMap()) return false;
  for (auto it = f->node.begin(); it != f->node.end(); ++it)
    if (it->first.IsScalar() && it->first.Scalar() == "experts_implementation") return true;
  return false;
}

}  // namespace

bool merge_moe_override(Doc& d, const std::string& key, const YAML::Node& value) {
  const std::string prefix = "model.moe.";
  if (key.rfind(prefix, 0) != 0) return false;
  const std::string sub = key.substr(prefix.size());
  bool known = false;
  for (const auto& k : moe_sub_keys()) known = known || (k == sub && k != "routing");
  if (!known) return false;
  auto it = d.fields.find("model.moe");
  if (it == d.fields.end() || !it->second.node.IsMap()) {
    YAML::Node map(YAML::NodeType::Map);
    map[sub] = value;
    d.fields["model.moe"] = Field{map, "--set"};
  } else {
    it->second.node[sub] = value;  // the value node (and its null mark) replaces the file's
  }
  return true;
}

void read_moe(const Doc& d, ModelConfig& m) {
  graph::MoeSpec& moe = m.arch.moe;
  const Field* f = d.find("model.moe");
  bool impl_given = false;  // model.moe.experts_implementation in the file or --set
  if (f && !is_null(f->node)) {
    const bool megatron = m.family == ModelFamily::megatron;  // Megatron-Core MoE
    if (!megatron && (!family_row(m.family).hf || m.family == ModelFamily::hf_gpt2))
      fail(f->where, "model.moe", std::string("mixture-of-experts layers are modelled for the "
                                              "Llama-lineage Hugging Face decoders (hf-llama and its "
                                              "architectures), not family ") + to_string(m.family));
    if (!f->node.IsMap()) fail(f->where, "model.moe", "expected a mapping {experts, top_k, ...}, got " + describe(f->node));
    bool shared_given = false;
    for (auto it = f->node.begin(); it != f->node.end(); ++it) {
      if (it->first.IsScalar() && it->first.Scalar() == "experts_implementation") impl_given = true;
      const std::string sub = it->first.IsScalar() ? it->first.Scalar() : "";
      const std::string key = "model.moe." + sub;
      const Field v = sub_field(*f, it->first, it->second);
      bool known = false;
      for (const auto& k : moe_sub_keys()) known = known || k == sub;
      if (!known) fail(v.where, key, "unknown key" + did_you_mean(sub, moe_sub_keys()));
      if (is_megatron_moe_sub_key(sub)) continue;  // scenario/megatron_moe_keys.cpp
      if (megatron && sub == "capacity_factor") continue;
      if (sub == "experts") moe.experts = read_int(v, key, 1);
      else if (sub == "top_k") moe.top_k = read_int(v, key, 1);
      else if (sub == "expert_d_ff") moe.expert_d_ff = read_int(v, key, 1);
      else if (sub == "first_dense_layers") moe.first_dense_layers = read_int(v, key, 0);
      else if (sub == "norm_topk") moe.norm_topk = read_bool(v, key);
      else if (sub == "output_router_logits") moe.output_router_logits = read_bool(v, key);
      else if (sub == "shared_experts") {
        shared_given = true;
        moe.shared_d_ff = read_int(v, key, 0);  // a count for now; sized below
      } else if (sub == "router") {
        moe.score = read_enum(v, key, std::vector<std::pair<std::string, graph::MoeScore>>{
                                          {"softmax", graph::MoeScore::softmax},
                                          {"sigmoid", graph::MoeScore::sigmoid}});
      } else if (sub == "capacity_factor") {
        // Megatron-Core's token dropping (scenario/megatron_moe_keys.cpp reads it for
        // model.family megatron): transformers' experts are dropless. A value <= 0 is bad
        // input either way.
        const double cf = read_number(v, key);
        if (!(cf > 0.0)) fail(v.where, key, "expected a number > 0, got '" + v.node.Scalar() + "'");
        fail(v.where, key, "a capacity factor (token dropping and padding) is Megatron-Core's "
                           "(model.family megatron); transformers' MoE experts are dropless: "
                           "remove it");
      } else if (sub == "routing") {
        read_routing(v, key, moe);
      } else if (sub == "experts_implementation") {
        moe.impl = read_enum(v, key, std::vector<std::pair<std::string, graph::ExpertsImpl>>{
                                         {"eager", graph::ExpertsImpl::eager},
                                         {"batched_mm", graph::ExpertsImpl::batched_mm},
                                         {"grouped_mm", graph::ExpertsImpl::grouped_mm}});

      }
    }
    // shared_experts N: one shared expert of N x expert_d_ff with Qwen2-MoE's sigmoid gate.
    if (shared_given) moe.shared_d_ff *= moe.expert_d_ff;
    if (moe.experts > 0 && moe.expert_d_ff == 0) moe.expert_d_ff = m.d_ff;
  }
  if (const Field* r = d.find("model.moe.routing")) read_routing(*r, "model.moe.routing", moe);
  // No experts_implementation: transformers 5.x's own default (the MoE rows are 5.x's code).
  // PreTrainedModel.__init__ resolves config._experts_implementation through
  // _check_and_adjust_experts_implementation -> get_correct_experts_implementation(None),
  // which picks "grouped_mm" whenever _grouped_mm_can_dispatch() passes; that check asks
  // only whether the model's modeling file applies @use_experts_implementation (true for
  // every MoE row here), with no device, dtype or torch-version condition
  // (huggingface/transformers 040ba146 src/transformers/modeling_utils.py; docs/moe.md
  // "Which experts implementation runs"). The device condition of the kernel underneath
  // is check_moe's. Megatron-Core's layers have no such switch.
  if (moe.experts > 0 && !impl_given && m.family != ModelFamily::megatron)
    moe.impl = graph::ExpertsImpl::grouped_mm;
  if (moe.experts == 0 && moe_row(m.arch))
    fail(moe_where(d, "experts"), "model.moe",
         std::string("architecture ") + m.arch.architecture +
             " is a mixture of experts: give model.moe {experts, top_k, expert_d_ff} or its config.json");
}

namespace {

// grouped_mm's kernel by device. transformers' _grouped_mm (integrations/moe.py) calls
// torch's grouped GEMM (F.grouped_mm / torch._grouped_mm: CUTLASS for bf16 on sm90/sm100,
// else torch's own per-group mm_out loop, which allocates nothing more; memsim's model,
// checked against the H200 trace) only when _can_use_grouped_mm passes. On CUDA that asks
// torch >= 2.9 (huggingface/transformers 8b584a67 integrations/moe.py) and, in a later
// moe.py (the one with deepgemm / sonicmoe), compute capability >= 8.0; below it the
// experts run transformers' own custom op transformers::grouped_mm_fallback (a zeros
// output, saves input and weight, zeros_like grads in its backward), which memsim does not
// model. The V100 presets (sm70) are the presets below 8.0; a device described by hand is
// taken as one of the others (docs/moe.md "Which experts implementation runs"). The same op
// runs under torch.compile when the weights are not bf16 (_can_use_grouped_mm's first test,
// in every version read).
void check_grouped_mm_kernel(const Doc& d, const Scenario& s) {
  const graph::MoeSpec& m = s.model.arch.moe;
  if (m.impl != graph::ExpertsImpl::grouped_mm) return;
  const bool given = experts_impl_given(d);
  if (s.step.compile && s.precision.params != DType::bf16) {
    const std::string where = given ? moe_where(d, "experts_implementation")
                                    : s.step.compile_where;
    fail(where, "model.moe.experts_implementation",
         std::string(given ? "grouped_mm" : "not given, so transformers 5.x's default grouped_mm "
                                            "(get_correct_experts_implementation(None))") +
             ": under torch.compile (step.compile) with " + to_string(s.precision.params) +
             " weights transformers runs its own grouped_mm_fallback op (_can_use_grouped_mm: "
             "torch's grouped GEMM compiles for bf16 weights only), which is not modelled; set "
             "model.moe.experts_implementation: eager or batched_mm (and pass the same "
             "experts_implementation= to from_pretrained / from_config)");
  }
  // step.kind generate never reaches here on a MoE row: scenario/generate_keys.cpp refuses it
  // (v4.45's generate() loop never ran 5.x's MoE code; newer releases also switch grouped_mm
  // to batched_mm for the decode stage, docs/moe.md).
  if (s.device.preset.rfind("v100", 0) != 0) return;
  const std::string where = given ? moe_where(d, "experts_implementation")
                                  : (d.find("device.preset") ? d.find("device.preset")->where
                                                             : moe_where(d, "experts"));
  fail(where, "model.moe.experts_implementation",
       std::string(given ? "grouped_mm" : "not given, so transformers 5.x's default grouped_mm "
                                          "(get_correct_experts_implementation(None))") +
           ": on device.preset " + s.device.preset +
           " (compute capability 7.0) transformers sends the grouped GEMM to its own "
           "grouped_mm_fallback op (_can_use_grouped_mm needs 8.0), which is not modelled; set "
           "model.moe.experts_implementation: eager or batched_mm (and pass the same "
           "experts_implementation= to from_pretrained / from_config)");
}

}  // namespace

void check_moe(const Doc& d, const Scenario& s) {
  check_megatron_moe(d, s);  // Megatron-Core's keys and refusals (scenario/megatron_moe_keys.h)
  const graph::MoeSpec& m = s.model.arch.moe;
  if (m.experts == 0) {
    if (const Field* r = d.find("model.moe.routing"))
      fail(r->where, "model.moe.routing", "there are no experts (model.moe.experts is 0)");
    return;
  }
  if (m.top_k == 0) fail(moe_where(d, "top_k"), "model.moe.top_k", "required with model.moe.experts");
  if (m.top_k > m.experts)
    fail(moe_where(d, "top_k"), "model.moe.top_k",
         std::to_string(m.top_k) + " exceeds model.moe.experts " + std::to_string(m.experts));
  if (m.first_dense_layers > s.model.layers)
    fail(moe_where(d, "first_dense_layers"), "model.moe.first_dense_layers",
         std::to_string(m.first_dense_layers) + " exceeds model.layers " + std::to_string(s.model.layers));
  if (!m.dense_layers.empty() && static_cast<int64_t>(m.dense_layers.size()) != s.model.layers)
    fail(moe_where(d, "experts"), "model.layers",
         "the config's mlp_only_layers was read for another layer count; give a config for this one");
  const int64_t T = s.batch.micro_batch * s.batch.seq_len;
  if (m.routing == graph::MoeRouting::counts) {
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < s.model.layers; ++l) moe_layers += m.layer_is_moe(l) ? 1 : 0;
    const std::string where = moe_where(d, "routing");
    const size_t n = m.counts.size(), E = static_cast<size_t>(m.experts);
    if (n != E && n != E * static_cast<size_t>(moe_layers))
      fail(where, "model.moe.routing",
           "counts: " + std::to_string(n) + " entries; expected " + std::to_string(E) +
               " (tokens per expert, every MoE layer) or " + std::to_string(E * moe_layers) +
               " (" + std::to_string(moe_layers) + " MoE layers x " + std::to_string(E) + " experts)");
    for (size_t row = 0; row < n / E; ++row) {
      int64_t sum = 0;
      for (size_t e = 0; e < E; ++e) {
        const int64_t c = m.counts[row * E + e];
        if (c > T)
          fail(where, "model.moe.routing",
               "counts: expert " + std::to_string(e) + " gets " + std::to_string(c) + " tokens, more than the " +
                   std::to_string(T) + " tokens of a micro-batch (a token picks an expert once)");
        sum += c;
      }
      if (sum != T * m.top_k)
        fail(where, "model.moe.routing",
             "counts" + (n > E ? " of MoE layer " + std::to_string(row) : std::string()) + " sum to " +
                 std::to_string(sum) + ", but tokens x top_k = " + std::to_string(T) + " x " +
                 std::to_string(m.top_k) + " = " + std::to_string(T * m.top_k) +
                 " (batch.micro_batch x batch.seq_len tokens, each routed to top_k experts)");
    }
  }
  if (s.model.family == ModelFamily::megatron) return;  // checked by check_megatron_moe
  check_grouped_mm_kernel(d, s);
  // Settings whose MoE behaviour is not modelled yet: refused by key.
  const std::string moe_at = moe_where(d, "experts");
  // Issue #15 item 5 (MoE composing): autocast and LoRA are modelled for the Qwen/Mixtral-
  // style blocks (docs/moe.md "Composing"; every experts_implementation under autocast, on
  // DeepSeek's block too: "batched_mm and grouped_mm under autocast"); what is not is refused
  // here. output_router_logits under
  // autocast: the aux loss's softmax of the low logits is CUDA's fp32_set_opt_dtype
  // (DecoderModel::moe_aux_loss; CPU fixtures autocast_*_aux_*).
  // DeepSeek's LoRA (its latent attention's names, no shared_expert_gate) is checked by
  // scenario/deepseek_keys.cpp.
  if (s.lora.rank > 0 && m.code != graph::MoeRouterCode::deepseek_v3 && m.code != graph::MoeRouterCode::deepseek_v2) {
    const std::string at = d.find("lora.targets") ? d.find("lora.targets")->where : moe_at;
    // PEFT's target_modules wrap nn.Linear modules only; transformers 5.x's routed experts are
    // 3-D nn.Parameters (Qwen3MoeExperts.gate_up_proj / down_proj) and its routers are
    // TopKRouter modules, so gate_proj/up_proj/down_proj reach only a dense layer's MLP and
    // Qwen2-MoE's shared expert.
    if (m.shared_d_ff > 0)
      for (const std::string& t : s.lora.targets)
        if (t == "all-linear")
          fail(at, "lora.targets",
               "all-linear on a model with a shared expert also wraps shared_expert_gate "
               "(nn.Linear(D, 1)), whose adapter is not modelled; list the modules (q_proj, ..., "
               "down_proj)");
    bool any = false;
    const uint32_t mask = lora_target_mask(s.lora, s.model.family);
    // lora_target_mask's bits follow lora_module_names (hf-llama): 0-3 q/k/v/o_proj, 4-6
    // gate/up/down_proj.
    // Bits 7-8: lora.target_parameters (the MoE layers' 3-D experts).
    const uint32_t attn_bits = 0xfu, mlp_bits = 0x70u, expert_bits = 0x180u;
    const bool attn = (mask & attn_bits) != 0, mlp = (mask & mlp_bits) != 0;
    const bool experts = (mask & expert_bits) != 0;
    for (int64_t l = 0; l < s.model.layers && !any; ++l)
      any = attn || (experts && m.layer_is_moe(l)) || (mlp && (!m.layer_is_moe(l) || m.shared_d_ff > 0));
    if (!any)
      fail(at, "lora.targets",
           "no module of this mixture-of-experts model matches (gate_proj, up_proj and down_proj "
           "exist only in dense layers and shared experts; the routed experts are 3-D parameters "
           "that PEFT's target_modules cannot wrap: use lora.target_parameters, PEFT >= 0.17's "
           "target_parameters)");
    // QLoRA (lora.base_dtype nf4) is modelled: transformers 5.x's replace_with_bnb_linear
    // swaps nn.Linear modules only, so attention, dense MLPs, the shared expert and its gate
    // are Linear4bit while the router and the 3-D routed experts stay in precision.params
    // (docs/moe.md "QLoRA on a mixture-of-experts model").
  }
  if (s.model.arch.impl != graph::ModelImpl::hf)
    fail(d.find("model.implementation") ? d.find("model.implementation")->where : moe_at,
         "model.implementation", "mixture-of-experts layers are modelled for transformers' code (hf) only");
  if (s.precision.float8 != Float8Recipe::none)
    fail(d.find("precision.float8") ? d.find("precision.float8")->where : moe_at, "precision.float8",
         "float8 linears on a mixture-of-experts model are not modelled (the experts are 3-D "
         "parameters, not nn.Linear)");
  if (s.optimizer.type == OptimizerType::adafactor)
    fail(d.find("optimizer.type") ? d.find("optimizer.type")->where : moe_at, "optimizer.type",
         "Adafactor's factored state on the 3-D expert weights is not modelled");
}

}  // namespace memsim::scenario_detail
