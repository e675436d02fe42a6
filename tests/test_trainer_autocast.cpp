// HF Trainer's default mixed precision (Trainer(bf16=True): fp32 weights, forward and loss
// under torch.autocast(bfloat16)) with SDPA attention, with Qwen2's q/k/v biases and with
// Mistral's per-layer rotary tables and sliding mask,
// against the CPU stand-ins of tools/fixtures/gen_trainer_autocast_fixtures.py
// (tests/data/torch_cpu_arch/trainer_autocast_*.json; torch 1.13, 4 layers, d_model 64, 4
// heads, 2 KV heads, 2 x 32 tokens): every checkpoint policy, with use_reentrant False and
// True (HF's gradient_checkpointing_enable() default). The linear-with-bias casts and their
// cache are CPU autocast's own (its rule equals CUDA's for linear); the SDPA casts are
// CUDA's lower-precision rule applied by the stand-in around a kernel Function that
// allocates what memsim's fused-kernel model does (graph/ops/ops_nn.h sdpa_flash). Live
// bytes before the forward, at its end, after backward and the step's peak: exact (the
// reentrant node's ctx.inputs keeps the (cos, sin) tuple after backward: graph/checkpoint.h).
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "scenario/scenario_checkpoint.h"
#include "sim/step/schedule.h"
#include "decoder_arch_test_support.h"
#include "step_measure_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

nlohmann::json load_arch_fixture(const std::string& file) {
  std::ifstream in(std::string(MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_arch/") + file);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// The fixture's step: no optimizer, no warm-up, no cuBLAS workspaces (a CPU run), bf16
// autocast around forward and loss.
Scenario fixture_scenario(const nlohmann::json& c) {
  Scenario s;
  s.optimizer.type = OptimizerType::none;
  s.step.warmup_steps = 0;
  s.device.cublas_workspace = 0;
  s.device.kernel_scratch = false;
  memsim_test::apply_hf_fixture_config(s, "hf-llama", c);
  s.model.arch = memsim_test::arch_for(c);
  s.model.attention = c["attention"] == "flash" ? AttentionImpl::flash : AttentionImpl::eager;
  s.precision.autocast = DType::bf16;
  return s;
}

void check_rows(const nlohmann::json& fx) {
  const nlohmann::json& c = fx["config"];
  const Scenario s = fixture_scenario(c);
  std::printf("\n| %s %s: policy | forward end (real = memsim) | step peak real | memsim |\n",
              c["arch"]["architecture"].get<std::string>().c_str(),
              c["attention"].get<std::string>().c_str());
  std::printf("|---|---:|---:|---:|\n");
  for (const nlohmann::json& row : fx["policies"]) {
    const bool reentrant = row["reentrant"];
    const std::string policy = row["policy"];
    INFO(c["arch"]["architecture"] << " " << c["attention"] << " policy " << policy
                                   << (reentrant ? " reentrant" : ""));
    Scenario sp = s;
    sp.checkpoint = parse_policy(policy);
    if (reentrant) sp.checkpoint.reentrant = true;
    TrainingScript script = default_script(sp);
    script.checkpoint_early_stop = fx["early_stop"];
    const memsim_test::StepMeasure m = memsim_test::measure_step(build_program(sp, script));
    std::printf("| %s%s | %llu | %llu | %llu |\n", policy.c_str(), reentrant ? ", reentrant" : "",
                static_cast<unsigned long long>(m.forward_end),
                static_cast<unsigned long long>(row["step_peak"].get<uint64_t>()),
                static_cast<unsigned long long>(m.peak));
    CHECK(m.before_forward == row["before_forward"].get<uint64_t>());
    CHECK(m.forward_end == row["live_at_forward_end"].get<uint64_t>());
    CHECK(m.peak == row["step_peak"].get<uint64_t>());
    // Exact: a reentrant node keeps the (cos, sin) tuple in ctx.inputs (modelled,
    // graph/checkpoint.h); per-layer rotary (Mistral) passes none through the call.
    CHECK(m.after_backward == row["after_backward"].get<uint64_t>());
  }
}

}  // namespace

TEST_CASE("trainer autocast: Llama with SDPA under bf16 autocast matches the stand-in",
          "[trainer-autocast]") {
  check_rows(load_arch_fixture("trainer_autocast_llama_sdpa.json"));
}

TEST_CASE("trainer autocast: Qwen2 (q/k/v biases) under bf16 autocast, SDPA and eager",
          "[trainer-autocast]") {
  check_rows(load_arch_fixture("trainer_autocast_qwen2_sdpa.json"));
  check_rows(load_arch_fixture("trainer_autocast_qwen2_eager.json"));
}

TEST_CASE("trainer autocast: Mistral (per-layer rotary cast to bf16, sliding mask) under bf16 autocast",
          "[trainer-autocast]") {
  // v4.45 MistralRotaryEmbedding returns cos/sin `.to(x.dtype)` with x = value_states (bf16
  // under autocast): RoPE runs in bf16, q/k stay bf16, matmul casts nothing, and
  // `softmax(dtype=float32).to(query.dtype)` casts the probabilities back to bf16.
  check_rows(load_arch_fixture("trainer_autocast_mistral_eager.json"));
}

TEST_CASE("trainer autocast: Phi-3 (fused qkv / gate_up, in-place mask add) under bf16 autocast",
          "[trainer-autocast]") {
  // v4.45 Phi3Attention: slices of the bf16 qkv_proj output; `attn_weights += causal_mask`
  // is in place, so the scores stay bf16 and softmax(dtype=float32) makes its own fp32
  // copy of them; `.to(value_states.dtype)` casts the probabilities back.
  check_rows(load_arch_fixture("trainer_autocast_phi3_eager.json"));
}

TEST_CASE("trainer autocast: SDPA under autocast saves low-precision q/k/v casts", "[trainer-autocast]") {
  // The fused kernel's saved q/k/v are the bf16 casts: the SDPA rows hold, per layer and
  // at the forward's end, less than the fp32-params eager rows and more than nothing.
  const nlohmann::json sdpa = load_arch_fixture("trainer_autocast_qwen2_sdpa.json");
  const nlohmann::json eager = load_arch_fixture("trainer_autocast_qwen2_eager.json");
  Scenario s = fixture_scenario(sdpa["config"]);
  const memsim_test::StepMeasure with_sdpa = memsim_test::measure_step(build_program(s));
  s.model.attention = AttentionImpl::eager;
  const memsim_test::StepMeasure with_eager = memsim_test::measure_step(build_program(s));
  CHECK(with_sdpa.forward_end < with_eager.forward_end);
  CHECK(with_eager.forward_end == eager["policies"][0]["live_at_forward_end"].get<uint64_t>());
}
