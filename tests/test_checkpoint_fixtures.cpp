// memsim's checkpointing against real PyTorch, per family: tests/data/torch_cpu/
// checkpoint_{cs336,hf_gpt2,hf_llama}.json, measured by
// tools/fixtures/gen_checkpoint_fixtures.py (torch 1.13 on CPU, fp32, plain-torch stand-ins
// of the CS336 staff model and of Hugging Face GPT2LMHeadModel / LlamaForCausalLM,
// torch.utils.checkpoint(use_reentrant=False), which in 1.13 re-runs a whole region: no
// early stop, so the engine runs in that mode). One step: forward (policy applied), the
// model's loss, backward; no optimizer, no warm-up. Requested bytes: live before the
// forward, at its end, after backward, and the step's peak.
//
// The fixtures are written so that torch 1.13 shows PyTorch 2.x's memory (RMSNorm's mean
// through a stand-in whose backward saves only sizes, as 2.x's MeanBackward1; the float
// scale divisions through a Function that saves nothing, as 2.x's wrapped numbers on the
// CPU): no version correction remains on this side, every number is compared as is.
// The HF rows are measured with use_reentrant=False and again with use_reentrant=True
// (Hugging Face's default; memsim checkpoint.reentrant: true, the mode Megatron's own
// CheckpointFunction has): forward end, after backward and step peak exact in both (the
// reentrant node's ctx.inputs keeps the (cos, sin) tuple until the graph dies).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "sim/step/checkpoint_policy.h"
#include "sim/step/schedule.h"
#include "decoder_arch_test_support.h"
#include "step_measure_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

using memsim_test::load_torch_cpu_fixture;
using memsim_test::measure_step;
using Measured = memsim_test::StepMeasure;

// The fixture's step: no optimizer, no warm-up, no cuBLAS workspaces (a CPU run).
Scenario base_scenario() {
  Scenario s;
  s.optimizer.type = OptimizerType::none;
  s.step.warmup_steps = 0;
  s.device.cublas_workspace = 0;
  s.device.kernel_scratch = false;
  return s;
}

// Every policy row of a fixture against the same scenario with that policy.
void check_fixture(const nlohmann::json& fx, const Scenario& s) {
  std::printf("\n| %s policy | forward end real | predicted | step peak real | predicted | error | recompute share |\n",
              to_string(s.model.family));
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  uint64_t none_forward_end = 0;
  for (const nlohmann::json& row : fx["policies"]) {
    const bool reentrant = row.value("reentrant", false);
    const std::string policy = row["policy"];
    const std::string label = policy + (reentrant ? " (reentrant)" : "");
    INFO(to_string(s.model.family) << " policy " << label);
    Scenario sp = s;
    sp.checkpoint = parse_policy(policy);
    if (reentrant) sp.checkpoint.reentrant = true;
    TrainingScript script = default_script(sp);
    script.loss = LossImpl::torch;
    script.checkpoint_early_stop = fx["early_stop"];
    const Program program = build_program(sp, script);
    const Measured m = measure_step(program);
    const uint64_t real_fwd_end = row["live_at_forward_end"];
    const uint64_t real_peak = row["step_peak"];
    const double err = static_cast<double>(m.peak) / static_cast<double>(real_peak) - 1.0;
    const double share = program.flops.recompute /
                         (program.flops.forward + program.flops.backward + program.flops.recompute);
    std::printf("| %s | %llu | %llu | %llu | %llu | %+.3f%% | %.1f%% |\n", label.c_str(),
                static_cast<unsigned long long>(real_fwd_end),
                static_cast<unsigned long long>(m.forward_end),
                static_cast<unsigned long long>(real_peak), static_cast<unsigned long long>(m.peak),
                100 * err, 100 * share);
    CHECK(m.before_forward == row["before_forward"].get<uint64_t>());
    CHECK(m.forward_end == real_fwd_end);  // issue #4: exact
    // Exact in both modes: a reentrant checkpoint's node keeps HF LLaMA's position_embeddings
    // tuple (cos, sin) in ctx.inputs after backward, while the graph lives (graph/checkpoint.h).
    CHECK(m.after_backward == row["after_backward"].get<uint64_t>());
    CHECK(std::abs(err) < 0.02);           // issue #4: within 2%
    if (policy == "none") {
      none_forward_end = m.forward_end;
      CHECK(program.flops.recompute == 0);
    } else {
      CHECK(m.forward_end < none_forward_end);  // the policy dropped saved activations
      CHECK(program.flops.recompute > 0);        // and pays for them in backward
    }
  }
}

}  // namespace

TEST_CASE("checkpointing matches PyTorch 1.13 on CPU (CS336 model, 4 layers)", "[checkpoint]") {
  const nlohmann::json fx = load_torch_cpu_fixture("checkpoint_cs336.json");
  const nlohmann::json& c = fx["config"];
  Scenario s = base_scenario();
  memsim_test::apply_cs336_fixture_config(s, c);
  check_fixture(fx, s);
}

TEST_CASE("checkpointing matches PyTorch 1.13 on CPU (HF GPT-2 and LLaMA stand-ins, 4 layers)",
          "[checkpoint][hf]") {
  for (const char* file : {"checkpoint_hf_gpt2.json", "checkpoint_hf_llama.json"}) {
    const nlohmann::json fx = load_torch_cpu_fixture(file);
    const nlohmann::json& c = fx["config"];
    const std::string family = fx["family"];
    Scenario s = base_scenario();
    memsim_test::apply_hf_fixture_config(s, family, c);
    check_fixture(fx, s);
  }
}

// The decoder-architecture stand-ins (tests/data/torch_cpu_arch): Gemma-2 (sandwich norms,
// soft-capping, per-layer rotary and sliding masks, which `full` recomputes) and Qwen3
// (q/k norms, v4.51's attention function, which is `selective`'s region), every policy,
// non-reentrant and reentrant. One row is not exact: Qwen3 `selective` with reentrant
// checkpointing peaks 32 KiB (1.0%) below torch (one (B,H,S,S) or (B,H,S,hd) tensor that
// the re-run of v4.51's attention function keeps and memsim does not; not found yet).
TEST_CASE("checkpointing matches PyTorch 1.13 on CPU (Gemma-2 and Qwen3 stand-ins, 4 layers)",
          "[checkpoint][hf][arch]") {
  for (const char* file : {"checkpoint_gemma2.json", "checkpoint_qwen3.json"}) {
    std::ifstream in(std::string(MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_arch/") + file);
    REQUIRE(in.good());
    const nlohmann::json fx = nlohmann::json::parse(in);
    const nlohmann::json& c = fx["config"];
    Scenario s = base_scenario();
    memsim_test::apply_hf_fixture_config(s, "hf-llama", c);
    s.model.arch = memsim_test::arch_for(c);
    check_fixture(fx, s);
  }
}
