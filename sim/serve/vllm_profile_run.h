// vLLM V1's profile run as a memsim Program, executed through the caching-allocator
// emulator (issue #17 item 2; docs/serve.md "The profile run").
//
// What vLLM does (vllm/v1/worker/gpu_worker.py determine_available_memory at 35d5cda1,
// vllm/utils/mem_utils.py memory_profiling at a6d5c390, gpu_model_runner.py profile_run /
// _dummy_run / _dummy_sampler_run at 4e179065): after the weights are loaded, reset the
// peak statistics, run one dummy forward of max_num_batched_tokens tokens spread over
// min(tokens, max_num_seqs) requests (flattened: one [T, hidden] batch, no padding),
// gather the last token of each request, compute the logits of those rows only and run
// the sampler on them with top_k = vocab - 1 and top_p = 0.9 (the dummy SamplingMetadata);
// torch_peak_increase = allocated_bytes.all.peak - the allocated bytes before the run.
// During profiling the attention layers get no metadata and skip their kernels (only the
// output buffer is allocated).
//
// The Program: the weights (parameters, never freed), a "profile_begin" mark, the
// forward's tensors with the lifetimes of one of two executions, then the sampler's:
//  - eager (serve.cuda_graphs false = --enforce-eager): vLLM's custom ops and Python
//    references: rms_norm allocates its output for the first layer only, fused_add_rms_norm
//    and rotary_embedding work in place, the attention output is a new torch.empty, the
//    MLP's gate_up output dies when SiluAndMul returns, the decoder layer's input is kept
//    by LlamaModel.forward's frame for the whole layer, the residual is the embedding's
//    storage updated in place;
//  - compiled (serve.cuda_graphs true: V1's piecewise torch.compile, Inductor): every
//    intermediate dies at its last use; RMSNorm and the residual add are one fused kernel
//    writing two new buffers; RoPE writes new q and k.
// With TP > 1 every RowParallelLinear output and the embedding go through an out-of-place
// all-reduce (pynccl's all_reduce allocates its output) and the logits through an
// all-gather. MoE layers (sim/serve/fused_moe.h) run vLLM's FusedMoE: the router gate's
// [T, E] logits, fused_topk's fp32 weights / int32 ids, fused_experts_impl's cache13 and
// cache2 and moe_align_block_size's per-chunk index buffers, the experts writing into the
// normed input in place (Qwen2-MoE: its gated shared expert first, added after). Gemma-2/3
// layers have four out-of-place GemmaRMSNorm (sandwich) and GeluAndMul; DeepSeek-V2/V3
// layers run MultiHeadLatentAttentionWrapper.forward (deepseek_mla.h: the latent
// projections, the q_a / kv_a RMSNorms, RoPE on the rope slices, MLAAttention's output and
// its profile-run torch.empty of the worst-case kv_b_proj output) and a FusedMoE block with
// the grouped top-k router and an ungated shared expert added in place; Gemma-2's logits
// are soft-capped (three out-of-place [R, vocab] ops) before the sampler. The sampler follows vllm/v1/sample/sampler.py and ops/topk_topp_sampler.py
// forward_native (the PyTorch path, used when FlashInfer is absent): fp32 logits,
// argmax, sort (values, int64 indices, and PyTorch's segmented sort scratch: int64
// reverse indices and CUB's alternate key/value buffers when device.kernel_scratch),
// top-k and top-p masks, softmax, cumsum in place, scatter, softmax, exponential_.
#pragma once

#include <cstdint>
#include <string>

#include "allocator/allocator_config.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/serve/served_model.h"

namespace memsim::serve {

struct ProfileRunShape {
  int64_t tokens = 0;    // max_num_batched_tokens
  int64_t requests = 0;  // min(tokens, max_num_seqs)
  bool compiled = true;  // Inductor lifetimes (cuda_graphs) vs eager custom ops
  // MLA models: MLACommonMetadataBuilder's chunked_prefill_workspace_size, the rows of the
  // profile run's simulated kv_b_proj output (deepseek_mla.h); 0 for other models.
  int64_t mla_workspace_tokens = 0;
};

struct ProfileRun {
  Program program;
  uint64_t baseline_allocated = 0;  // allocated at "profile_begin" (the weights)
  uint64_t peak_allocated = 0;      // highest allocated during the run
  uint64_t torch_peak_increase = 0; // peak - baseline: vLLM's torch_peak_increase
  uint64_t forward_peak_increase = 0;  // the same over the forward only (before the sampler)
  uint64_t sampler_peak_increase = 0;  // the same over the sampler run
  bool oom = false;                 // the emulator ran out of device memory
  std::string oom_what;
  std::string peak_op;              // the op allocating at the peak
};

// Builds and executes the profile run on `device` with `allocator`.
ProfileRun vllm_profile_run(const ServedModel& m, const std::vector<WeightTensor>& weights,
                            const ProfileRunShape& shape, const DeviceConfig& device,
                            const AllocatorConfig& allocator);

}  // namespace memsim::serve
