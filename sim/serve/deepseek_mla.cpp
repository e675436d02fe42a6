#include "sim/serve/deepseek_mla.h"

#include <algorithm>

#include "sim/serve/served_model.h"

namespace memsim::serve {

namespace {
uint64_t u(int64_t v) { return static_cast<uint64_t>(v); }
}  // namespace

int64_t mla_chunked_prefill_workspace_tokens(int64_t max_model_len, int64_t max_num_seqs,
                                             int64_t block_size) {
  // "Try for 8 full length request or at least 4 pages per-request", capped at 64K tokens,
  // then "at least 1 page per request".
  const int64_t wanted = std::min(std::max(8 * max_model_len, 4 * max_num_seqs * block_size),
                                  int64_t{64} * 1024);
  return std::max(wanted, max_num_seqs * block_size);
}

uint64_t mla_profile_upproj_bytes(const MlaDims& mla, int64_t workspace_tokens, int64_t elem_bytes) {
  return u(workspace_tokens) * u(mla.heads_rank) * u(mla.qk_nope + mla.v_head) * u(elem_bytes);
}

void add_mla_attention_weights(std::vector<WeightTensor>& out, const MlaDims& mla,
                               const std::string& prefix, int64_t hidden, int64_t elem_bytes) {
  const uint64_t e = u(elem_bytes), H = u(hidden), h = u(mla.heads_rank);
  if (mla.q_lora_rank > 0) {
    // q_a_proj and kv_a_proj_with_mqa stacked in one replicated weight.
    out.push_back({prefix + ".fused_qkv_a_proj.weight", u(mla.q_lora_rank + mla.latent()) * H * e});
    out.push_back({prefix + ".q_a_layernorm.weight", u(mla.q_lora_rank) * e});
    out.push_back({prefix + ".q_b_proj.weight", h * u(mla.qk_head()) * u(mla.q_lora_rank) * e});
  } else {
    out.push_back({prefix + ".q_proj.weight", h * u(mla.qk_head()) * H * e});
    out.push_back({prefix + ".kv_a_proj_with_mqa.weight", u(mla.latent()) * H * e});
  }
  out.push_back({prefix + ".kv_a_layernorm.weight", u(mla.kv_lora_rank) * e});
  out.push_back({prefix + ".kv_b_proj.weight", h * u(mla.qk_nope + mla.v_head) * u(mla.kv_lora_rank) * e});
  out.push_back({prefix + ".o_proj.weight", H * h * u(mla.v_head) * e});
}

}  // namespace memsim::serve
