// FSDP1's FullyShardedDataParallel.clip_grad_norm_ (optimizer.max_grad_norm with
// parallel.sharding fsdp; sim/step/fsdp1_clip_grad.h, docs/clip-grad.md "FSDP1") and
// Accelerate's FSDP1 fp16 path (precision.autocast fp16 with fsdp_mixed_precision fp16 and
// ShardedGradScaler; docs/fsdp-accelerate.md "fp16"): the clip's events against the torch 1.13
// CPU run of the 2.x stand-in (tools/fixtures/gen_fsdp1_clip_fixtures.py), the CUDA staging of
// each per-gradient vector_norm by hand arithmetic on Reduce.cuh's setReduceConfig, the
// gradients' order (handles, use_orig_params), a kept norm, the scaler's unscale_ before the
// clip, the refusals by key and the shipped scenarios through the CLI.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.h"
#include "fsdp2_accelerate_test_support.h"
#include "graph/ops/cuda_reduce.h"
#include "json_test_support.h"
#include "program/program.h"
#include "real_run_test_support.h"
#include "scenario/scenario.h"
#include "scenario_error_test_support.h"
#include "sim/step/schedule.h"
#include "step_events_support.h"

using namespace memsim;

namespace {

using Sets = std::vector<std::pair<std::string, std::string>>;
using memsim_test::allocations;
using memsim_test::coarse;
using memsim_test::head;
using memsim_test::step_events;

// The fixture's model: 2-layer hf-llama, vocab 1000 x d_model 64, untied head, two ranks.
const std::string kModel =
    "model: { family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 1000,\n"
    "         tied_embeddings: false }\n"
    "batch: { micro_batch: 2, seq_len: 32 }\n"
    "precision: { params: fp32 }\n"
    "optimizer: { type: adamw, impl: foreach, max_grad_norm: 1.0 }\n"
    "step: { warmup_steps: 1 }\n"
    "parallel: { data: 2, sharding: fsdp }\n";

Program program(Sets set = {}, bool scratch = true) {
  Scenario s = load_scenario_text(kModel, "fsdp1clip.yaml", set);
  s.device.kernel_scratch = scratch;
  return build_program(s);
}

// The clip's events for gradients of `numels` elements (fp32), numbered from k0, after the
// first call (the zero scalar exists). `scratch`: CUDA's per-norm staging.
std::vector<std::string> expected(const std::vector<uint64_t>& numels, bool scratch, size_t k0 = 0,
                                  bool keep = false) {
  memsim_test::ExpectedEvents x{{}, k0};
  std::vector<size_t> norms;
  for (const uint64_t n : numels) {
    norms.push_back(x.add(4, "sum"));
    const graph::ReduceScratch s = graph::full_reduce_scratch(n);
    if (scratch && s.global_bytes != 0) {
      const size_t buffer = x.add(s.global_bytes, "sum");
      x.drop(x.add(s.semaphore_bytes, "sum"));
      x.drop(buffer);
    }
  }
  const size_t stacked = x.add(4 * numels.size(), "cat");
  for (auto it = norms.rbegin(); it != norms.rend(); ++it) x.drop(*it);
  const size_t local = x.add(4, "sum");
  x.drop(stacked);
  const size_t squared = x.add(4, "pow");
  const size_t total = x.add(4, "pow");
  x.drop(squared);
  const size_t shifted = x.add(4, "add.Scalar");
  const size_t recip = x.add(4, "reciprocal");
  const size_t coef = x.add(4, "mul");
  x.drop(recip);
  x.drop(shifted);
  const size_t clamped = x.add(4, "other");
  x.drop(local);
  x.drop(coef);
  x.drop(clamped);
  if (!keep) x.drop(total);
  return x.v;
}

// Rank 0's gradients of kModel: one flat shard per unit, or (use_orig_params) the original
// parameters with elements in rank 0's half of their unit (gen_fsdp1_clip_fixtures.py).
const std::vector<uint64_t> kFlat = {64032, 20544, 20544};
const std::vector<uint64_t> kOrig = {64000, 32, 4096, 4096, 4096, 4096, 4160, 4096, 4096, 4096, 4096, 4160};

std::string refusal(const std::string& text, const Sets& set) {
  return memsim_test::refusal_of([&] { build_program(load_scenario_text(text, "fsdp1clip.yaml", set)); });
}

}  // namespace

TEST_CASE("fsdp1 clip: Reduce.cuh's global staging of a full fp32 reduction", "[clip_grad][fsdp]") {
  // vector_norm of n elements: block 512 x 1 from 2048 elements; values_per_thread =
  // ceil(n / 512); CTAs split it from 256 values on: max(min(132 x 4, ceil(vpt / 16)),
  // ceil(vpt / 256)) CTAs, a 4-byte partial each, and one 4-byte semaphore.
  CHECK(graph::full_reduce_scratch(64000).global_bytes == 0);    // vpt 125
  CHECK(graph::full_reduce_scratch(130560).global_bytes == 0);   // vpt 255
  CHECK(graph::full_reduce_scratch(130561).global_bytes == 64);  // vpt 256: 16 CTAs
  CHECK(graph::full_reduce_scratch(130561).semaphore_bytes == 4);
  CHECK(graph::full_reduce_scratch(1 << 20).global_bytes == 512);         // vpt 2048: 128
  CHECK(graph::full_reduce_scratch(4096u * 4096u).global_bytes == 2112);  // 528 CTAs (132 SMs)
  // A 136,249,472-element shard: vpt 266,113; ceil(vpt / 256) = 1040 CTAs outnumber the
  // grid's 528 (a 4,160-B buffer: a 4,608-B small block).
  CHECK(graph::full_reduce_scratch(136249472).global_bytes == 4 * 1040);
  CHECK(graph::full_reduce_scratch(1).global_bytes == 0);
}

TEST_CASE("fsdp1 clip: per-shard norms, stack, all-reduced norm, clamp, before the optimizer",
          "[clip_grad][fsdp]") {
  for (const bool orig : {false, true}) {
    INFO("use_orig_params " << orig);
    const Sets set = {{"parallel.use_orig_params", orig ? "true" : "false"}};
    const std::vector<uint64_t>& numels = orig ? kOrig : kFlat;
    const Program on = program(set);
    const std::vector<std::string> clip = expected(numels, true);
    CHECK(head(step_events(on, "backward_end"), clip.size()) == clip);
    // The rest of the optimizer phase is the unclipped one.
    Sets off_set = set;
    off_set.emplace_back("optimizer.max_grad_norm", "0");
    const Program off = program(off_set);
    const std::vector<std::string> ev = step_events(on, "backward_end"), plain = step_events(off, "backward_end");
    CHECK(ev.size() == plain.size() + clip.size());
    // One clip per step (N + 8 allocations, no staging at these sizes) and the zero scalar.
    CHECK(allocations(on) == allocations(off) + 2 * (numels.size() + 8) + 1);
  }
}

TEST_CASE("fsdp1 clip: large shards stage their norms in global memory (CUDA only)", "[clip_grad][fsdp]") {
  // vocab 50000 x 64: the root's flat parameter is 6,400,064 elements (embedding, norm,
  // head), rank 0's shard 3,200,032.
  const Sets set = {{"model.vocab", "50000"}};
  const std::vector<uint64_t> numels = {3200032, 20544, 20544};
  const std::vector<std::string> clip = expected(numels, true);
  REQUIRE(graph::full_reduce_scratch(3200032).global_bytes == 4 * 391);  // vpt 6251: 391 CTAs
  CHECK(head(step_events(program(set), "backward_end"), clip.size()) == clip);
  // Without kernel scratch (a CPU run) the same without staging.
  const std::vector<std::string> cpu = expected(numels, false);
  CHECK(head(step_events(program(set, false), "backward_end"), cpu.size()) == cpu);
}

TEST_CASE("fsdp1 clip: matches the torch 1.13 CPU run of the 2.x stand-in", "[clip_grad][fsdp][fixture]") {
  for (const bool orig : {false, true}) {
    const std::string name = std::string("fsdp1_clip_stand_in_2x_") + (orig ? "orig_params" : "flat_params");
    INFO(name);
    const nlohmann::json fx =
        memsim_test::load_json(MEMSIM_SOURCE_DIR + "/tests/data/clip_grad/" + name + ".json");
    REQUIRE(fx.contains("events"));
    const std::vector<uint64_t> numels = fx["grad_numels"].get<std::vector<uint64_t>>();
    CHECK(numels == (orig ? kOrig : kFlat));
    const memsim_test::AllocFrees expected_events = memsim_test::fixture_alloc_frees(fx);
    REQUIRE(expected_events.size() == 2 * (numels.size() + 8) + 1);  // + the zero scalar
    // The fixture is a first call: its first event is the zero scalar (lift_fresh, 4 B,
    // kept); memsim's warm-up step made it, so the measured step starts after it.
    REQUIRE(fx["events"][0][1] == "lift_fresh");
    const std::vector<std::pair<bool, uint64_t>> tail(expected_events.begin() + 1, expected_events.end());
    const Program p = program({{"parallel.use_orig_params", orig ? "true" : "false"}}, false);
    const memsim_test::AllocFrees got = memsim_test::measured_alloc_frees(p, "backward_end", tail.size());
    CHECK(coarse(got) == coarse(tail));
  }
}

TEST_CASE("fsdp1 clip: the zero scalar is made by the first call and kept, a kept norm lives on",
          "[clip_grad][fsdp]") {
  const Program keep = program({{"optimizer.clip_keep_norm", "true"}});
  const Program drop = program();
  const std::vector<std::string> clip = expected(kFlat, true, 0, true);
  const std::vector<std::string> ev = step_events(keep, "backward_end");
  REQUIRE(ev.size() > clip.size());
  CHECK(head(ev, clip.size()) == clip);
  CHECK(ev[clip.size()] == "-4");  // the warm-up step's total norm, once the new clip returned
  const Scenario sk = load_scenario_text(kModel, "fsdp1clip.yaml", {{"optimizer.clip_keep_norm", "true"}});
  const Scenario sd = load_scenario_text(kModel, "fsdp1clip.yaml");
  const memsim_test::SimulatedPeaks pk = memsim_test::simulate_peaks(sk, keep);
  const memsim_test::SimulatedPeaks pd = memsim_test::simulate_peaks(sd, drop);
  CHECK(pk.allocated == pd.allocated + 512);
  // Against no clip at all: the zero scalar's block too (both live through the step).
  const Scenario so = load_scenario_text(kModel, "fsdp1clip.yaml", {{"optimizer.max_grad_norm", "0"}});
  const memsim_test::SimulatedPeaks po = memsim_test::simulate_peaks(so, build_program(so));
  CHECK(pk.allocated == po.allocated + 1024);
}

TEST_CASE("fsdp1 clip: refused by key where not modelled", "[clip_grad][fsdp]") {
  const std::vector<std::pair<Sets, std::string>> cases = {
      {{{"parallel.cpu_offload", "true"}}, "parallel.cpu_offload"},
      {{{"optimizer.clip_error_if_nonfinite", "true"}}, "optimizer.clip_error_if_nonfinite"},
      {{{"precision.params", "bf16"}}, "precision.params"},
      {{{"lora.rank", "8"}, {"lora.targets", "q_proj,v_proj"}, {"parallel.use_orig_params", "true"}},
       "lora.rank"},
  };
  for (const auto& [set, key] : cases) {
    INFO(key);
    const std::string why = refusal(kModel, set);
    CHECK(why.find("fsdp1clip.yaml: " + key + ": ") != std::string::npos);
  }
  // A shard of 2^31 elements or more (the reduction's 64-bit split): vocab 40,000,000 x 64
  // is 2.56e9 elements each for the embedding and head, rank 0's root shard 2.56e9.
  const std::string big = refusal(kModel, {{"model.vocab", "40000000"}, {"batch.seq_len", "1"},
                                           {"batch.micro_batch", "1"}});
  CHECK(big.find("fsdp1clip.yaml: optimizer.max_grad_norm: a sharded gradient of 2560000032 elements") !=
        std::string::npos);
}

namespace {
// Accelerate's FSDP1 path on the docs' worked model (tests/test_fsdp1_accelerate.cpp).
std::string accelerate(const std::string& dtype, const std::string& extra_precision,
                       const std::string& extra = "") {
  return memsim_test::accelerate::worked_text(
      "  autocast: " + dtype + "\n" + extra_precision,
      "  fsdp_mixed_precision: " + dtype + "\n", "  transformers: 5\n", extra, "fsdp");
}
}  // namespace

TEST_CASE("Accelerate FSDP1 fp16: ShardedGradScaler, unscale_ then FSDP's clip", "[fsdp][accelerate][grad_scaler]") {
  const std::string fp16 = accelerate("fp16", "  grad_scaler: true\n");
  const std::string bf16 = accelerate("bf16", "");
  const Program a = build_program(load_scenario_text(fp16, "fsdp1fp16.yaml"));
  const Program b = build_program(load_scenario_text(bf16, "fsdp1bf16.yaml"));
  // fp16 and bf16 have the same sizes: the fp16 run is the bf16 one plus the scaler's tensors:
  // _scale and _growth_tracker once, per step the scaled loss and its grad (the root's
  // ones_like is the scaled loss's instead of the loss's; MulBackward0's grad * _scale adds
  // one), and unscale_'s six (tests/test_grad_scaler.cpp).
  CHECK(allocations(a) == allocations(b) + 2 + 2 * (2 + 6));
  const memsim_test::SimulatedPeaks pa =
      memsim_test::simulate_peaks(load_scenario_text(fp16, "fsdp1fp16.yaml"), a);
  const memsim_test::SimulatedPeaks pb =
      memsim_test::simulate_peaks(load_scenario_text(bf16, "fsdp1bf16.yaml"), b);
  CHECK(pa.allocated > pb.allocated);
  CHECK(pa.allocated <= pb.allocated + 3 * 512);  // _scale, _growth_tracker, the scaled loss
}

TEST_CASE("Accelerate FSDP1 fp16 with Trainer's clip: unscale_, then FSDP's clip, then the step",
          "[fsdp][accelerate][grad_scaler][clip_grad]") {
  const std::string fp16 = accelerate("fp16", "  grad_scaler: true\n", "");
  Scenario s = load_scenario_text(fp16, "fsdp1fp16.yaml", {{"optimizer.max_grad_norm", "1.0"}});
  const Program p = build_program(s);
  const std::vector<std::string> ev = step_events(p, "backward_end");
  // unscale_'s 11 events (6 allocations, #0-#5; the found_inf copy #4 kept to update()).
  REQUIRE(ev.size() > 11);
  CHECK(ev[10] == "-#3");
  // The worked model (2 layers, ws 4, use_orig_params false): three fp32 shard gradients,
  // none large enough to stage (kernel_scratch is off in the worked text anyway).
  const std::vector<std::string> after(ev.begin() + 11, ev.end());
  const std::vector<std::string> clip = expected({0, 0, 0}, false, 6);
  CHECK(head(after, clip.size()) == clip);
  CHECK(ev.back() == "-#4");  // update(): the found_inf copy dies last
}

TEST_CASE("Accelerate FSDP1 fp16: refused by key where not Accelerate's", "[fsdp][accelerate][grad_scaler]") {
  auto why = [](const std::string& text) {
    return memsim_test::refusal_of([&] { build_program(load_scenario_text(text, "fsdp1fp16.yaml")); });
  };
  // fp16 without the scaler, bf16 with one: Accelerate makes it for fp16 only.
  CHECK(why(accelerate("fp16", "")).find("fsdp1fp16.yaml: precision.grad_scaler: ") != std::string::npos);
  CHECK(why(accelerate("bf16", "  grad_scaler: true\n")).find("fsdp1fp16.yaml: precision.grad_scaler: ") !=
        std::string::npos);
  // MixedPrecision fp16 without Accelerate's autocast: the loss in fp16, cast back: refused.
  const std::string mp_only = memsim_test::accelerate::worked_text(
      "  grad_scaler: true\n", "  fsdp_mixed_precision: fp16\n", "  transformers: 5\n", "", "fsdp");
  CHECK(why(mp_only).find("fsdp1fp16.yaml: parallel.fsdp_mixed_precision: ") != std::string::npos);
  // A 16-bit-loaded model under fp16: the scaler is modelled over fp32 gradients only.
  std::string loaded = accelerate("fp16", "  grad_scaler: true\n");
  loaded.replace(loaded.find("params: fp32"), 12, "params: bf16");
  CHECK(why(loaded).find("fsdp1fp16.yaml: precision.grad_scaler: modelled with fp32 parameters") !=
        std::string::npos);
}

TEST_CASE("fsdp1 clip and fp16: the shipped Trainer scenarios through the CLI", "[clip_grad][fsdp][cli]") {
  using memsim_test::memsim_command;
  using memsim_test::run_shell;
  const std::string bf16 = MEMSIM_SOURCE_DIR + "/scenarios/qwen2.5-7b-hf-trainer-fsdp1-bf16-8xh100.yaml";
  const std::string fp16 = MEMSIM_SOURCE_DIR + "/scenarios/qwen2.5-7b-hf-trainer-fsdp1-fp16-8xh100.yaml";
  const nlohmann::json on = memsim_test::run_json(bf16);
  const nlohmann::json off = memsim_test::run_json(bf16, "--set optimizer.max_grad_norm=0 --set optimizer.clip_keep_norm=false");
  // Trainer's clip keeps the zero scalar and the bound _grad_norm: two 512-B blocks at the
  // peak (the root's post-backward, where both are live).
  CHECK(on["peak_allocated_bytes"].get<uint64_t>() == off["peak_allocated_bytes"].get<uint64_t>() + 1024);
  const nlohmann::json h = memsim_test::run_json(fp16);
  CHECK(h["peak_allocated_bytes"].get<uint64_t>() > 0);
  const memsim_test::CommandResult text = run_shell(memsim_command() + "run '" + fp16 + "' 2>&1");
  CHECK(text.status == 0);
  CHECK(text.out.find("clip_grad_norm_ 1") != std::string::npos);
  CHECK(text.out.find("GradScaler") != std::string::npos);
  const memsim_test::CommandResult bad =
      run_shell(memsim_command() + "run '" + fp16 + "' --set precision.grad_scaler=false 2>&1");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("precision.grad_scaler") != std::string::npos);
  const memsim_test::CommandResult offload =
      run_shell(memsim_command() + "run '" + bf16 + "' --set parallel.cpu_offload=true 2>&1");
  CHECK(offload.status == 1);
  CHECK(offload.out.find("parallel.cpu_offload") != std::string::npos);
}
