// vLLM's DeepSeek-V2 / V3 multi-head latent attention (MLA) as a served model holds and
// profiles it (issue #17; docs/serve.md "DeepSeek-V2 / V3"). Pure arithmetic over integers:
// the attention's weight tensors on one tensor-parallel rank and the size of the profile
// run's simulated up-projection. vllm_profile_run.cpp turns the forward into allocations;
// served_model.cpp reads the dimensions from the Scenario.
//
// Sources (vllm-project/vllm, the files as the search index holds them):
//  - vllm/model_executor/models/deepseek_v2.py (002d6073) DeepseekV2MLAAttention.__init__:
//    with q_lora_rank, fused_qkv_a_proj = DeepSeekV2FusedQkvAProjLinear (a
//    MergedColumnParallelLinear with disable_tp=True: q_a_proj and kv_a_proj_with_mqa stacked,
//    [q_lora_rank + kv_lora_rank + qk_rope_head_dim, hidden], replicated), q_a_layernorm
//    RMSNorm(q_lora_rank), q_b_proj ColumnParallelLinear(q_lora_rank, heads x qk_head_dim);
//    without it (DeepSeek-V2-Lite, q_lora_rank null) q_proj ColumnParallelLinear(hidden,
//    heads x qk_head_dim) and kv_a_proj_with_mqa ReplicatedLinear(hidden, kv_lora_rank +
//    qk_rope_head_dim); kv_a_layernorm RMSNorm(kv_lora_rank) (replicated); kv_b_proj
//    ColumnParallelLinear(kv_lora_rank, heads x (qk_nope + v)); o_proj
//    RowParallelLinear(heads x v_head_dim, hidden). get_rope(qk_rope_head_dim, ...,
//    is_neox_style=False): with a yarn rope_scaling, "deepseek_yarn".
//  - vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py (00d678e1):
//    DeepseekScalingRotaryEmbedding caches original_max_position_embeddings x factor rows of
//    [cos | sin] (rotary_dim wide), in the model dtype (RotaryEmbeddingBase converts it
//    unless FlashInfer's rope is used; memsim assumes no FlashInfer, docs/serve.md).
//  - vllm/model_executor/layers/attention/mla_attention.py (0014ca6b) MLAAttention:
//    process_weights_after_loading keeps W_UV / W_UK_T as views of kv_b_proj's weight when it
//    is unquantized (no memory); forward allocates the output [T, heads x v_head_dim]
//    (torch.empty(output_shape)); forward_impl with attn_metadata None (the profile run)
//    allocates torch.empty((chunked_prefill_workspace_size, heads, qk_nope + v)) in the model
//    dtype "to simulate the worst case output size of self.kv_b_proj(kv_c_normed) in
//    _compute_prefill_context", drops it at return and zero-fills the output.
//    MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size:
//    max(min(max(8 x max_model_len, 4 x max_num_seqs x block_size), 64 x 1024),
//        max_num_seqs x block_size).
//    The builder's own chunked_prefill_workspace [W, kv_lora_rank + rope] is allocated when
//    the KV cache is initialised, after the profile run: not a budget term.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memsim::serve {

struct WeightTensor;

// One MLA layer's dimensions on one rank.
struct MlaDims {
  int64_t q_lora_rank = 0;   // 0: q_proj (config q_lora_rank null)
  int64_t kv_lora_rank = 0;  // 0: not an MLA model
  int64_t qk_nope = 0, qk_rope = 0, v_head = 0;
  int64_t heads_rank = 0;    // attention heads on this rank (heads / tp)
  bool enabled() const { return kv_lora_rank > 0; }
  int64_t qk_head() const { return qk_nope + qk_rope; }
  // The per-token latent the KV cache stores (kv_lora_rank + qk_rope_head_dim).
  int64_t latent() const { return kv_lora_rank + qk_rope; }
};

// MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size (header comment).
int64_t mla_chunked_prefill_workspace_tokens(int64_t max_model_len, int64_t max_num_seqs,
                                             int64_t block_size);

// The profile run's simulated kv_b_proj output: workspace x heads_rank x (nope + v) elements.
uint64_t mla_profile_upproj_bytes(const MlaDims& mla, int64_t workspace_tokens, int64_t elem_bytes);

// The tensors of one MLA self_attn on one rank (unquantized), named after vLLM's
// parameters, appended to `out`.
void add_mla_attention_weights(std::vector<WeightTensor>& out, const MlaDims& mla,
                               const std::string& prefix, int64_t hidden, int64_t elem_bytes);

}  // namespace memsim::serve
