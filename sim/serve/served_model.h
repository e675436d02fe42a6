// The model a serving engine loads, per tensor-parallel rank (issue #17; docs/serve.md).
//
// Contract: served_model() reads a loaded Scenario (model, precision.params as the
// engine's --dtype, serve.*) and returns the per-rank dimensions vLLM's model code uses,
// or throws ScenarioError "FILE:LINE: KEY: why" for what is not modelled:
//  - families other than hf-llama, and the architecture rows whose vLLM model code is not
//    modelled (gemma, olmo2, granite, gpt2: post norms, scalar multipliers);
//  - DeepSeek-V2 / V3 (deepseek_v2, deepseek_v3): vLLM's MLA layout and profile run
//    (ServedModel::mla, deepseek_mla.h) with the FusedMoE block's grouped top-k router;
//    RoPE scalings other than none / yarn are refused (their cache sizes differ);
//  - Gemma-2 / Gemma-3 text: the layout and profile run of vLLM's gemma2.py / gemma3.py
//    (ServedModel::gemma); RoPE scalings other than default / linear / llama3 are refused
//    for Gemma-3 (their cache sizes differ);
//  - for the MoE rows (mixtral, qwen2_moe, qwen3_moe, olmoe: vLLM's FusedMoE, fused_moe.h):
//    quantized experts (serve.quantization), OLMoE under TP (its full-width q/k norms
//    all-gather), splits FusedMoE cannot make;
//  - head / KV head / FFN / vocabulary counts that vLLM's tensor-parallel layers cannot
//    split (vLLM's own messages: "Total number of attention heads (H) must be divisible
//    by tensor parallel size (T).").
// vllm_weight_tensors() lists the tensors vLLM's loader leaves on one rank (vllm/
// model_executor/models/llama.py at 4e179065: VocabParallelEmbedding padded to a multiple
// of 64, QKVParallelLinear, RowParallelLinear o_proj, MergedColumnParallelLinear gate_up,
// RowParallelLinear down_proj, RMSNorm weights, ParallelLMHead unless tied, the shared
// rotary cos_sin_cache [max_position, rotary_dim]); with serve.quantization the decoder
// linears take the quantized layouts documented in docs/serve.md. weights_bytes() is what
// vLLM's "Model loading took X GiB" measures: the caching allocator's allocated bytes,
// each tensor rounded up to 512 B.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scenario/scenario.h"
#include "sim/serve/deepseek_mla.h"
#include "sim/serve/fused_moe.h"
#include "sim/serve/kv_layout.h"

namespace memsim::serve {

struct ServedModel {
  std::string architecture;  // graph::DecoderArch::architecture ("llama", "qwen2", ...)
  int64_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, d_ff = 0;
  int64_t vocab = 0, padded_vocab = 0, context = 0, rotary_dim = 0;
  bool tied = false, qkv_bias = false, o_bias = false, mlp_bias = false, qk_norm = false;
  int64_t tp = 1;
  int64_t q_heads_rank = 0, kv_heads_rank = 0, d_ff_rank = 0, vocab_rank = 0;
  int64_t elem = 2;                // model dtype bytes (precision.params)
  int64_t kv_elem = 2;             // KV cache dtype bytes (serve.kv_cache_dtype)
  WeightQuant quant = WeightQuant::none;
  std::vector<KvLayer> kv;         // one per layer, this rank's share
  // Mixture of experts (mixtral, qwen2_moe, qwen3_moe, olmoe; sim/serve/fused_moe.h):
  // moe.experts 0 = dense. moe_layer[l] = 1: layer l's mlp is a FusedMoE block.
  MoeDims moe;
  std::vector<uint8_t> moe_layer;
  bool qk_norm_full = false;       // OLMoE: q_norm over heads x head_dim, k_norm over the KV width
  // Gemma-2 / Gemma-3 text (vLLM's Gemma2ForCausalLM / Gemma3ForCausalLM): four GemmaRMSNorm
  // per layer (input, post_attention, pre_feedforward, post_feedforward; out of place),
  // GeluAndMul, the sqrt(hidden) normalizer buffer, tied embeddings, the final logit
  // soft-cap (Gemma-2: / cap, tanh, * cap on the logits), Gemma-3's two RoPE caches.
  bool gemma = false;
  bool gemma3 = false;
  double final_softcap = 0.0;
  int64_t rope_rows = 0;        // rows of the (global) cos_sin_cache
  int64_t local_rope_rows = 0;  // Gemma-3: the sliding layers' own cache (0: none)
  // DeepSeek-V2 / V3 (vLLM's DeepseekV2ForCausalLM / DeepseekV3ForCausalLM, deepseek_mla.h):
  // multi-head latent attention in every layer (mla.enabled()), the MoE block's grouped
  // top-k router and ungated shared experts in moe (fused_moe.h), dense layers before
  // first_k_dense_replace.
  MlaDims mla;
  bool layer_is_moe(int64_t l) const {
    return l >= 0 && static_cast<size_t>(l) < moe_layer.size() && moe_layer[static_cast<size_t>(l)] != 0;
  }
};

ServedModel served_model(const Scenario& s);

struct WeightTensor {
  std::string name;
  uint64_t bytes = 0;
};
std::vector<WeightTensor> vllm_weight_tensors(const ServedModel& m);
uint64_t weights_bytes(const std::vector<WeightTensor>& tensors);

}  // namespace memsim::serve
