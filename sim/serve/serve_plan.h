// The memory plans of vLLM V1 and SGLang for one serve scenario, and the inverse
// questions (issue #17 items 2-4; docs/serve.md). Reports live in tools/cli/serve_report.*.
//
// vLLM (plan_vllm; vllm/v1/worker/gpu_worker.py determine_available_memory at 35d5cda1,
// vllm/utils/mem_utils.py at a6d5c390, vllm/v1/core/kv_cache_utils.py at bbf906a8):
//   requested        = total_gpu_memory x gpu_memory_utilization
//   weights          = vllm_weight_tensors() through the allocator ("Model loading took")
//   activation peak  = the profile run's torch peak increase (vllm_profile_run.h)
//   non-torch        = device.cuda_context + NCCL with tensor_parallel > 1 (serve.nccl_memory,
//                      default kDefaultNcclBytes)
//   available KV     = int(requested - weights - activation - non-torch)
//   then kv_layout.h's plan_vllm_blocks: "# GPU blocks", "GPU KV cache size", "Maximum
//   concurrency", and check_enough_kv_cache_memory. CUDA graphs: in the modelled version
//   capture_model() runs after the KV cache is allocated and its memory is not subtracted
//   (it is logged at debug level only), so cuda_graphs changes the profile run's lifetimes
//   (compiled vs eager), not a budget term.
// SGLang (plan_sglang; python/sglang/srt/model_executor/model_runner.py
// profile_max_num_token at 01cc04e2, server_args.py's TP rule for mem_fraction_static):
//   total  = free memory after the distributed init (capacity - context - NCCL), GiB
//   avail  = total - the weights' reserved segments (empty_cache'd), GiB
//   rest   = avail - total x (1 - mem_fraction_static)
//   tokens = int(rest x 2^30 // cell), cell = kv_heads x head_dim x layers x 2 x bytes,
//   rounded down to the page size.
// Bad input throws ScenarioError "FILE:LINE: serve.KEY: why" (exit 1). A plan that leaves
// no room for the KV cache is returned with fits == false and the engine's own message in
// `failure` (exit 3 from the CLI).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scenario/scenario.h"
#include "sim/serve/kv_layout.h"
#include "sim/serve/served_model.h"

namespace memsim::serve {

// NCCL's device memory per rank with TP > 1 when serve.nccl_memory is not given: the
// non-torch increase vLLM itself logged going from TP=1 to TP=2 for Llama-3-8B on H100
// (vllm-project/vllm PR #10511: 1.79 GiB -> 3.58 GiB, two communicators: PyNccl and the
// torch.distributed group, plus custom all-reduce buffers). One configuration's figure:
// docs/serve.md says so, and that it is not independent evidence for TP=2 plans.
inline constexpr uint64_t kDefaultNcclBytes = 1922038333;  // 1.79 GiB

struct ServeSettings {
  int64_t max_model_len = 0;
  int64_t max_num_batched_tokens = 0;
  int64_t max_num_seqs = 0;
  int64_t block_size = 0;
  int64_t requests = 0;         // profile run: min(tokens, max_num_seqs)
  double utilization = 0;       // vLLM gpu_memory_utilization / SGLang mem_fraction_static
  bool compiled = true;
  // Which settings took the engine's default (for the report).
  bool default_len = false, default_tokens = false, default_seqs = false, default_frac = false;
};

struct ServePlan {
  ServeEngine engine = ServeEngine::vllm;
  ServedModel model;
  ServeSettings settings;
  uint64_t total_memory = 0;        // device.capacity (cudaMemGetInfo total)
  double requested_memory = 0;      // vLLM: total x util
  uint64_t weights_bytes = 0;
  uint64_t weights_reserved = 0;    // the caching allocator's segments after loading
  std::optional<uint64_t> activation_peak_bytes;  // vLLM only
  uint64_t forward_peak_bytes = 0, sampler_peak_bytes = 0;
  std::string peak_op;
  uint64_t cuda_context_bytes = 0, nccl_bytes = 0, non_torch_bytes = 0;
  int64_t available_kv_bytes = 0;   // may be negative
  VllmKvPlan kv;                    // vLLM: the block plan; SGLang: tokens and bytes
  double sglang_total_gib = 0, sglang_avail_gib = 0, sglang_rest_gib = 0;  // SGLang's log
  int64_t cell_bytes = 0;           // SGLang: bytes per token over all layers
  bool fits = true;
  std::string failure;              // the engine's error when !fits
};

// The plan for s.serve (engine chosen by serve.engine). s.serve.present must be true.
ServePlan plan_serve(const Scenario& s);

// Inverse questions (docs/serve.md "Inverse questions"):
// the largest max_model_len whose one request fits the KV budget (vLLM's
// estimate_max_model_len, capped at the model's context) is plan.kv.max_model_len_that_fits;
// how many sequences of `len` tokens fit at once (blocks / blocks per sequence, vLLM;
// tokens / len, SGLang).
int64_t sequences_that_fit(const ServePlan& plan, int64_t len);
// The smallest tensor_parallel in 1, 2, 4, ... up to `max_tp` whose plan fits and holds one
// max_model_len request; nullopt when none does. Plans that TP cannot split are skipped.
struct MinTpResult {
  std::optional<int64_t> tp;
  std::vector<std::pair<int64_t, std::string>> tried;  // tp -> why it did not serve
};
MinTpResult smallest_tp(const Scenario& s, int64_t max_tp);

}  // namespace memsim::serve
