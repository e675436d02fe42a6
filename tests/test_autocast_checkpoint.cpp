// Activation checkpointing under torch.autocast (bf16) against real PyTorch: tests/data/
// torch_cpu/checkpoint_{cs336,hf_llama,hf_gpt2,hf_llama_s128}_autocast_bf16.json, measured by
// tools/fixtures/gen_checkpoint_fixtures.py (torch 1.13 on CPU; the forward and the loss
// inside torch.autocast("cpu", bfloat16), backward outside it; every policy with
// use_reentrant False and True; no early stop, as 1.13 re-runs whole regions). The CS336
// stand-in applies CUDA autocast's rule for einsum and exp, the GPT-2 one for pow and
// softmax, where the CPU lists differ (docs/autocast.md). One step: forward, F.cross_entropy / the model's loss, backward; no
// optimizer, no warm-up. Requested bytes: before the forward, at its end, after backward,
// and the step's peak, all compared exactly.
//
// What this checks of the model (graph/checkpoint.h, graph/autocast.h): the forward of a
// checkpointed region still fills autocast's weight-cast cache (the bf16 weights stay
// alive until the region exits, saved or not), and the recompute in backward re-enters
// autocast with an empty cache, casts every weight again and clears its cache on exit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "sim/search/optimize.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/modelled_features.h"
#include "sim/step/schedule.h"
#include "step_measure_test_support.h"

using namespace memsim;

namespace {

using memsim_test::load_torch_cpu_fixture;
using memsim_test::measure_step;
using Measured = memsim_test::StepMeasure;

Scenario base_scenario(const nlohmann::json& fx) {
  Scenario s;
  s.optimizer.type = OptimizerType::none;
  s.step.warmup_steps = 0;
  s.device.cublas_workspace = 0;
  s.device.kernel_scratch = false;
  REQUIRE(fx["autocast"] == "bf16");
  REQUIRE(fx["autocast_region"] == "forward-and-loss");
  s.precision.autocast = DType::bf16;
  s.precision.autocast_region = AutocastRegion::forward_and_loss;
  return s;
}

Program build(const Scenario& s, const std::string& policy, bool reentrant, bool early_stop) {
  Scenario sp = s;
  sp.checkpoint = parse_policy(policy);
  if (reentrant) sp.checkpoint.reentrant = true;
  TrainingScript script = default_script(sp);
  script.loss = LossImpl::torch;
  script.checkpoint_early_stop = early_stop;
  return build_program(sp, script);
}

void check_fixture(const nlohmann::json& fx, const Scenario& s) {
  std::printf("\n| %s bf16 autocast policy | forward end real | predicted | after backward real | predicted | step peak real | predicted |\n",
              to_string(s.model.family));
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  uint64_t none_forward_end = 0;
  for (const nlohmann::json& row : fx["policies"]) {
    const bool reentrant = row.value("reentrant", false);
    const std::string policy = row["policy"];
    const std::string label = policy + (reentrant ? " (reentrant)" : "");
    INFO(to_string(s.model.family) << " autocast policy " << label);
    const Program program = build(s, policy, reentrant, fx["early_stop"]);
    const Measured m = measure_step(program);
    std::printf("| %s | %llu | %llu | %llu | %llu | %llu | %llu |\n", label.c_str(),
                static_cast<unsigned long long>(row["live_at_forward_end"].get<uint64_t>()),
                static_cast<unsigned long long>(m.forward_end),
                static_cast<unsigned long long>(row["after_backward"].get<uint64_t>()),
                static_cast<unsigned long long>(m.after_backward),
                static_cast<unsigned long long>(row["step_peak"].get<uint64_t>()),
                static_cast<unsigned long long>(m.peak));
    CHECK(m.before_forward == row["before_forward"].get<uint64_t>());
    CHECK(m.forward_end == row["live_at_forward_end"].get<uint64_t>());
    // Exact, the reentrant rows included: their node's ctx.inputs keeps the (cos, sin) tuple
    // (fp32: the rotary embedding runs with autocast disabled) while the graph lives.
    CHECK(m.after_backward == row["after_backward"].get<uint64_t>());
    CHECK(m.peak == row["step_peak"].get<uint64_t>());
    if (policy == "none") {
      none_forward_end = m.forward_end;
      CHECK(program.flops.recompute == 0);
    } else {
      CHECK(program.flops.recompute > 0);
      CHECK(m.forward_end < none_forward_end);  // (the peak may rise: uniform:2 of 2 layers)
    }
  }
}

}  // namespace

TEST_CASE("autocast + checkpointing matches PyTorch 1.13 on CPU (CS336 model, 4 layers)",
          "[autocast][checkpoint]") {
  const nlohmann::json fx = load_torch_cpu_fixture("checkpoint_cs336_autocast_bf16.json");
  const nlohmann::json& c = fx["config"];
  Scenario s = base_scenario(fx);
  memsim_test::apply_cs336_fixture_config(s, c);
  check_fixture(fx, s);
}

TEST_CASE("autocast + checkpointing matches PyTorch 1.13 on CPU (HF LLaMA and GPT-2 stand-ins, 4 layers)",
          "[autocast][checkpoint][hf]") {
  for (const char* file :
       {"checkpoint_hf_llama_autocast_bf16.json", "checkpoint_hf_gpt2_autocast_bf16.json",
        "checkpoint_hf_llama_s128_autocast_bf16.json"}) {
    const nlohmann::json fx = load_torch_cpu_fixture(file);
    const nlohmann::json& c = fx["config"];
    const std::string family = fx["family"];
    Scenario s = base_scenario(fx);
    memsim_test::apply_hf_fixture_config(s, family, c);
    check_fixture(fx, s);
  }
}

TEST_CASE("memsim optimize plans checkpointing for autocast scenarios", "[autocast][checkpoint][optimize]") {
  for (const char* family : {"cs336", "hf-llama"}) {
    INFO(family);
    const Scenario s = load_scenario_text(
        std::string("model: {family: ") + family +
            ", layers: 4, d_model: 128, heads: 4, kv_heads: 2, d_ff: 344, vocab: 512, "
            "attention: eager}\n"
            "batch: {micro_batch: 2, seq_len: 128}\n"
            "precision: {autocast: bf16}\n"
            "optimizer: {type: adamw, impl: foreach}\n"
            "device: {capacity: 4GiB}\n",
        "ac.yaml");
    const TrainingScript script = default_script(s);
    graph::CheckpointPlan keep, all;
    keep.layers.assign(4, graph::LayerCheckpoint::keep);
    all.layers.assign(4, graph::LayerCheckpoint::layer);
    const uint64_t hi = simulate_plan(s, script, keep, 0).analysis.peak_reserved;
    const uint64_t lo = simulate_plan(s, script, all, 0).analysis.peak_reserved;
    REQUIRE(lo < hi);  // checkpointing under autocast lowers the peak
    const uint64_t budget = lo + (hi - lo) / 2;
    const OptimizeResult r = optimize_checkpointing(s, script, budget);
    CHECK(r.fits);
    CHECK(r.plan.any());
    CHECK(r.run.analysis.peak_reserved <= budget);
    CHECK(r.run.analysis.flops.recompute > 0);
  }
}

TEST_CASE("hf-gpt2 under fp16 autocast: softmax reads fp16 directly (half_to_float)", "[autocast][hf]") {
  // GPT-2's F.softmax gets dtype=float32 under autocast. For bf16 scores ATen converts
  // first (an fp32 copy of the (B,H,S,S) scores, freed at once) and the grad comes back
  // through the conversion's ToCopyBackward0; for fp16 the CUDA kernel reads fp16 and
  // writes fp32 (half_to_float). Same forward end, a lower or equal peak, fewer events.
  auto run = [](const char* dtype) {
    const Scenario s = load_scenario_text(
        std::string("model: {family: hf-gpt2, layers: 2, d_model: 64, heads: 4, d_ff: 256, "
                    "vocab: 64, context_length: 128, attention: eager}\n"
                    "batch: {micro_batch: 2, seq_len: 96}\n"
                    "precision: {autocast: ") + dtype + "}\n"
            "optimizer: {type: sgd}\n"
            "device: {capacity: 1GiB, cublas_workspace: 0, kernel_scratch: false}\n",
        "gpt2.yaml");
    const Program p = build_program(s);
    return std::make_pair(measure_step(p), p.events.size());
  };
  const auto [bf16, bf16_events] = run("bf16");
  const auto [fp16, fp16_events] = run("fp16");
  CHECK(fp16.forward_end == bf16.forward_end);
  CHECK(fp16.after_backward == bf16.after_backward);
  CHECK(fp16.peak <= bf16.peak);
  // Per layer and step: the forward's conversion (alloc + free) and its backward cast.
  CHECK(fp16_events < bf16_events);
}

TEST_CASE("reentrant recompute caches the casts of its detached inputs", "[autocast][checkpoint][hf]") {
  // CheckpointFunction.backward re-runs the region on detach_variable(inputs): leaves that
  // require grad, which cached_cast caches like weights. HF LLaMA's selective core casts
  // its fp32 q input; matmul saves a reshaped copy of that cast, so the cast itself dies
  // with the matmul in the forward and in a non-reentrant re-run, but a reentrant re-run
  // keeps it in the cache until the re-run's autocast context exits (measured on torch
  // 1.13 CPU: three (B,H,S,hd) bf16 storages alive after the matmul instead of two).
  auto q_cast_outlives_softmax = [](bool reentrant) {
    Scenario s = load_scenario_text(
        "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, kv_heads: 2, d_ff: 172, "
        "vocab: 64, context_length: 128, attention: eager}\n"
        "batch: {micro_batch: 2, seq_len: 128}\n"
        "precision: {autocast: bf16}\n"
        "optimizer: {type: none}\n"
        "checkpoint: {policy: selective}\n"
        "device: {capacity: 1GiB, cublas_workspace: 0, kernel_scratch: false}\n",
        "llama.yaml");
    s.checkpoint.reentrant = reentrant;
    const Program p = build_program(s);
    const uint64_t q_cast = 2ull * 4 * 128 * 16 * 2;
    int64_t q_tensor = -1;
    bool softmax_seen = false;
    for (const MemoryEvent& e : p.events) {
      if (e.phase != Phase::backward) continue;  // the re-run emits forward op names here
      const std::string& op = p.str(e.op);
      if (e.type == EventType::alloc && q_tensor < 0 && op == "_to_copy" && e.bytes == q_cast)
        q_tensor = e.tensor;
      if (e.type == EventType::alloc && q_tensor >= 0 && op == "_softmax") softmax_seen = true;
      if (e.type == EventType::free && static_cast<int64_t>(e.tensor) == q_tensor) return softmax_seen;
    }
    FAIL("the recomputed q cast was not found");
    return false;
  };
  CHECK_FALSE(q_cast_outlives_softmax(false));
  CHECK(q_cast_outlives_softmax(true));
}
