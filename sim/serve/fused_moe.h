// vLLM's FusedMoE layer as a served model holds and runs it (issue #17, MoE rows: mixtral,
// qwen2_moe, qwen3_moe, olmoe; docs/serve.md "Mixture of experts"). Pure arithmetic over
// integers: the weight tensors one rank loads and the buffers one profile-run call of the
// layer allocates, with their dtypes and shapes. vllm_profile_run.cpp turns the buffers into
// allocations in the order vLLM makes them.
//
// Sources (vllm-project/vllm, the files as the search index holds them):
//  - vllm/model_executor/layers/fused_moe/layer.py (0014ec6c): UnquantizedFusedMoEMethod.
//    create_weights: w13_weight [E, 2 x I/tp, H] and w2_weight [E, H, I/tp] in the model
//    dtype (TP shards the expert intermediate dim; every rank holds every expert without
//    expert parallelism); forward_cuda calls fused_experts(..., inplace=True): the layer's
//    output is its normed input's storage; forward_impl all-reduces it when reduce_results
//    and tp > 1.
//  - vllm/model_executor/layers/fused_moe/fused_moe.py (000d1458): fused_topk allocates
//    topk_weights fp32 [T, k], topk_ids int32 [T, k], token_expert_indices int32 [T, k], then
//    gating_output.float() (fp32 [T, E]); with renormalize, topk_weights / sum(-1, keepdim)
//    (a [T, 1] and a new [T, k], both fp32). fused_experts_impl: M = min(T, CHUNK_SIZE)
//    (VLLM_FUSED_MOE_CHUNK_SIZE, default 32768, vllm/envs.py), cache13 = M x k x max(N, K)
//    elements of the model dtype (intermediate caches 1 and 3 share it), cache2 = M x k x N/2,
//    N = 2 x I/tp, K = H; num_chunks = T // CHUNK_SIZE + 1 iterations (an empty one breaks).
//    get_default_config: BLOCK_SIZE_M 16 when M <= E, else 64.
//  - vllm/model_executor/layers/fused_moe/moe_align_block_size.py (05be9924): per chunk
//    sorted_ids int32 [Tc x k + E x (block_m - 1)], expert_ids int32
//    [cdiv(that, block_m)], num_tokens_post_pad int32 [1].
//  - the model files (mixtral.py, qwen2_moe.py, qwen3_moe.py, olmoe.py): the router gate is
//    a ReplicatedLinear [E, H] without bias and unquantized; Qwen2-MoE's shared_expert is a
//    Qwen2MoeMLP (MergedColumnParallel gate_up, RowParallel down without its own reduce) with
//    a sigmoid shared_expert_gate nn.Linear(H, 1), added to the routed output before the one
//    all-reduce.
// Not modelled (docs/serve.md): the tuned Triton configs (E=..,N=..,device_name=...json)
// that may pick another BLOCK_SIZE_M (sorted_ids changes by at most E x 255 x 4 bytes),
// expert parallelism, quantized experts (serve.quantization is refused for MoE models),
// DeepGEMM / CUTLASS / FlashInfer MoE backends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memsim::serve {

struct WeightTensor;

// The MoE dimensions of one served model, per rank.
struct MoeDims {
  int64_t experts = 0;           // 0: dense model
  int64_t top_k = 0;
  int64_t d_ff = 0, d_ff_rank = 0;            // each routed expert's intermediate size
  int64_t shared_d_ff = 0, shared_d_ff_rank = 0;  // Qwen2-MoE's shared_expert (0: none)
  bool renormalize = true;       // norm_topk_prob (Mixtral: always)
  int64_t chunk_size = 32768;    // VLLM_FUSED_MOE_CHUNK_SIZE
  // DeepSeek-V2 / V3 (DeepseekV2MoE: FusedMoE with use_grouped_topk, GroupedTopKRouter in
  // router/grouped_topk_router.py at 055e47c2): n_group / topk_group, sigmoid scores (V3),
  // V3's fp32 gate.e_score_correction_bias [E] (noaux_tc: the fused grouped_topk kernel),
  // and the shared experts as one ungated MLP (shared_gate false; Qwen2-MoE's is gated).
  bool grouped = false;
  int64_t n_group = 1, topk_group = 1;
  bool sigmoid = false;
  bool correction_bias = false;
  bool shared_gate = true;
};

// The buffers one call of the layer on `tokens` tokens allocates (bytes, before the
// allocator's rounding). chunk_* are one fused_experts_impl chunk's moe_align_block_size
// outputs for a full chunk (M tokens) and for the last one (last_chunk_tokens).
struct FusedMoeBuffers {
  uint64_t router_logits = 0;        // gate(x): [T, E], model dtype
  uint64_t topk_weights = 0;         // [T, k] fp32
  uint64_t topk_ids = 0;             // [T, k] int32
  uint64_t token_expert_indices = 0; // [T, k] int32
  uint64_t gating_float = 0;         // gating_output.float(): [T, E] fp32; 0 for fp32 models
  uint64_t renorm_sum = 0;           // [T, 1] fp32; 0 without renormalize
  int64_t chunk_tokens = 0;          // M = min(T, CHUNK_SIZE)
  int64_t chunks = 0;                // non-empty chunks
  int64_t last_chunk_tokens = 0;
  int64_t block_m = 0;               // get_default_config(M, E)
  uint64_t cache13 = 0;              // M x k x max(N, K), model dtype
  uint64_t cache2 = 0;               // M x k x N/2, model dtype
  uint64_t sorted_ids = 0, expert_ids = 0, num_post_pad = 0;  // a full chunk's
  uint64_t last_sorted_ids = 0, last_expert_ids = 0;          // the last chunk's
};

FusedMoeBuffers fused_moe_buffers(const MoeDims& moe, int64_t tokens, int64_t hidden,
                                  int64_t elem_bytes);

// The tensors of one MoE layer's mlp on one rank (unquantized), named after vLLM's
// parameters, appended to `out`.
void add_fused_moe_weights(std::vector<WeightTensor>& out, const MoeDims& moe,
                           const std::string& prefix, int64_t hidden, int64_t elem_bytes);

}  // namespace memsim::serve
