// Every shipped scenario (scenarios/*.yaml) loads, simulates, and gives the verdict that
// docs/claims.md states for it: fits or out of memory (and in which phase), with the
// measured-step peak allocated within 2% of the number quoted there. A new scenario file
// fails this test until its claim is written into docs/claims.md and the table below.
//
// The device follows tools/cli/device.h: capacity is the device total including the CUDA
// context, the allocator can use capacity - cuda_context.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include "allocator/caching_allocator.h"
#include "allocator/units.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

struct Claim {
  bool fits;
  std::optional<Phase> oom_phase;  // where it runs out (nullopt when it fits)
  double peak_allocated_gib;       // docs/claims.md's "memsim predicts" number
  // Non-empty: memsim refuses the scenario (a setting it does not model yet) with an
  // error containing this text; the other fields are unused.
  const char* refused = "";
};

// Keep in step with docs/claims.md.
const std::map<std::string, Claim>& claims() {
  static const std::map<std::string, Claim> table = {
      {"cs336-small-train-ctx512.yaml", {true, std::nullopt, 5.08}},
      {"cs336-medium-train-ctx512.yaml", {true, std::nullopt, 11.63}},  // bf16 autocast
      {"cs336-large-train-ctx512.yaml", {true, std::nullopt, 27.53}},
      {"cs336-xl-train-ctx128.yaml", {true, std::nullopt, 51.46}},
      {"cs336-xl-train-ctx512.yaml", {true, std::nullopt, 65.58}},
      {"cs336-xl-train-ctx512-bf16.yaml", {true, std::nullopt, 63.77}},  // bf16 autocast
      {"gpt2-large-mi300x.yaml", {true, std::nullopt, 76.86}},
      {"gpt3-175b.yaml", {false, Phase::setup, 77.70}},
      // Tensor parallel 8: out of memory allocating the 81.42 GiB fp32 main_grad buffer.
      {"gpt3-175b-tp8-8xh100.yaml", {false, Phase::setup, 40.71}},
      // Tensor 8 + SP, pipeline 8 (1F1B, 16 micro-batches), selective: stage 0 (8
      // micro-batches of 12 layers in flight) peaks at its first backward.
      {"gpt3-175b-tp8-pp8-64xh100.yaml", {true, std::nullopt, 57.38}},
      {"llama2-13b-seq4096-mi300x.yaml", {false, Phase::forward, 189.76}},
      {"llama2-13b-seq4096-mi300x-flash.yaml", {true, std::nullopt, 122.30}},
      // model.implementation torchtitan / torchtune, full checkpointing: the AdamW step.
      {"llama3-8b-torchtitan-seq8192-h200.yaml", {true, std::nullopt, 74.85}},
      {"llama3-8b-torchtune-seq8192-h200.yaml", {true, std::nullopt, 74.85}},
      // torchtune's compile: True (per-layer compile_model + compile_loss), no checkpointing:
      // the peak is in the backward (docs/compile.md "torchtune's code").
      {"llama3-8b-torchtune-compile-h200.yaml", {true, std::nullopt, 86.64}},
      // compile_model, then set_activation_checkpointing (full): the AdamW step, as eager AC.
      {"llama3-8b-torchtune-compile-ac-h200.yaml", {true, std::nullopt, 74.85}},
      {"llama3-8b-litgpt-b4-seq512-h200.yaml", {true, std::nullopt, 75.83}},
      // LitGPT's pretrain.py (torch.compile(model), the loss outside): the peak is the
      // loss's backward (docs/compile.md "LitGPT").
      {"tinyllama-1.1b-litgpt-pretrain-compile-h100.yaml", {true, std::nullopt, 23.15}},
      // LitGPT's LoRA (finetune/lora.py) on attn.proj and the MLP: the head's fp32 chunk
      // copies of the next micro-batch while the loop still holds the previous list.
      {"llama3-8b-litgpt-lora-seq512-h100.yaml", {true, std::nullopt, 19.66}},
      // torchtune's LoRA recipe (8B_lora_single_device): frozen bf16 base, the loss's peak.
      {"llama3-8b-torchtune-lora-h100.yaml", {true, std::nullopt, 19.42}},
      // ... with compile: True (LoRA inside the compiled layers, compile_loss): the loss's backward.
      {"llama3-8b-torchtune-lora-compile-h100.yaml", {true, std::nullopt, 17.71}},
      // torchtune's OffloadActivations (checkpoint.offload_activations), b 2, s 8192, with
      // optimizer_in_bwd: the chunked loss (docs/offload.md).
      {"llama3-8b-torchtune-offload-h100.yaml", {true, std::nullopt, 58.16}},
      // torchtune's full_finetune_distributed (FSDP2, 8B_full defaults, rank 0 of 8): the
      // output's backward (its gathered weight, two grads and their sum).
      {"llama3-8b-torchtune-fsdp2-8xh100.yaml", {true, std::nullopt, 11.45}},
      // The same recipe at 70B_full.yaml's defaults (fsdp_cpu_offload): the output's backward.
      {"llama3.1-70b-torchtune-fsdp2-offload-8xa100.yaml", {true, std::nullopt, 13.89}},
      // torchtune's lora_finetune_distributed (8B_lora defaults, no checkpointing): the
      // root's copy-out in backward (tok_embeddings + output) over every layer's activations.
      {"llama3-8b-torchtune-lora-fsdp2-8xh100.yaml", {true, std::nullopt, 30.88}},
      // 70B_lora defaults (checkpointing, rank 16): the last layer's backward.
      {"llama3.1-70b-torchtune-lora-fsdp2-8xa100.yaml", {true, std::nullopt, 30.76}},
      {"llama2-13b-seq4096-rtx4070.yaml", {false, Phase::setup, 11.19}},
      {"llama2-7b-finetune-a100.yaml", {true, std::nullopt, 63.02}},
      {"llama2-7b-full-finetune-a100.yaml", {true, std::nullopt, 63.02}},
      // checkpoint.policy full: the peak is the AdamW step, as without checkpointing.
      {"llama2-7b-full-finetune-a100-ckpt.yaml", {true, std::nullopt, 63.02}},
      // fp32 master weights (16 B/param): out of memory creating AdamW's fp32 state.
      {"llama2-7b-full-finetune-a100-master.yaml", {false, Phase::optimizer, 78.55}},
      // fp32 params + bf16 autocast + full checkpointing (16 B/param): out of memory
      // creating AdamW's fp32 state in the warm-up step.
      {"llama2-7b-bf16-autocast-ckpt-a100.yaml", {false, Phase::optimizer, 76.24}},
      // HF Trainer(bf16=True, gradient_checkpointing=True): fp32 weights + bf16 autocast,
      // SDPA, reentrant checkpointing, fused AdamW (issue #16 item 5).
      {"qwen2.5-7b-hf-trainer-bf16.yaml", {true, std::nullopt, 113.95}},
      // LoRA r16 q/v on a bf16 base: the peak is the loss's backward (4 x 2048 tokens).
      {"llama2-7b-lora-a100.yaml", {true, std::nullopt, 58.70}},
      // ... wrapped in torch DDP on 8 GPUs: + the adapters' 32 MiB of buckets.
      {"llama2-7b-lora-ddp-8xa100.yaml", {true, std::nullopt, 58.73}},
      // QLoRA NF4 r64 all-linear, full (non-reentrant) checkpointing, 1 x 512 tokens.
      {"llama2-7b-qlora-rtx4090.yaml", {true, std::nullopt, 6.70}},
      // lora.prepare_kbit on an fp32 load: reentrant checkpointing, the input hook.
      {"llama2-7b-qlora-prepare-kbit-rtx4090.yaml", {true, std::nullopt, 7.21}},
      // lora.prepare_kbit over a bf16 load (issue #15 item 5): fp32 embedding, norms, lm_head
      // and hidden states, bf16 Linear4bit compute; the peak is the fp32 logits' loss backward.
      {"llama3-8b-qlora-bf16-prepare-kbit-rtx4090.yaml", {true, std::nullopt, 12.70}},
      // step.kind generate (issue #17): 8 x (3968 + 128) tokens, DynamicCache; the peak is
      // the prefill's eager attention scores in the last layer.
      {"llama2-7b-generate-a100.yaml", {true, std::nullopt, 66.82}},
      // generate.cache quantized:int4 (QuantizedCache, quanto): the same run, the 31 layers
      // before the last prefill attention hold packed 4-bit K/V instead of bf16.
      {"llama2-7b-generate-quantized-int4.yaml", {true, std::nullopt, 56.16}},
      // generate.cache_classes v5: Mistral-7B's sliding layers keep the 4096-token window;
      // the peak is the prefill's last eager attention (4 x 32 x 6000^2 scores).
      {"mistral-7b-generate-sliding-a100.yaml", {true, std::nullopt, 60.72}},
      // FSDP FULL_SHARD over 8 GPUs: the peak is the backward of the last layer.
      {"llama2-7b-fsdp-8xa100.yaml", {true, std::nullopt, 34.36}},
      // ... with CPUOffload: shards and AdamW state in host RAM, activations unchanged.
      {"llama2-7b-fsdp-offload-8xa100.yaml", {true, std::nullopt, 24.95}},
      // ... with bf16 MixedPrecision: fp32 shards and AdamW, bf16 gathers and activations.
      {"llama2-7b-fsdp-bf16-8xa100.yaml", {true, std::nullopt, 23.02}},
      // ... with fp32 FSDP under bf16 autocast (eager attention): every matmul saves its
      // uncached bf16 weight copy, 12.31 GiB of unsharded weights through the forward.
      {"llama2-7b-fsdp-autocast-8xa100.yaml", {true, std::nullopt, 63.89}},
      // FSDP2 (fully_shard per block + root), bf16 / fp32 mixed precision, meta init, full AC.
      {"llama3-8b-fsdp2-8xh100.yaml", {true, std::nullopt, 31.15}},
      // ... with fp32 unsharded parameters under bf16 autocast instead of MixedPrecisionPolicy:
      // the cache keeps every layer's bf16 weights (13.0 GiB) through the loss, the peak.
      {"llama3-8b-fsdp2-autocast-8xh100.yaml", {true, std::nullopt, 45.24}},
      // ... in fp16 with torch.amp.GradScaler (fused AdamW): the scaler's two state blocks at
      // the loss; its found_inf all-reduce clone is in the optimizer step (docs/autocast.md).
      {"llama3-8b-fsdp2-fp16-scaler-8xh100.yaml", {true, std::nullopt, 45.24}},
      {"qwen2.5-7b-hf-trainer-fsdp2-bf16-8xh100.yaml", {true, std::nullopt, 18.64}},
      // ... as Accelerate >= 1.8 prepares it: the policy with output_dtype, no autocast.
      {"qwen2.5-7b-hf-trainer-fsdp2-bf16-accelerate1.8-8xh100.yaml", {true, std::nullopt, 18.64}},
      // ... through Accelerate's FSDP1 path with HF Trainer's FSDP1 defaults (docs/fsdp-accelerate.md):
      // the root's post-backward (its unsharded flat gradient next to its parameters' own).
      {"qwen2.5-7b-hf-trainer-fsdp1-bf16-8xh100.yaml", {true, std::nullopt, 19.84}},
      // ... as Accelerate >= 1.14 groups it (model.embed_tokens and [model.norm, lm_head]
      // apart): block 0's backward, lm_head's gradient reduce-scattered early.
      {"qwen2.5-7b-hf-trainer-fsdp2-bf16-accelerate1.14-8xh100.yaml", {true, std::nullopt, 16.52}},
      // ... on a PeftModel (LoRA r16 q/v, fp32): [lm_head] alone, freed after its backward.
      {"qwen2.5-7b-hf-trainer-fsdp2-lora-accelerate1.14-8xh100.yaml", {true, std::nullopt, 10.80}},
      // ... a tied model (Llama-3.2-3B): [norm, embed_tokens], lm_head the root's second copy.
      {"llama3.2-3b-hf-trainer-fsdp2-bf16-accelerate1.14-8xh100.yaml", {true, std::nullopt, 9.35}},
      // ... with the model loaded in bf16 (5.x's dtype="auto"): Accelerate upcasts the shards
      // after wrapping; the measured step is the fp32-loaded one's (docs/fsdp-accelerate.md).
      {"qwen2.5-7b-hf-trainer-fsdp1-bf16-load-bf16-8xh100.yaml", {true, std::nullopt, 19.84}},
      {"qwen2.5-7b-hf-trainer-fsdp1-fp16-8xh100.yaml", {true, std::nullopt, 19.84}},
      // LoRA r16 q/v with FSDP1 as the HF Trainer wraps a PEFT model (PEFT's
      // fsdp_auto_wrap_policy, use_orig_params): the loss's backward (docs/fsdp-lora.md).
      {"llama3-8b-lora-fsdp-8xh100.yaml", {true, std::nullopt, 33.22}},
      // ... at sequence 32768 with context parallelism 4 (data 2 x context 4): each rank's
      // 8192 tokens peak in the loss's backward as the file above does.
      {"llama3-8b-fsdp2-cp4-8xh100.yaml", {true, std::nullopt, 31.15}},
      // DeepSpeed ZeRO-3 bf16 on 8 GPUs (sim/parallel/deepspeed_zero.h): the loss's backward.
      {"llama2-7b-zero3-8xa100.yaml", {true, std::nullopt, 27.14}},
      // ZeroRedundancyOptimizer + DDP on 4 GPUs; plain DDP runs out of memory.
      {"gpt2-large-zero1-4xv100.yaml", {true, std::nullopt, 11.12}},
      // torch.compile (issue #16 part 4): the peak is the loss's backward; eager 66.56 GiB.
      {"llama3.2-1b-compile-h100.yaml", {true, std::nullopt, 58.44}},
      {"llama3-8b-vllm-h100.yaml", {true, std::nullopt, 24.84}},  // memsim run: the HF no-grad forward
      // issue #17 serve for MoE / Gemma: memsim run is the HF no-grad forward of 2048 tokens.
      {"qwen3-30b-a3b-vllm-h100.yaml", {true, std::nullopt, 58.07}},
      {"gemma3-4b-vllm-h100.yaml", {true, std::nullopt, 9.27}},
      // issue #17 serve for DeepSeek MLA: memsim run is HF's eager no-grad forward of 2048 tokens.
      {"deepseek-v2-lite-vllm-h100.yaml", {true, std::nullopt, 30.47}},
      // torchtitan's op-level SAC (docs/torchtitan-recipes.md) over FSDP2 on 8 GPUs:
      // the peak is the loss's backward; sac-op's per-layer cache is 13.53 GiB of it.
      {"llama3-8b-torchtitan-sac.yaml", {true, std::nullopt, 44.68}},
      {"llama3-8b-torchtitan-fsdp2-8xh100.yaml", {true, std::nullopt, 39.66}},
      {"llama3-8b-torchtitan-fsdp2-clip-8xh100.yaml", {true, std::nullopt, 39.66}},
      // ... with per-block torch.compile and full AC instead (torchtitan's apply_ac,
      // apply_compile, apply_fsdp; docs/compile.md): the loss's backward, as eager full AC.
      {"llama3-8b-torchtitan-compile.yaml", {true, std::nullopt, 31.15}},
      // Qwen3-30B-A3B (MoE, docs/moe.md) over FSDP on 8 GPUs, balanced routing: the AdamW step.
      {"qwen3-30b-a3b-fsdp-8xh100.yaml", {true, std::nullopt, 36.77}},
      // PEFT target_parameters on the routed experts: 47 layers' merged W + delta alive in
      // layer 47's forward (docs/moe.md "LoRA on the routed experts").
      {"qwen3-30b-a3b-lora-experts-h200.yaml", {true, std::nullopt, 131.65}},
      // ... with transformers 5.x's default grouped_mm experts: _grouped_mm saves the merged
      // weights as mat2, so the same 47 layers' are alive at layer 47's forward.
      {"qwen3-30b-a3b-lora-experts-grouped-mm-h200.yaml", {true, std::nullopt, 130.18}},
      // QLoRA (NF4) on attention: the 3-D experts stay bf16 (transformers 5.x quantizes
      // nn.Linear modules only); the peak is the loss's backward (docs/moe.md "QLoRA").
      {"qwen3-30b-a3b-qlora-h200.yaml", {true, std::nullopt, 60.28}},
      // ... over FSDP2 on 8 H100s with full checkpointing: every rank still builds each layer's
      // merged weights on the all-gathered experts; the peak is the loss's backward.
      {"qwen3-30b-a3b-lora-experts-fsdp2-8xh100.yaml", {true, std::nullopt, 18.18}},
      // OLMoE-1B-7B under HF Trainer's bf16 autocast on one H200 (issue #15, docs/moe.md):
      // layer 0's backward (GroupedMmBackward0's 1 GiB fp32 gate_up_proj grad: transformers
      // 5.x's default grouped_mm experts; 105.09 with the eager loop).
      {"olmoe-1b-7b-hf-trainer-bf16-h200.yaml", {true, std::nullopt, 103.34}},
      // DeepSeek-V2-Lite (docs/deepseek.md) over FSDP on 8 GPUs: the recomputed eager attention.
      {"deepseek-v2-lite-fsdp-8xh100.yaml", {true, std::nullopt, 23.75}},
      // QLoRA on the latent attention, one H100: the bf16 routed experts are 26.81 GiB of it.
      {"deepseek-v2-lite-qlora-h100.yaml", {true, std::nullopt, 34.13}},
      // ... with fp32 parameters under HF Trainer's bf16 autocast, the default grouped_mm
      // experts: layer 2's backward (43.26 with the eager loop's whole-weight zeros).
      {"deepseek-v2-lite-fsdp-autocast-8xh100.yaml", {true, std::nullopt, 42.52}},
      // Megatron-Core MoE (docs/moe-megatron.md): TP 2 + SP, EP 8, distributed optimizer.
      {"mixtral-8x7b-megatron-moe-ep8.yaml", {true, std::nullopt, 66.57}},
      {"mixtral-8x7b-megatron-swiglu-gqa-ep8.yaml", {true, std::nullopt, 68.18}},
      // ... with expert tensor parallelism 2 (Megatron's default ETP = TP): EDP 2.
      {"mixtral-8x7b-megatron-swiglu-gqa-etp2-ep8.yaml", {true, std::nullopt, 53.43}},
      // ... with Megatron's own TP 1 / PP 4 / EP 8 layout (issue #15 part 3): stage 0 of 4.
      {"mixtral-8x7b-megatron-pp4-ep8.yaml", {true, std::nullopt, 58.52}},
  };
  return table;
}

std::unique_ptr<SimulatedDevice> device_for(const DeviceConfig& d) {
  const uint64_t unlimited = 1ull << 60;
  if (d.capacity == 0) return std::make_unique<SimulatedDevice>(unlimited, d.cuda_context);
  return std::make_unique<SimulatedDevice>(d.capacity, std::min(d.cuda_context, d.capacity));
}

double gib(uint64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(GiB); }

}  // namespace

TEST_CASE("every shipped scenario gives the verdict docs/claims.md states", "[scenarios]") {
  const std::filesystem::path dir = std::filesystem::path(MEMSIM_SOURCE_DIR) / "scenarios";
  std::set<std::string> seen;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml" && entry.path().extension() != ".yml") continue;
    const std::string file = entry.path().filename().string();
    seen.insert(file);
    INFO("scenarios/" << file);
    const auto it = claims().find(file);
    if (it == claims().end()) {
      FAIL_CHECK("no claim for scenarios/" << file
                 << ": add it to docs/claims.md and to this test's table");
      continue;
    }
    const Claim& claim = it->second;
    std::optional<Program> built;
    std::string error;
    Scenario s;
    try {
      s = load_scenario(entry.path().string());
      built.emplace(build_program(s));
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (*claim.refused != '\0') {
      INFO("error: " << error);
      CHECK(error.find(claim.refused) != std::string::npos);
      continue;
    }
    if (!built) {
      FAIL_CHECK("scenarios/" << file << " failed to load or build: " << error);
      continue;
    }
    const Program& p = *built;
    auto device = device_for(s.device);
    const Timeline t = execute(p, s.allocator, *device);
    const Analysis a = analyze(p, t);
    CHECK(a.fits() == claim.fits);
    if (claim.oom_phase && a.oom) CHECK(a.oom->phase == *claim.oom_phase);
    INFO("peak allocated " << gib(a.peak_allocated) << " GiB, claimed "
                           << claim.peak_allocated_gib << " GiB");
    CHECK(std::abs(gib(a.peak_allocated) / claim.peak_allocated_gib - 1.0) < 0.02);
    CHECK(a.peak_reserved >= a.peak_allocated);
  }
  for (const auto& [file, claim] : claims()) {
    INFO("docs/claims.md lists scenarios/" << file << ", which is not in scenarios/");
    CHECK(seen.count(file) == 1);
  }
}

// GPT-3 175B on one GPU with unlimited memory: the static bytes per parameter and the
// activations per layer that docs/claims.md compares with the ZeRO paper and with
// Korthikanti et al. 2022. Built once, executed on the A100 of the file (out of memory
// while the weights are built) and on an unlimited device.
TEST_CASE("gpt3-175b: 18 B/param of state and Korthikanti's activations per layer", "[scenarios]") {
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/gpt3-175b.yaml");
  const Program p = build_program(s);

  auto a100 = device_for(s.device);
  const Analysis oom = analyze(p, execute(p, s.allocator, *a100));
  REQUIRE(oom.oom.has_value());
  CHECK(oom.oom->phase == Phase::setup);
  CHECK(oom.oom->kind == TensorKind::parameter);

  SimulatedDevice unlimited(1ull << 60, s.device.cuda_context);
  const Analysis a = analyze(p, execute(p, s.allocator, unlimited));
  REQUIRE(a.fits());
  const Breakdown& b = a.breakdown_at_peak;
  // bf16 weights: 174.6e9 parameters (96 x 12h^2 + vocab and position embeddings).
  const double params = static_cast<double>(b.parameters) / 2.0;
  CHECK(params == Approx(174.6e9).epsilon(0.005));
  // Megatron bf16: fp32 main_grad (4 B/param), fp32 master + exp_avg + exp_avg_sq (12 B).
  CHECK(static_cast<double>(b.gradients) == Approx(4.0 * params).epsilon(0.005));
  CHECK(static_cast<double>(b.optimizer_state) == Approx(12.0 * params).epsilon(0.005));
  // Korthikanti et al. 2022, sec. 4.1: s*b*h*(34 + 5*a*s/h) bytes per layer.
  const double s_ = 2048, b_ = 1, h = 12288, heads = 96;
  const double per_layer = s_ * b_ * h * (34.0 + 5.0 * heads * s_ / h);
  CHECK(static_cast<double>(b.activations) == Approx(96.0 * per_layer).epsilon(0.01));
}
