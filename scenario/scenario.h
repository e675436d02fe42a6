// A scenario: one training job described by the user (the YAML format of
// shared/docs/design.md; the key names are public interface).
//
// Contract: a Scenario returned by load_scenario() is complete and valid: presets are
// expanded, overrides applied, every field has a checked value. Anything wrong raises
// ScenarioError whose message starts with "FILE:LINE: KEY: ".
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "allocator/allocator_config.h"
#include "graph/models/decoder_spec.h"

namespace memsim {

enum class ModelFamily { cs336, hf_llama, hf_gpt2, megatron };
// cudnn (SDPA cuDNN attention, torch >= 2.9 on sm90+ in fp16/bf16): graph/ops/ops_sdpa_cudnn.h,
// scenario/sdpa_kernel_keys.h (the SDPA/GQA part).
enum class AttentionImpl { eager, flash, mem_efficient, cudnn };
enum class DType { fp32, bf16, fp16 };
int dtype_bytes(DType dtype);
const char* to_string(ModelFamily family);
const char* to_string(DType dtype);
// The scenario-file spellings ("hf-llama", "mem-efficient", "forward-no-grad", ...).
const char* to_string(AttentionImpl impl);
// model.implementation's spelling ("hf", "torchtitan", ...; scenario/scenario_implementation.cpp).
const char* to_string(graph::ModelImpl impl);

// model.softmax: `staff` = cs336_basics' softmax; `exp-twice` = exp(x-max)/sum(exp(x-max)).
enum class SoftmaxImpl { staff, exp_twice };
// model.sdpa: `staff` = cs336_basics' attention masking; `masked-fill` = graph::Cs336Sdpa.
enum class SdpaImpl { staff, masked_fill };
// model.swiglu: `staff` = cs336_basics' SwiGLU; `projections-first` = graph::Cs336Swiglu.
enum class SwigluImpl { staff, projections_first };

struct ModelConfig {
  std::string preset;                 // "" when the fields were given by hand
  ModelFamily family = ModelFamily::cs336;
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;               // == heads unless GQA/MQA
  int64_t d_ff = 0;
  int64_t vocab = 0;
  int64_t context_length = 0;         // max positions (RoPE cache, learned positions); in a
                                      // loaded Scenario always >= batch.seq_len. A preset
                                      // may hold 0: "built with context_length = seq_len"
  bool tied_embeddings = false;
  AttentionImpl attention = AttentionImpl::eager;
  double dropout = 0.0;
  // cs336 only: the attention softmax's implementation (graph::Cs336Softmax).
  SoftmaxImpl softmax = SoftmaxImpl::staff;
  SdpaImpl sdpa = SdpaImpl::staff;
  SwigluImpl swiglu = SwigluImpl::staff;
  // hf-llama / hf-gpt2: the Hugging Face architecture's knobs (model.architecture and the
  // knob keys, or a config.json; scenario/model_architecture.h). The family's default row
  // (llama for hf-llama, gpt2 for hf-gpt2) when none is named; sliding_layers resolved to
  // one entry per layer (empty = every layer). cs336 and megatron ignore it.
  graph::DecoderArch arch;
  // model.hf_config / `memsim run --model`: the config.json read (path as resolved), or "".
  std::string hf_config;
  // issue #17 serve (Gemma-3's per-layer RoPE): the config.json's rope_scaling /
  // rope_parameters type and factor as read ("" and 1 when absent). vLLM's get_rope sizes
  // its cos_sin_cache with them (linear: max_position x factor rows); training ignores them.
  std::string rope_scaling_type;
  double rope_scaling_factor = 1.0;
};

struct BatchConfig {
  int64_t micro_batch = 1;
  int64_t seq_len = 0;
  int64_t grad_accum = 1;
};

// Which statements run inside `with torch.autocast(...)`: the model call; the model and
// the loss; or the whole step (backward and optimizer too: the weight-cast cache lives
// until the step ends).
// whole_run: one `with torch.autocast(...)` around the whole loop (every step): the
// weight-cast cache is never cleared (sim/step/script_loss.h, docs/scenario-format.md).
enum class AutocastRegion { forward, forward_and_loss, whole_step, whole_run };

// precision.float8 (issue #16, torchtitan's float8 part; scenario/torchtitan_keys.h): torchao
// Float8Linear on the decoder layers' linears; torchao's recipe names (float8 rowwise part:
// rowwise and rowwise_with_gw_hp, graph/ops/ops_float8_rowwise.h).
enum class Float8Recipe { none, tensorwise, rowwise, rowwise_with_gw_hp };

struct PrecisionConfig {
  DType params = DType::fp32;
  Float8Recipe float8 = Float8Recipe::none;  // precision.float8 (graph/ops/ops_float8.h)
  // FSDP2's float8 all-gather (torchtitan's enable_fsdp_float8_all_gather; tensorwise with
  // parallel.sharding fsdp2): the converted weights are cast to e4m3 before the all-gather
  // (sim/parallel/fsdp2.h). precompute: precompute_float8_dynamic_scale_for_fsdp after each
  // optimizer step (scenario/torchtitan_keys.h, docs/float8.md).
  bool float8_all_gather = false;         // precision.float8_all_gather
  bool float8_precompute_scale = false;   // precision.float8_precompute_scale
  std::optional<DType> autocast;      // nullopt = none
  AutocastRegion autocast_region = AutocastRegion::forward_and_loss;
  bool autocast_cache = true;         // torch.autocast(cache_enabled=...)
  bool master_weights = false;
  // precision.grad_scaler: torch.amp.GradScaler around the step (scale(loss).backward(),
  // step, update): its 0-d tensors (sim/step/grad_scaler.h, docs/autocast.md "GradScaler").
  bool grad_scaler = false;
};

enum class OptimizerType { adamw, adam, sgd, none, adam8bit, adamw8bit, adafactor };  // 8bit: bitsandbytes; adafactor: transformers
// out_of_place: a hand-written Adam(W) that creates its state at construction and
// rebinds p.data / its moments to new tensors every step (sim/optim/optimizer_out_of_place.h).
enum class OptimizerImpl { for_loop, foreach, fused, cs336, out_of_place };
struct OptimizerConfig {
  OptimizerType type = OptimizerType::adamw;
  OptimizerImpl impl = OptimizerImpl::foreach;
  double momentum = 0.0;              // sgd
  // optimizer.max_grad_norm: torch.nn.utils.clip_grad_norm_(params, max_norm) between backward
  // and optimizer.step (after the scaler's unscale_); nullopt = no clipping. The clip_* keys:
  // its foreach argument (None on CUDA: true), error_if_nonfinite, and whether the script keeps
  // the returned total norm until the next step's clip (HF Trainer, torchtitan). sim/step/clip_grad.h
  std::optional<double> max_grad_norm;
  bool clip_foreach = true;
  bool clip_error_if_nonfinite = false;
  bool clip_keep_norm = false;
};
const char* to_string(OptimizerType type);
const char* to_string(OptimizerImpl impl);

enum class StepKind { train, forward, forward_no_grad, forward_backward, generate };
enum class CompileRegions { model, block };  // step.compile_scope
struct StepConfig {
  StepKind kind = StepKind::train;
  int64_t warmup_steps = 1;
  bool zero_grad_set_to_none = true;
  // step.measure whole-run: peaks are measured from the program's start (a script that
  // records or reads max_memory_allocated() from before the model is built, never
  // resetting the peak), not from the measured (last) step (scenario/script_keys.h).
  bool measure_whole_run = false;
  // Issue #16 item 8 (HF Trainer helper): step.keep_output (scenario/step_output_key.h).
  // true (default, today's loop): the output is a loop-level name, alive until the next
  // forward has returned; false: dropped, with the graph it holds, at each iteration's end.
  bool keep_output = true;
  // GPU proof of HF Trainer / PEFT defaults (issue #16 item 5, wt/ghft): step.keep_output
  // `loss` (scenario/step_output_key.h): the model output dies right after the loss is
  // computed, before backward (HF Trainer's compute_loss returns the loss only, its
  // `outputs` local dies there); the loss dies after the iteration's backward. Implies
  // keep_output false.
  bool output_dies_after_loss = false;
  // step.keep_output `model-loss` (scenario/step_output_key.h): `outputs = model(ids,
  // labels=labels); loss = outputs.loss` bound at loop level: the model's forward computes
  // the loss, and the previous outputs die when the call returns, after that loss.
  // keep_output stays true.
  bool model_computes_loss = false;
  // --- issue #16 part 4: torch.compile (scenario/compile_keys.h, graph/compile.h,
  // docs/compile.md). step.compile: the model runs compiled; step.compile_scope: model
  // (torch.compile(model), the loss outside) or block (each transformer block compiled,
  // torchtitan); step.compile_memory_budget: torch._functorch.config.
  // activation_memory_budget in [0, 1].
  bool compile = false;
  CompileRegions compile_scope = CompileRegions::model;
  double compile_memory_budget = 1.0;
  std::string compile_where;  // where step.compile was set ("FILE:LINE"), for refusals
};
const char* to_string(StepKind kind);

// The loss the user's loop computes (sim/step/script_loss.h). impl: automatic = the
// family's usual loss (cs336: the staff cross_entropy with optimizer.impl cs336,
// F.cross_entropy otherwise; hf-*: the model's own ForCausalLM loss); one_hot = a
// hand-written `-sum(one_hot * log_softmax(x)) / B`; torch_float = F.cross_entropy on
// `logits.float()`. positions: last = the loss on `logits[:, -1, :]` only (targets are (B,)).
// Issue #16 item 6 (losses, docs/losses.md; spellings and family rules in
// scenario/loss_impl.h): chunked = torchtune's chunked output + CEWithChunkedOutputLoss
// with `chunks` chunks; liger = Liger-Kernel's fused linear cross entropy.
enum class LossFunction { automatic, torch, torch_float, cs336, one_hot, chunked, liger };
enum class LossPositions { all, last };
struct LossConfig {
  LossFunction impl = LossFunction::automatic;
  LossPositions positions = LossPositions::all;
  int64_t chunks = 0;  // chunked:N (N >= 1); 0 otherwise
};

// checkpoint.policy (sim/step/checkpoint_policy.h says what each one checkpoints).
enum class CheckpointPolicy {
  none, full, selective, uniform, block, modules, custom, sqrt,
  sac_op, sac_layer,  // torchtitan's op-level and layer-level SAC (docs/torchtitan-recipes.md)
};
// The one spelling table of the policies: scenario files, `--policies`, JSON and messages
// ("none", "uniform", ...; the name only, without an argument such as ":2").
const char* to_string(CheckpointPolicy policy);
// The policy spelled `name`, or nullopt.
std::optional<CheckpointPolicy> parse_checkpoint_policy(std::string_view name);
// Every policy with its spelling, in enum order (the order error messages list them).
const std::vector<std::pair<std::string, CheckpointPolicy>>& checkpoint_policy_spellings();

struct CheckpointConfig {
  CheckpointPolicy policy = CheckpointPolicy::none;
  int64_t layers_per_segment = 1;
  std::vector<std::string> custom;    // policy custom: layer indices or module names
                                      // (required); policy modules: module names (optional)
  // torch.utils.checkpoint(use_reentrant=...): unset = the family's usual call (false:
  // cs336, hf-*, as the torch recommendation; megatron always reentrant).
  std::optional<bool> reentrant;
  // --- issue #16 item 3, torchtitan's recipes (docs/torchtitan-recipes.md) ---------------
  // checkpoint.early_stop: torch.utils.checkpoint(early_stop=...), whether a re-run stops
  // once its last saved tensor is recomputed. Unset: the stack's default (sac-op and
  // sac-layer:N are torchtitan's, whose ActivationCheckpointConfig.early_stop is false;
  // every other policy: the script's torch, true from torch 2.1). sac-layer:N keeps N in
  // layers_per_segment.
  std::optional<bool> early_stop;
  // --- issue #18 item 4, activation offload (graph/offload.h; docs/offload.md) -----------
  // checkpoint.offload: the layers whose forward runs under
  // torch.autograd.graph.save_on_cpu(pin_memory=True) (scenario/offload_keys.h). Layer
  // indices, sorted and unique; offload_all: `all` (every layer, resolved against
  // model.layers by offload_layers). Both empty/false: no offload (the default).
  std::vector<int64_t> offload;
  bool offload_all = false;
  std::string offload_where;  // FILE:LINE of the key, for refusals
};

// PEFT LoRA / QLoRA (scenario/scenario_lora.cpp, graph/models/lora.h). rank 0 = no LoRA.
struct LoraConfig {
  int64_t rank = 0;
  double alpha = 0.0;                 // scaling alpha/rank: no effect on memory
  std::vector<std::string> targets;   // module names (q_proj, ...) or {"all-linear"}
  double dropout = 0.0;
  bool base_nf4 = false;              // lora.base_dtype nf4 (else the params dtype)
  DType adapter_dtype = DType::fp32;
  // Issue #16 item 5 (HF Trainer helper): lora.input_require_grads, PEFT's
  // enable_input_require_grads hook (scenario/peft_input_grads_key.h); unset = on with
  // reentrant checkpointing, off otherwise.
  std::optional<bool> input_require_grads;
  // Issue #15 item 5: lora.compute_dtype, bitsandbytes' Linear4bit compute_dtype
  // (BitsAndBytesConfig bnb_4bit_compute_dtype; nf4 only; scenario/lora_compute_dtype_key.h).
  // Unset: precision.params.
  std::optional<DType> compute_dtype;
  // lora.prepare_kbit true (scenario/peft_kbit_key.h): PEFT's prepare_model_for_kbit_training
  // ran between the load and get_peft_model (over a 16-bit load: the fp32 upcast).
  bool prepare_kbit = false;
};

enum class Sharding { none, fsdp, deepspeed, fsdp2 };
// FSDP1's auto-wrap policy (parallel.fsdp_wrap; scenario/fsdp_lora_keys.h).
enum class FsdpWrap { block, peft };
// Context parallelism's K/V rotation (torch set_rotate_method; scenario/context_parallel_keys.h).
enum class ContextRotate { allgather, alltoall };
// Megatron's pipeline schedules (sim/megatron/pipeline_schedule.h).
enum class PipelineSchedule { one_f_one_b, gpipe, interleaved };
const char* to_string(PipelineSchedule schedule);
struct ParallelConfig {
  int64_t data = 1;
  int64_t tensor = 1;
  int64_t pipeline = 1;
  int64_t zero = 0;
  // cs336 / hf-*: who shards (sim/parallel/fsdp.h). With fsdp, zero is 3 (FULL_SHARD) or 2
  // (SHARD_GRAD_OP), set from reshard_after_forward when not given.
  Sharding sharding = Sharding::none;
  bool reshard_after_forward = true;
  // fsdp: false = the model is built on the GPU, then wrapped (FSDP(model.cuda()));
  // true = built on the CPU / meta device and moved unit by unit (FSDP(device_id=...)).
  bool fsdp_init_on_cpu = false;
  // torch DDP's gradient_as_bucket_view (sim/parallel/data_parallel.h); false is torch's default.
  bool gradient_as_bucket_view = false;
  // megatron, tensor > 1: Megatron's --sequence-parallel (sim/megatron/megatron_parallel.h).
  bool sequence = false;
  // megatron, pipeline > 1 (scenario/pipeline_keys.h): the schedule, and the model chunks per
  // rank of the interleaved one (--num-layers-per-virtual-pipeline-stage = layers / (p*v)).
  PipelineSchedule pipeline_schedule = PipelineSchedule::one_f_one_b;
  int64_t virtual_stages = 1;
  // fsdp: CPUOffload(offload_params=True): sharded parameters, their gradients and the
  // optimizer live on the CPU (sim/parallel/fsdp.h). Kept after the fields some callers
  // brace-initialise.
  bool cpu_offload = false;
  // fsdp: MixedPrecision(param_dtype=reduce_dtype=this): fp32 shards, gathered parameters
  // and gradients in this dtype (sim/parallel/fsdp.h); nullopt = none.
  std::optional<DType> fsdp_mixed_precision;
  // --- FSDP2 (issue #16 item 1; sim/parallel/fsdp2.h, scenario/fsdp2_keys.cpp) ---------
  // fsdp2: parallel.reshard_after_forward N (an int): the blocks reshard to a mesh of N
  // ranks after forward (0 = the bool above decides). parallel.replicate R: HSDP, shard
  // over data / R ranks and all-reduce across R replicas (1 = plain FSDP2).
  // parallel.reduce_dtype: MixedPrecisionPolicy.reduce_dtype (nullopt = None: reduce in
  // the gradients' dtype).
  int64_t reshard_after_forward_ranks = 0;
  int64_t replicate = 1;
  std::optional<DType> reduce_dtype;
  // parallel.fsdp_output_dtype: MixedPrecisionPolicy.output_dtype (nullopt = None): the
  // root's post-forward casts its floating outputs (loss, logits) to it
  // (sim/parallel/accelerate_amp.h cast_outputs). Accelerate >= 1.8 sets it to bf16.
  std::optional<DType> fsdp_output_dtype;
  // --- context parallelism (issue #16, part cp; scenario/context_parallel_keys.h,
  // graph/ops/ops_ring.h) ----------------------------------------------------------------
  // parallel.context N: torch's context_parallel over N ranks (each holds S/N of the
  // sequence, ring attention); 1 = none. FSDP2 then shards over data x context ranks.
  // parallel.context_rotate: how K/V travel the ring (torch's default all-gather, or
  // all-to-all).
  int64_t context = 1;
  ContextRotate context_rotate = ContextRotate::allgather;
  // --- FSDP1 + LoRA (issue #16 item 5, part f1lora; scenario/fsdp_lora_keys.h,
  // sim/parallel/fsdp.h, docs/fsdp-lora.md) ------------------------------------------------
  // parallel.fsdp_wrap: FSDP1's auto-wrap policy (block: transformer_auto_wrap_policy, one
  // unit per decoder layer; peft: PEFT's fsdp_auto_wrap_policy, which also makes every
  // trainable leaf Linear its own unit). parallel.use_orig_params: FSDP(use_orig_params=).
  FsdpWrap fsdp_wrap = FsdpWrap::block;
  bool use_orig_params = false;
  // parallel.fsdp_backward_prefetch (FSDP1's backward_prefetch; scenario/fsdp_keys.cpp):
  // true = BACKWARD_PRE (torch's default), false = None (NO_PREFETCH: HF Trainer's default,
  // transformers' _process_fsdp_args). sim/parallel/fsdp.h.
  bool fsdp_backward_prefetch = true;
  // parallel.fsdp_sync_module_states: FSDP(sync_module_states=True): each unit's buffers and
  // parameters are broadcast from rank 0 (in 250 MiB buckets) before it is flattened
  // (HF Trainer's default; sim/parallel/fsdp.h).
  bool fsdp_sync_module_states = false;
  // --- megatron, pipeline > 1: uneven splits (issue #15; scenario/pipeline_keys.h,
  // scenario/pipeline_split.h) ---------------------------------------------------------
  // parallel.pipeline_first_layers / pipeline_last_layers: Megatron's
  // --decoder-first/last-pipeline-num-layers (0 = not given, Megatron's None).
  // parallel.pipeline_account_for_embedding / _loss: --account-for-embedding/loss-in-
  // pipeline-split (the embedding / the loss counts as one layer of the first / last stage).
  int64_t pipeline_first_layers = 0;
  int64_t pipeline_last_layers = 0;
  bool pipeline_account_for_embedding = false;
  bool pipeline_account_for_loss = false;
  // parallel.accelerate_version (sharding fsdp2 only; scenario/fsdp2_keys.cpp): the
  // Accelerate release whose fsdp2_prepare_model sharded the model, as 100 * major + minor
  // (1.14 -> 114); 0 = not Accelerate (the loop's own fully_shard calls, each block then
  // the root). It selects the grouping (sim/parallel/fsdp2_layout.h).
  int32_t accelerate_version = 0;
};

// --- DeepSpeed ZeRO (issue #16 item 2; scenario/deepspeed_keys.h reads it, sim/parallel/
// deepspeed_zero.h models it). Used only with parallel.sharding: deepspeed (parallel.zero
// 1-3). Defaults are DeepSpeed 0.19.6's (deepspeed/runtime/zero/config.py,
// offload_config.py); sizes are in elements, as in the JSON config.
enum class DsOffload { none, cpu, nvme };
struct DeepSpeedConfig {
  std::string config;                       // deepspeed.config: the ds.json read ("" = none)
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  bool contiguous_gradients = true;
  std::optional<bool> overlap_comm;         // unset: true for stage 3, false for 1/2
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t sub_group_size = 1000000000;
  DsOffload offload_optimizer = DsOffload::none;
  DsOffload offload_param = DsOffload::none;
  bool offload_pin_memory = true;           // offload_{optimizer,param}.pin_memory
  int64_t nvme_param_buffer_count = 5;      // offload_param.buffer_count
  int64_t nvme_param_buffer_size = 100000000;  // offload_param.buffer_size
  int64_t nvme_optimizer_buffer_count = 4;  // offload_optimizer.buffer_count
  // stage 3: the model is built under deepspeed.zero.Init (transformers' from_pretrained
  // with a ZeRO-3 config): each parameter is partitioned as soon as it is created.
  bool zero_init = true;
  // For the host-memory report: ranks sharing one node's CPU memory (unset: min(data, 8)).
  int64_t ranks_per_node = 0;
  bool overlap() const { return overlap_comm.value_or(false); }
};
const char* to_string(DsOffload offload);

// --- issue #17 item 1: generation (scenario/generate_keys.h reads and checks it,
// sim/step/generate.h models it, docs/generate.md). Used with step.kind generate: Hugging
// Face generate() (greedy) of batch.micro_batch prompts of prompt_len tokens, new_tokens
// new tokens each; batch.seq_len is then prompt_len + new_tokens. cache: the KV cache class
// (dynamic = DynamicCache, static = StaticCache, quantized:int4 / quantized:int2 =
// QuantizedCache with optimum-quanto, offloaded; quantized:int8 = QuantizedCache with HQQ,
// 5.x classes only: graph/models/hqq_kv.h).
// logits_to_keep: num_logits_to_keep of the forward
// (generate sets 1; 0 = the logits of every position).
enum class GenerateCache { dynamic, static_cache, quantized_int8, quantized_int4, offloaded, quantized_int2 };
const char* to_string(GenerateCache cache);
struct GenerateConfig {
  int64_t prompt_len = 0;
  int64_t new_tokens = 0;
  GenerateCache cache = GenerateCache::dynamic;
  int64_t logits_to_keep = 1;
  // --- generate caches (issue #17: sliding-window / offloaded caches; docs/generate.md) ---
  // generate.cache_classes: v4_45 = transformers v4.45's DynamicCache / StaticCache (every
  // token kept); v5 = the layered Cache classes of 5.x (DynamicLayer /
  // DynamicSlidingWindowLayer by layer type) inside the same v4.45 loop.
  bool cache_classes_v5 = false;
  // --- quantized KV cache (issue #17 part 1: generate.cache quantized:int4 / int2;
  // graph/models/quanto_kv.h, docs/generate.md "Quantized caches") ---
  // QuantizedCache's cache_config: residual_length (tokens kept in the states' dtype before
  // the whole cache is re-quantized) and q_group_size (elements per scale / shift).
  int64_t residual_length = 128;
  int64_t q_group_size = 64;
};

struct DeviceConfig {
  std::string preset;
  uint64_t capacity = 0;               // bytes usable by the process (cudaMemGetInfo total)
  uint64_t cuda_context = 0;           // bytes taken outside the allocator
  uint64_t cublas_workspace = 8519680; // per (handle, stream); 32 MiB on sm_90
  // CUDA kernels' own scratch through the caching allocator (softmax backward's
  // grad * output, reductions' global staging, embedding backward's sort and partial
  // sums), and CUDA's allocation order where its kernel differs from the CPU one
  // (dropout's mask first). false describes a CPU run: the tests that compare with
  // PyTorch on CPU.
  bool kernel_scratch = true;
  // --- issue #18 item 1: the time model's datasheet rates (sim/analysis/step_time.h,
  // docs/time-model.md; scenario/device_rate_keys.cpp). Dense peaks in FLOP/s, bandwidths
  // in bytes/s per direction; 0 = not known for this device (an estimate that needs it is
  // refused, naming the key). Presets fill them from the vendors' datasheets.
  double flops_fp32 = 0, flops_tf32 = 0, flops_bf16 = 0, flops_fp16 = 0, flops_fp8 = 0;
  double hbm_bandwidth = 0;      // device.hbm_gbps
  double nvlink_bandwidth = 0;   // device.nvlink_gbps (0: GPUs of a node talk over PCIe)
  double pcie_bandwidth = 0;     // device.pcie_gbps (host transfers)
  double network_bandwidth = 0;  // device.network_gbps: one GPU's NIC, across nodes
  int64_t gpus_per_node = 8;     // device.gpus_per_node: groups beyond it cross the network
};

// --- issue #17 items 2-4: `memsim serve` (scenario/serve_keys.h reads it, sim/serve/
// models it, docs/serve.md). A scenario without a `serve:` section has present == false and
// every other command ignores the section. Defaults are the engine's own (vLLM `vllm serve`,
// SGLang launch_server); 0 in an int field = "the engine's default for this model/device".
enum class ServeEngine { vllm, sglang };
enum class KvCacheDtype { automatic, fp8, int8 };  // spelled auto | fp8 | int8
enum class WeightQuant { none, fp8, int8, int4, nf4 };  // serve.quantization
struct ServeConfig {
  bool present = false;
  std::string where;                  // "FILE:LINE" of `serve:` (or "--set")
  std::vector<std::pair<std::string, std::string>> key_where;  // "serve.KEY" -> where set
  ServeEngine engine = ServeEngine::vllm;
  double gpu_memory_utilization = 0.9;  // vLLM CacheConfig default
  double mem_fraction_static = 0.0;     // SGLang; 0 = its default rule
  int64_t max_model_len = 0;            // 0 = the model's context (max_position_embeddings)
  int64_t max_num_batched_tokens = 0;   // 0 = vLLM's default for the device
  int64_t max_num_seqs = 0;             // 0 = vLLM's default for the device
  int64_t block_size = 0;              // 0 = the engine's default (vLLM 16, SGLang 1)
  KvCacheDtype kv_cache_dtype = KvCacheDtype::automatic;
  bool cuda_graphs = true;              // false = --enforce-eager
  int64_t tensor_parallel = 1;
  bool prefix_caching = true;           // V1 default; no effect on the memory plan
  WeightQuant quantization = WeightQuant::none;
  // Device memory NCCL takes per rank with tensor_parallel > 1 (non-torch memory);
  // unset = sim/serve/non_torch.h's default.
  std::optional<uint64_t> nccl_memory;
  // issue #17 serve for MoE / DeepSeek / Gemma (sim/serve/fused_moe.h): vLLM's
  // VLLM_FUSED_MOE_CHUNK_SIZE, the tokens one fused_experts chunk processes (vllm/envs.py).
  int64_t fused_moe_chunk_size = 32768;
  // Where `key` ("serve.block_size") was set, else the section's line, else the file.
  std::string where_of(const std::string& key, const std::string& source) const;
};
const char* to_string(ServeEngine e);
const char* to_string(KvCacheDtype d);
const char* to_string(WeightQuant q);

// --- Megatron-Core MoE (issue #15, Megatron part; scenario/megatron_moe_keys.h, docs/moe-megatron.md) ---
// family megatron with model.moe: parallel.expert (EP, --expert-model-parallel-size),
// parallel.expert_tensor (ETP, --expert-tensor-parallel-size), and model.moe's Megatron
// knobs: dispatcher (--moe-token-dispatcher-type), capacity_factor
// (--moe-expert-capacity-factor, nullopt = dropless), pad_to_capacity
// (--moe-pad-expert-input-to-capacity), grouped_gemm (--moe-grouped-gemm), recompute
// (--recompute-modules moe / shared_experts / moe_act under --recompute-granularity selective).
enum class MoeDispatcher { allgather, alltoall };
struct MegatronMoeConfig {
  int64_t expert = 1;         // EP
  int64_t expert_tensor = 1;  // ETP
  MoeDispatcher dispatcher = MoeDispatcher::allgather;
  std::optional<double> capacity_factor;
  bool pad_to_capacity = false;
  bool grouped_gemm = false;
  bool recompute_moe = false;             // --recompute-modules moe
  bool recompute_shared_experts = false;  // --recompute-modules shared_experts
  bool recompute_moe_act = false;         // --recompute-modules moe_act (TEGroupedMLP's activation)
  // Issue #15 Megatron part 2 (scenario/megatron_moe_keys.cpp): model.moe.aux_loss_coeff
  // (--moe-aux-loss-coeff, > 0 turns the load-balancing loss on) and model.moe.z_loss_coeff
  // (--moe-z-loss-coeff: the z-loss runs whenever it is given, as Megatron tests `is not None`).
  double aux_loss_coeff = 0;
  std::optional<double> z_loss_coeff;
};
// Issue #15 Megatron part 2 (scenario/megatron_arch_keys.h, docs/moe-megatron.md): family
// megatron's MLP and bias flags, from the architecture knob keys it accepts. model.mlp glu +
// model.activation silu = --swiglu; model.o_bias / model.mlp_bias false =
// --disable-bias-linear, and model.qkv_bias true with them = --add-qkv-bias. GQA is
// model.kv_heads (--group-query-attention --num-query-groups).
struct MegatronArchConfig {
  bool swiglu = false;
  bool bias_linear = true;  // add_bias_linear
  bool qkv_bias = true;     // add_qkv_bias (true whenever bias_linear is)
};

// --- issue #16 item 7, torchtune's recipe features (scenario/torchtune_keys.h) ---------
// optimizer.in_backward: torchtune's optimizer_in_bwd, one optimizer per parameter
// stepped from the parameter's post-accumulate-grad hook, its .grad set to None right
// after (sim/optim/optimizer_in_backward.h). false (default): the loop's optimizer.step().
struct RecipeFeatures {
  bool optimizer_in_backward = false;
  std::string in_backward_where;  // FILE:LINE of optimizer.in_backward, for refusals
  // checkpoint.offload_activations: torchtune's OffloadActivations around the forward
  // (scenario/offload_activations_key.h, graph/offload_streams.h). false: none (the default).
  // Here, not in CheckpointConfig: plan searches (optimize, compare --policies) replace the
  // checkpoint section, and the step must still see the key to refuse their plans.
  bool offload_activations = false;
  // parallel.custom_sharded_layers (model.implementation torchtune with parallel.sharding
  // fsdp2; scenario/torchtune_keys.h): the recipe's custom_sharded_layers, the modules
  // shard_model gives a fully_shard of their own besides each layer and the root
  // (sim/parallel/fsdp2_layout.h). Both by default, as torchtune's llama3 configs set.
  bool shard_tok_embeddings = false;
  bool shard_output = false;
};

struct Scenario {
  std::string source;                  // file the scenario came from ("<string>" if none)
  std::string name;
  ModelConfig model;
  BatchConfig batch;
  PrecisionConfig precision;
  OptimizerConfig optimizer;
  StepConfig step;
  CheckpointConfig checkpoint;
  LoraConfig lora;
  ParallelConfig parallel;
  DeviceConfig device;
  AllocatorConfig allocator;
  LossConfig loss;                     // after the fields callers brace-initialise
  DeepSpeedConfig deepspeed;           // parallel.sharding: deepspeed (issue #16 item 2)
  ServeConfig serve;                   // `memsim serve` (issue #17 items 2-4)
  GenerateConfig generate;             // step.kind generate (issue #17 item 1)
  MegatronMoeConfig megatron_moe;      // family megatron + model.moe (issue #15, Megatron part)
  MegatronArchConfig megatron_arch;    // family megatron: --swiglu, biases (issue #15, Megatron part 2)
  RecipeFeatures recipe;               // optimizer.in_backward (issue #16 item 7)
  // Where each key the document set came from ("FILE:LINE" or "--set"), for errors the
  // simulator raises after reading (the event budget, sim/step/event_budget.h).
  std::vector<std::pair<std::string, std::string>> key_where;
  // "FILE:LINE: KEY" (or "--set KEY" for an override; "FILE: KEY" when the key was not set),
  // the prefix the reader's own errors use.
  std::string key_prefix(const std::string& key) const;
};

class ScenarioError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Loads a YAML scenario file, then applies `overrides` ("batch.micro_batch", "8") in
// order, as given by --set on the command line.
Scenario load_scenario(const std::string& path,
                       const std::vector<std::pair<std::string, std::string>>& overrides = {});
// Same, from text (`source` names it in errors).
Scenario load_scenario_text(const std::string& text, const std::string& source,
                            const std::vector<std::pair<std::string, std::string>>& overrides = {});

// `memsim run --model CONFIG`: the scenario at `path` ("" = none: every other section at
// its default) with its model replaced by the Hugging Face config.json (or checkpoint
// folder) at `model_path`, relative to the working directory. The file's model keys are
// dropped except model.attention and model.dropout (how the model is run, not which model
// it is); `overrides` then apply, model keys included. Errors name "--model" for the path.
Scenario load_scenario_with_model(const std::string& path, const std::string& model_path,
                                  const std::vector<std::pair<std::string, std::string>>& overrides = {});

// Applies "allocator.KEY" overrides (the allocator section's keys, same validation and
// errors as in a scenario file, "--set KEY: ...") on top of `base`; for `memsim replay`,
// which has a trace instead of a scenario.
AllocatorConfig apply_allocator_overrides(
    AllocatorConfig base, const std::vector<std::pair<std::string, std::string>>& overrides);

// Presets: what `model.preset` / `device.preset` accept, for `memsim presets`.
struct PresetInfo {
  std::string name;     // "cs336-xl"
  std::string summary;  // one line with the numbers the preset fills in
  std::string source;   // where those numbers come from
};
std::vector<PresetInfo> model_presets();
std::vector<PresetInfo> device_presets();
// The fields a preset fills in (ModelConfig::preset / DeviceConfig::preset set to `name`);
// nullptr for an unknown name.
const ModelConfig* find_model_preset(std::string_view name);
const DeviceConfig* find_device_preset(std::string_view name);

}  // namespace memsim
