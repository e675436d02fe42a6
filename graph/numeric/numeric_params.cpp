// Numeric mode's parameters (graph/numeric/numeric.h): each family's parameter names mapped to
// their shapes and to the scale/offset of their deterministic initial values
// (NumericContext::on_parameter draws uniform(-1, 1) * scale + offset). Matrices are
// scaled by 1/sqrt(fan_in) so that activations stay O(1); norm weights lie around 1 (not
// exactly 1, so their gradient path matters); biases are small but non-zero.
#include <cmath>
#include <string>

#include "graph/numeric/numeric.h"

namespace memsim::graph {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
double inv_sqrt(int64_t n) { return 1.0 / std::sqrt(static_cast<double>(n)); }

struct Rule {
  const char* suffix;
  std::vector<int64_t> shape;
  double scale, offset;
};

bool match(const std::vector<Rule>& rules, std::string_view name, NumericParamInit& out) {
  for (const Rule& r : rules)
    if (ends_with(name, r.suffix)) {
      out.shape = r.shape;
      out.scale = r.scale;
      out.offset = r.offset;
      return true;
    }
  return false;
}

}  // namespace

NumericParamInit numeric_param_init(const NumericModel& m, std::string_view name) {
  const int64_t D = m.d_model, F = m.d_ff, V = m.vocab, P = m.context;
  const int64_t kvD = (m.kv_heads > 0 ? m.kv_heads : m.heads) * m.head_dim();
  std::vector<Rule> rules;
  switch (m.family) {
    case NumericFamily::cs336:
      rules = {{"token_embeddings.weight", {V, D}, 1.0, 0},
               {"lm_head.weight", {V, D}, inv_sqrt(D), 0},
               {"q_proj.weight", {D, D}, inv_sqrt(D), 0},
               {"k_proj.weight", {D, D}, inv_sqrt(D), 0},
               {"v_proj.weight", {D, D}, inv_sqrt(D), 0},
               {"output_proj.weight", {D, D}, inv_sqrt(D), 0},
               {"w1.weight", {F, D}, inv_sqrt(D), 0},
               {"w3.weight", {F, D}, inv_sqrt(D), 0},
               {"w2.weight", {D, F}, inv_sqrt(F), 0},
               {"ln1.weight", {D}, 0.2, 1.0},
               {"ln2.weight", {D}, 0.2, 1.0},
               {"ln_final.weight", {D}, 0.2, 1.0}};
      break;
    case NumericFamily::hf_llama:
      rules = {{"embed_tokens.weight", {V, D}, 1.0, 0},
               {"lm_head.weight", {V, D}, inv_sqrt(D), 0},
               {"self_attn.q_proj.weight", {D, D}, inv_sqrt(D), 0},
               {"self_attn.k_proj.weight", {kvD, D}, inv_sqrt(D), 0},
               {"self_attn.v_proj.weight", {kvD, D}, inv_sqrt(D), 0},
               {"self_attn.o_proj.weight", {D, D}, inv_sqrt(D), 0},
               {"mlp.gate_proj.weight", {F, D}, inv_sqrt(D), 0},
               {"mlp.up_proj.weight", {F, D}, inv_sqrt(D), 0},
               {"mlp.down_proj.weight", {D, F}, inv_sqrt(F), 0},
               {"layernorm.weight", {D}, 0.2, 1.0},  // input_ / post_attention_layernorm
               {"model.norm.weight", {D}, 0.2, 1.0}};
      break;
    case NumericFamily::hf_gpt2:
      // Conv1D weights are stored (in, out).
      rules = {{"wte.weight", {V, D}, 0.5, 0},
               {"wpe.weight", {P, D}, 0.5, 0},
               {"lm_head.weight", {V, D}, inv_sqrt(D), 0},
               {"attn.c_attn.weight", {D, 3 * D}, inv_sqrt(D), 0},
               {"attn.c_attn.bias", {3 * D}, 0.1, 0},
               {"attn.c_proj.weight", {D, D}, inv_sqrt(D), 0},
               {"attn.c_proj.bias", {D}, 0.1, 0},
               {"mlp.c_fc.weight", {D, F}, inv_sqrt(D), 0},
               {"mlp.c_fc.bias", {F}, 0.1, 0},
               {"mlp.c_proj.weight", {F, D}, inv_sqrt(F), 0},
               {"mlp.c_proj.bias", {D}, 0.1, 0},
               {".weight", {D}, 0.2, 1.0},  // ln_1, ln_2, ln_f (the rest matched above)
               {".bias", {D}, 0.1, 0}};
      break;
    case NumericFamily::megatron:
      // Megatron stores linear weights (out, in); vocab as given (t == 1: no padding).
      rules = {{"word_embeddings.weight", {V, D}, 0.5, 0},
               {"position_embeddings.weight", {P, D}, 0.5, 0},
               {"linear_qkv.weight", {3 * D, D}, inv_sqrt(D), 0},
               {"linear_qkv.bias", {3 * D}, 0.1, 0},
               {"linear_proj.weight", {D, D}, inv_sqrt(D), 0},
               {"linear_proj.bias", {D}, 0.1, 0},
               {"linear_fc1.weight", {F, D}, inv_sqrt(D), 0},
               {"linear_fc1.bias", {F}, 0.1, 0},
               {"linear_fc2.weight", {D, F}, inv_sqrt(F), 0},
               {"linear_fc2.bias", {D}, 0.1, 0},
               {"layernorm.weight", {D}, 0.2, 1.0},  // input_, pre_mlp_, final_layernorm
               {"layernorm.bias", {D}, 0.1, 0}};
      break;
  }
  NumericParamInit out;
  if (!match(rules, name, out))
    throw NumericError("numeric: parameter '" + std::string(name) +
                       "' has no numeric shape in this family (LoRA adapters and quantised "
                       "weights are not supported by numeric mode)");
  return out;
}

}  // namespace memsim::graph
