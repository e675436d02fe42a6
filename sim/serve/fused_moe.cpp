#include "sim/serve/fused_moe.h"

#include <algorithm>

#include "sim/serve/served_model.h"

namespace memsim::serve {

namespace {
uint64_t u(int64_t v) { return static_cast<uint64_t>(v); }
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

FusedMoeBuffers fused_moe_buffers(const MoeDims& moe, int64_t tokens, int64_t hidden,
                                  int64_t elem_bytes) {
  FusedMoeBuffers b;
  const int64_t T = tokens, E = moe.experts, k = moe.top_k;
  b.router_logits = u(T * E * elem_bytes);
  b.topk_weights = u(T * k * 4);
  b.topk_ids = u(T * k * 4);
  b.token_expert_indices = u(T * k * 4);
  b.gating_float = elem_bytes == 4 ? 0 : u(T * E * 4);  // .float() of an fp32 tensor is itself
  b.renorm_sum = moe.renormalize ? u(T * 4) : 0;
  const int64_t chunk = std::max<int64_t>(1, moe.chunk_size);
  b.chunk_tokens = std::min(T, chunk);
  // range(T // CHUNK + 1), breaking at the first empty chunk.
  b.chunks = T / chunk + (T % chunk != 0 ? 1 : 0);
  b.last_chunk_tokens = T - (b.chunks - 1) * chunk;
  b.block_m = b.chunk_tokens <= E ? 16 : 64;
  const int64_t N = 2 * moe.d_ff_rank, K = hidden;
  const int64_t m_sum = b.chunk_tokens * k;
  b.cache13 = u(m_sum * std::max(N, K) * elem_bytes);
  b.cache2 = u(m_sum * (N / 2) * elem_bytes);
  auto align = [&](int64_t chunk_tokens, uint64_t& sorted, uint64_t& ids) {
    const int64_t padded = chunk_tokens * k + E * (b.block_m - 1);
    sorted = u(padded * 4);
    ids = u(cdiv(padded, b.block_m) * 4);
  };
  align(b.chunk_tokens, b.sorted_ids, b.expert_ids);
  align(b.last_chunk_tokens, b.last_sorted_ids, b.last_expert_ids);
  b.num_post_pad = 4;
  return b;
}

void add_fused_moe_weights(std::vector<WeightTensor>& out, const MoeDims& moe,
                           const std::string& prefix, int64_t hidden, int64_t elem_bytes) {
  const uint64_t e = u(elem_bytes), H = u(hidden), E = u(moe.experts);
  out.push_back({prefix + ".gate.weight", E * H * e});
  if (moe.correction_bias)  // nn.Parameter(torch.empty(n_routed_experts, dtype=torch.float32))
    out.push_back({prefix + ".gate.e_score_correction_bias", E * 4});
  out.push_back({prefix + ".experts.w13_weight", E * 2 * u(moe.d_ff_rank) * H * e});
  out.push_back({prefix + ".experts.w2_weight", E * H * u(moe.d_ff_rank) * e});
  if (moe.shared_d_ff > 0 && !moe.shared_gate) {
    // DeepseekV2MoE.shared_experts: DeepseekV2MLP(moe_intermediate_size x n_shared_experts),
    // MergedColumnParallel gate_up, RowParallel down (reduce_results=False), no gate.
    const uint64_t s = u(moe.shared_d_ff_rank);
    out.push_back({prefix + ".shared_experts.gate_up_proj.weight", 2 * s * H * e});
    out.push_back({prefix + ".shared_experts.down_proj.weight", H * s * e});
  } else if (moe.shared_d_ff > 0) {
    const uint64_t s = u(moe.shared_d_ff_rank);
    out.push_back({prefix + ".shared_expert.gate_up_proj.weight", 2 * s * H * e});
    out.push_back({prefix + ".shared_expert.down_proj.weight", H * s * e});
    out.push_back({prefix + ".shared_expert_gate.weight", H * e});  // nn.Linear(H, 1), replicated
  }
}

}  // namespace memsim::serve
