#include "sim/serve/serve_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "allocator/caching_allocator.h"
#include "graph/runtime.h"
#include "sim/serve/vllm_profile_run.h"
#include "sim/step/execute.h"

namespace memsim::serve {

namespace {

constexpr double kGiB = 1073741824.0;

// "FILE:LINE: KEY: why", or "--set KEY: why" for an override (scenario/yaml_fields.h's form).
[[noreturn]] void refuse(const Scenario& s, const std::string& key, const std::string& why) {
  const std::string where = s.serve.where_of(key, s.source);
  throw ScenarioError(where == "--set" ? "--set " + key + ": " + why : where + ": " + key + ": " + why);
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / kGiB);
  return buf;
}

// vllm/engine/arg_utils.py get_batch_defaults (`vllm serve`, OPENAI_API_SERVER context):
// devices with >= 70 GiB that are not A100s get 8192 tokens / 1024 sequences, the others
// 2048 / 256.
bool large_device(const DeviceConfig& d) {
  return d.capacity >= 70ull * 1073741824ull && d.preset.find("a100") == std::string::npos;
}

// The caching allocator's reserved bytes after the weights are loaded (SGLang measures free
// memory, so segment rounding counts).
uint64_t weights_reserved(const std::vector<WeightTensor>& weights, const Scenario& s) {
  Program p;
  {
    graph::Runtime rt(p);
    for (const WeightTensor& w : weights) rt.add_parameter(w.bytes, w.name);
    rt.freeze();
  }
  SimulatedDevice dev(1ull << 60, 0);
  const Timeline tl = execute(p, s.allocator, dev);
  return tl.reserved.empty() ? 0 : tl.reserved.back();
}

uint64_t nccl_for(const Scenario& s, int64_t tp) {
  if (tp <= 1) return 0;
  return s.serve.nccl_memory.value_or(kDefaultNcclBytes);
}

ServePlan plan_vllm(const Scenario& s) {
  const ServeConfig& c = s.serve;
  ServePlan p;
  p.engine = ServeEngine::vllm;
  p.model = served_model(s);
  ServeSettings& st = p.settings;
  if (s.device.capacity == 0)
    refuse(s, "device.capacity", "memsim serve needs the GPU's total memory (device.preset or device.capacity)");
  st.default_len = c.max_model_len == 0;
  st.max_model_len = c.max_model_len > 0 ? c.max_model_len : p.model.context;
  const bool large = large_device(s.device);
  st.default_tokens = c.max_num_batched_tokens == 0;
  st.max_num_batched_tokens = c.max_num_batched_tokens > 0 ? c.max_num_batched_tokens : (large ? 8192 : 2048);
  st.default_seqs = c.max_num_seqs == 0;
  st.max_num_seqs = c.max_num_seqs > 0 ? c.max_num_seqs : (large ? 1024 : 256);
  // vllm/config SchedulerConfig._verify_args.
  if (st.max_num_batched_tokens < st.max_num_seqs)
    refuse(s, c.max_num_batched_tokens > 0 ? "serve.max_num_batched_tokens" : "serve.max_num_seqs",
           "max_num_batched_tokens (" + std::to_string(st.max_num_batched_tokens) +
               ") must be greater than or equal to max_num_seqs (" +
               std::to_string(st.max_num_seqs) + ").");
  // The model runner's token buffers are int32-indexed; larger values are not a real plan
  // (and would overflow the profile run's byte counts).
  if (st.max_num_batched_tokens > (int64_t{1} << 31) || st.max_num_seqs > (int64_t{1} << 31))
    refuse(s, st.max_num_batched_tokens > (int64_t{1} << 31) ? "serve.max_num_batched_tokens" : "serve.max_num_seqs",
           "larger than 2^31 (vLLM indexes tokens and requests with int32)");
  st.block_size = c.block_size > 0 ? c.block_size : 16;
  st.requests = std::min(st.max_num_batched_tokens, st.max_num_seqs);
  st.utilization = c.gpu_memory_utilization;
  st.compiled = c.cuda_graphs;

  const std::vector<WeightTensor> weights = vllm_weight_tensors(p.model);
  p.weights_bytes = weights_bytes(weights);
  p.total_memory = s.device.capacity;
  p.requested_memory = static_cast<double>(p.total_memory) * st.utilization;
  p.cuda_context_bytes = s.device.cuda_context;
  p.nccl_bytes = nccl_for(s, p.model.tp);
  p.non_torch_bytes = p.cuda_context_bytes + p.nccl_bytes;

  ProfileRunShape shape;
  shape.tokens = st.max_num_batched_tokens;
  shape.requests = st.requests;
  shape.compiled = st.compiled;
  if (p.model.mla.enabled())
    shape.mla_workspace_tokens = mla_chunked_prefill_workspace_tokens(st.max_model_len, st.max_num_seqs, st.block_size);
  const ProfileRun run = vllm_profile_run(p.model, weights, shape, s.device, s.allocator);
  p.activation_peak_bytes = run.torch_peak_increase;
  p.forward_peak_bytes = run.forward_peak_increase;
  p.sampler_peak_bytes = run.sampler_peak_increase;
  p.peak_op = run.peak_op;
  if (run.oom) {
    p.fits = false;
    p.failure = "the profile run does not fit the device (torch.OutOfMemoryError during "
                "determine_available_memory): " + run.oom_what;
  }
  const double non_kv = static_cast<double>(p.weights_bytes) +
                        static_cast<double>(run.torch_peak_increase) +
                        static_cast<double>(p.non_torch_bytes);
  p.available_kv_bytes = static_cast<int64_t>(p.requested_memory - non_kv);  // int() truncates
  try {
    p.kv = plan_vllm_blocks(p.model.kv, p.available_kv_bytes, st.block_size, st.max_model_len,
                            st.max_num_batched_tokens, p.model.context);
  } catch (const std::invalid_argument& e) {
    refuse(s, "model.architecture", e.what());
  }
  if (p.fits && p.available_kv_bytes <= 0) {
    p.fits = false;
    p.failure = "No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine.";
  } else if (p.fits && !p.kv.enough) {
    p.fits = false;
    std::string estimate;
    if (p.kv.max_model_len_that_fits > 0)
      estimate = "Based on the available memory, the estimated maximum model length is " +
                 std::to_string(std::min(p.kv.max_model_len_that_fits, st.max_model_len)) + ". ";
    p.failure = "To serve at least one request with the models's max seq len (" +
                std::to_string(st.max_model_len) + "), (" +
                gib(static_cast<double>(p.kv.request_bytes)) +
                " GiB KV cache is needed, which is larger than the available KV cache memory (" +
                gib(static_cast<double>(p.available_kv_bytes)) + " GiB). " + estimate +
                "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
                "initializing the engine.";
  }
  return p;
}

// SGLang's default mem_fraction_static (server_args.py __post_init__, the TP rule).
double sglang_default_fraction(int64_t tp) {
  if (tp >= 16) return 0.79;
  if (tp >= 8) return 0.81;
  if (tp >= 4) return 0.85;
  if (tp >= 2) return 0.87;
  return 0.88;
}

ServePlan plan_sglang(const Scenario& s) {
  const ServeConfig& c = s.serve;
  ServePlan p;
  p.engine = ServeEngine::sglang;
  p.model = served_model(s);
  // SGLang's own MoE layers and its sliding-window (SWA) pool for Gemma are not what
  // served_model() and the one-cell formula below describe.
  if (p.model.moe.experts > 0 || p.model.gemma)
    refuse(s, "serve.engine",
           std::string("sglang with ") + (p.model.gemma ? "Gemma-2/3 (its sliding-window KV pool)"
                                                        : "MoE models (its FusedMoE weights)") +
               " is not modelled; use engine vllm");
  ServeSettings& st = p.settings;
  if (s.device.capacity == 0)
    refuse(s, "device.capacity", "memsim serve needs the GPU's total memory (device.preset or device.capacity)");
  for (const char* k : {"serve.max_num_batched_tokens", "serve.max_num_seqs", "serve.cuda_graphs"}) {
    for (const auto& [key, where] : c.key_where)
      if (key == k)
        refuse(s, k, "is a vLLM setting; SGLang's static pool does not depend on it in the "
                     "modelled rule (docs/serve.md)");
  }
  for (const auto& [key, where] : c.key_where)
    if (key == "serve.max_model_len" && c.max_model_len > p.model.context)
      refuse(s, key, "User-specified context_length (" + std::to_string(c.max_model_len) +
                         ") is greater than the derived context_length (" +
                         std::to_string(p.model.context) + ").");
  st.default_len = c.max_model_len == 0;
  st.max_model_len = c.max_model_len > 0 ? c.max_model_len : p.model.context;
  st.block_size = c.block_size > 0 ? c.block_size : 1;  // --page-size, default 1
  st.default_frac = c.mem_fraction_static == 0;
  st.utilization = c.mem_fraction_static > 0 ? c.mem_fraction_static : sglang_default_fraction(p.model.tp);
  const std::vector<WeightTensor> weights = vllm_weight_tensors(p.model);
  p.weights_bytes = weights_bytes(weights);
  p.weights_reserved = weights_reserved(weights, s);
  p.total_memory = s.device.capacity;
  p.cuda_context_bytes = s.device.cuda_context;
  p.nccl_bytes = nccl_for(s, p.model.tp);
  p.non_torch_bytes = p.cuda_context_bytes + p.nccl_bytes;
  const double free0 = static_cast<double>(p.total_memory) - static_cast<double>(p.non_torch_bytes);
  p.sglang_total_gib = free0 / kGiB;
  p.sglang_avail_gib = (free0 - static_cast<double>(p.weights_reserved)) / kGiB;
  p.sglang_rest_gib = p.sglang_avail_gib - p.sglang_total_gib * (1.0 - st.utilization);
  int64_t cell = 0;
  for (const KvLayer& l : p.model.kv) cell += token_bytes(l);
  p.cell_bytes = cell;
  // int(rest_memory * (1 << 30) // cell_size): Python's floor division of a float.
  const double tokens_f = std::floor(p.sglang_rest_gib * kGiB / static_cast<double>(cell));
  int64_t tokens = static_cast<int64_t>(tokens_f);
  tokens = tokens / st.block_size * st.block_size;
  p.available_kv_bytes = static_cast<int64_t>(p.sglang_rest_gib * kGiB);
  p.kv.page_bytes = cell * st.block_size;
  p.kv.group_size = p.model.layers;
  p.kv.groups = 1;
  p.kv.kv_cache_tokens = std::max<int64_t>(tokens, 0);
  p.kv.num_gpu_blocks = p.kv.kv_cache_tokens / st.block_size;
  // MHATokenToKVPool: k and v buffers of (size + page_size) slots per layer.
  p.kv.kv_cache_bytes = tokens > 0 ? (tokens + st.block_size) * cell : 0;
  p.kv.request_bytes = st.max_model_len * cell;
  p.kv.max_concurrency = static_cast<double>(p.kv.kv_cache_tokens) / static_cast<double>(st.max_model_len);
  p.kv.max_model_len_that_fits = std::min(p.kv.kv_cache_tokens, p.model.context);
  p.kv.enough = p.kv.kv_cache_tokens >= st.max_model_len;
  if (tokens <= 0) {
    p.fits = false;
    p.failure = "Not enough memory. Please try to increase --mem-fraction-static.";
  }
  return p;
}

}  // namespace

ServePlan plan_serve(const Scenario& s) {
  if (!s.serve.present)
    throw ScenarioError(s.source + ":1: serve: memsim serve needs a `serve:` section (docs/serve.md)");
  // The plan is the engine's (serve.*): settings of the training / HF step that it would
  // silently drop are refused (memsim run on the same file still uses them).
  if (s.lora.rank > 0)
    refuse(s, "lora.rank", "memsim serve does not model LoRA serving (vLLM --enable-lora's adapter "
                           "slots); remove the lora section to plan the base model");
  if (s.precision.autocast)
    refuse(s, "precision.autocast", "an engine runs the model in its weights' dtype "
                                    "(precision.params, serve.quantization); autocast is a training setting");
  if (s.parallel.tensor > 1 || s.parallel.pipeline > 1)
    refuse(s, s.parallel.tensor > 1 ? "parallel.tensor" : "parallel.pipeline",
           "memsim serve shards with serve.tensor_parallel (pipeline parallel serving is not "
           "modelled); remove the parallel section");
  if (s.parallel.data > 1 || s.parallel.sharding != Sharding::none)
    refuse(s, s.parallel.sharding != Sharding::none ? "parallel.sharding" : "parallel.data",
           "training parallelism (DDP, FSDP, DeepSpeed) has no meaning for a serving engine "
           "(serve.tensor_parallel shards it); remove the parallel section");
  return s.serve.engine == ServeEngine::vllm ? plan_vllm(s) : plan_sglang(s);
}

int64_t sequences_that_fit(const ServePlan& plan, int64_t len) {
  if (len <= 0) return 0;
  if (plan.engine == ServeEngine::sglang) return plan.kv.kv_cache_tokens / len;
  // Blocks one sequence of `len` tokens needs, over all KV cache groups (the same rule as
  // get_max_concurrency_for_kv_cache_config, at max_model_len = len).
  const ServeSettings& st = plan.settings;
  VllmKvPlan at_len = plan_vllm_blocks(plan.model.kv, plan.available_kv_bytes, st.block_size, len,
                                       st.max_num_batched_tokens, plan.model.context);
  return static_cast<int64_t>(std::floor(at_len.max_concurrency));
}

MinTpResult smallest_tp(const Scenario& s, int64_t max_tp) {
  MinTpResult r;
  for (int64_t tp = 1; tp <= max_tp; tp *= 2) {
    Scenario t = s;
    t.serve.tensor_parallel = tp;
    try {
      const ServePlan p = plan_serve(t);
      if (p.fits) {
        r.tp = tp;
        return r;
      }
      r.tried.emplace_back(tp, p.failure);
    } catch (const ScenarioError& e) {
      r.tried.emplace_back(tp, e.what());
    }
  }
  return r;
}

}  // namespace memsim::serve
