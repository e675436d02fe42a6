// optimizer.max_grad_norm (sim/step/clip_grad.h; docs/clip-grad.md): the tensors
// torch.nn.utils.clip_grad_norm_ allocates between backward and optimizer.step, checked by
// hand arithmetic against torch/nn/utils/clip_grad.py and ForeachReduceOp.cu (torch 1.13,
// the CPU build here, has no foreach path and computes the CPU slow path's norms, so the
// CUDA workspaces are checked against the source): the events and their order, the
// workspace's size (N x chunks x 4 B), dtypes, error_if_nonfinite, a kept total norm, the
// placement after the GradScaler's unscale_, gradient accumulation, DDP, the CLI, and the
// refusals by key.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.h"
#include "json_test_support.h"
#include "program/program.h"
#include "real_run_test_support.h"
#include "scenario/scenario.h"
#include "scenario_error_test_support.h"
#include "sim/step/schedule.h"
#include "clip_grad_test_support.h"
#include "step_events_support.h"

using namespace memsim;

namespace {

using Sets = std::vector<std::pair<std::string, std::string>>;
using memsim_test::allocations;
using memsim_test::coarse;
using memsim_test::head;
using memsim_test::step_events;

// fp32 weights, foreach AdamW, one warm-up step; vocab 1000 x d_model 64 = 64,000 elements
// in the largest grad (one 65,536-element chunk).
const std::string kLlama =
    "model: { family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 1000,\n"
    "         tied_embeddings: false }\n"
    "batch: { micro_batch: 2, seq_len: 32 }\n"
    "precision: { params: fp32 }\n"
    "optimizer: { type: adamw, impl: foreach }\n"
    "step: { warmup_steps: 1 }\n";

Scenario scenario(const std::string& norm, Sets set = {}) {
  if (!norm.empty()) set.insert(set.begin(), {"optimizer.max_grad_norm", norm});
  return load_scenario_text(kLlama, "clip.yaml", set);
}

size_t parameters(const Program& p) {
  size_t n = 0;
  for (const TensorInfo& t : p.tensors) n += t.kind == TensorKind::parameter;
  return n;
}

// clip_grad_norm_'s events for one dtype group of n grads (norms of `e` bytes), its
// workspace `ws` bytes (0: the CPU path, no workspaces), numbered from #k0.
std::vector<std::string> expected_clip(size_t n, uint64_t e, uint64_t ws, size_t k0 = 0,
                                       bool nonfinite = false, bool keep = false) {
  memsim_test::ExpectedEvents x{{}, k0};
  size_t per_tensor = 0, global_output = 0, global_norm = 0;
  if (ws != 0) {
    per_tensor = x.add(ws, "zeros");
    global_output = x.add(1280, "zeros");
  }
  std::vector<size_t> norms;
  for (size_t i = 0; i < n; ++i) norms.push_back(x.add(e, "sum"));
  if (ws != 0) {
    global_norm = x.add(e, "sum");
    x.drop(global_output);
    x.drop(per_tensor);
    x.drop(global_norm);
  }
  const size_t stacked = x.add(n * e, "cat");
  const size_t total = x.add(e, "sum");
  x.drop(stacked);
  memsim_test::expect_clip_after_total(x, norms, total, e, nonfinite, keep);
  return x.v;
}

}  // namespace

TEST_CASE("clip_grad: the default, null and 0 are the unclipped step", "[clip_grad]") {
  const Program none = build_program(load_scenario_text(kLlama, "clip.yaml"));
  for (const char* off : {"0", "null", "none"}) {
    INFO(off);
    const Program p = build_program(scenario(off));
    REQUIRE(p.events.size() == none.events.size());
    CHECK(allocations(p) == allocations(none));
  }
}

TEST_CASE("clip_grad: _foreach_norm, stack, norm, clamp, in order before the optimizer", "[clip_grad]") {
  const Program off = build_program(scenario(""));
  const Program on = build_program(scenario("1.0"));
  const size_t n = parameters(on);
  REQUIRE(n == 1 + 2 * 9 + 2);  // embedding, 2 x (q k v o gate up down + 2 norms), norm, head
  // output_per_tensor = zeros(N x 1 chunk) fp32: 84 B.
  const std::vector<std::string> clip = expected_clip(n, 4, n * 1 * 4);
  const std::vector<std::string> ev = step_events(on, "backward_end", "optimizer_end");
  CHECK(head(ev, clip.size()) == clip);
  // After it, foreach AdamW's step as without clipping (the same events, numbered on).
  const std::vector<std::string> rest(ev.begin() + static_cast<std::ptrdiff_t>(clip.size()), ev.end());
  const std::vector<std::string> plain = step_events(off, "backward_end", "optimizer_end");
  REQUIRE(rest.size() == plain.size());
  // One clip per step: warm-up and measured.
  CHECK(allocations(on) == allocations(off) + 2 * (n + 9));
}

TEST_CASE("clip_grad: the workspace counts 65,536-element chunks of the largest grad", "[clip_grad]") {
  // vocab 5000 x 64 = 320,000 elements: 5 chunks; the workspace is N x 5 x 4 B.
  const Program on = build_program(scenario("1.0", {{"model.vocab", "5000"}}));
  const size_t n = parameters(on);
  const std::vector<std::string> ev = step_events(on, "backward_end", "optimizer_end");
  REQUIRE(!ev.empty());
  CHECK(ev.front() == "+" + std::to_string(n * 5 * 4) + " zeros #0");
  CHECK(head(ev, expected_clip(n, 4, n * 20).size()) == expected_clip(n, 4, n * 20));
}

TEST_CASE("clip_grad: bf16 grads: 2-byte norms, fp32 (opmath) workspaces", "[clip_grad]") {
  const Program on = build_program(scenario("1.0", {{"precision.params", "bf16"}}));
  const size_t n = parameters(on);
  const std::vector<std::string> clip = expected_clip(n, 2, n * 4);
  CHECK(head(step_events(on, "backward_end", "optimizer_end"), clip.size()) == clip);
}

TEST_CASE("clip_grad: error_if_nonfinite's isnan / isinf / logical_or", "[clip_grad]") {
  const Program on = build_program(scenario("1.0", {{"optimizer.clip_error_if_nonfinite", "true"}}));
  const size_t n = parameters(on);
  const std::vector<std::string> clip = expected_clip(n, 4, n * 4, 0, true);
  CHECK(head(step_events(on, "backward_end", "optimizer_end"), clip.size()) == clip);
}

TEST_CASE("clip_grad: without kernel scratch (CPU) the norms are per tensor, no workspaces", "[clip_grad]") {
  Scenario s = scenario("1.0");
  s.device.kernel_scratch = false;
  const Program on = build_program(s);
  const size_t n = parameters(on);
  const std::vector<std::string> clip = expected_clip(n, 4, 0);
  CHECK(head(step_events(on, "backward_end", "optimizer_end"), clip.size()) == clip);
}

TEST_CASE("clip_grad: a kept total norm lives until the next step's clip returns", "[clip_grad]") {
  const Scenario skeep = scenario("1.0", {{"optimizer.clip_keep_norm", "true"}});
  const Scenario sdrop = scenario("1.0");
  const Program keep = build_program(skeep), drop = build_program(sdrop);
  const size_t n = parameters(keep);
  const std::vector<std::string> ev = step_events(keep, "backward_end", "optimizer_end");
  const std::vector<std::string> clip = expected_clip(n, 4, n * 4, 0, false, true);
  REQUIRE(ev.size() > clip.size());
  CHECK(head(ev, clip.size()) == clip);
  // The warm-up step's total norm (4 B, older than the span) dies right after the new clip.
  CHECK(ev[clip.size()] == "-4");
  // One 512-B block more at forward_end and optimizer_end (the measured step's norm).
  const memsim_test::SimulatedPeaks pk = memsim_test::simulate_peaks(skeep, keep);
  const memsim_test::SimulatedPeaks pd = memsim_test::simulate_peaks(sdrop, drop);
  CHECK(pk.allocated == pd.allocated + 512);
}

TEST_CASE("clip_grad: once per optimizer step under gradient accumulation, with DDP", "[clip_grad]") {
  const Sets accum = {{"batch.grad_accum", "3"}};
  const Program on = build_program(scenario("1.0", accum));
  const size_t n = parameters(on);
  CHECK(allocations(on) == allocations(build_program(scenario("", accum))) + 2 * (n + 9));
  const Sets ddp = {{"parallel.data", "2"}};
  const Program d = build_program(scenario("1.0", ddp));
  CHECK(allocations(d) == allocations(build_program(scenario("", ddp))) + 2 * (n + 9));
  const std::vector<std::string> clip = expected_clip(n, 4, n * 4);
  CHECK(head(step_events(d, "backward_end", "optimizer_end"), clip.size()) == clip);
}

TEST_CASE("clip_grad: after the GradScaler's unscale_", "[clip_grad][grad_scaler]") {
  const Sets amp = {{"precision.autocast", "fp16"}, {"precision.grad_scaler", "true"}};
  const Program on = build_program(scenario("1.0", amp));
  const size_t n = parameters(on);
  const std::vector<std::string> ev = step_events(on, "backward_end", "optimizer_end");
  // unscale_'s 11 events (tests/test_grad_scaler.cpp: 6 allocations, #0-#5), then the clip.
  REQUIRE(ev.size() > 11);
  CHECK(ev[10] == "-#3");
  const std::vector<std::string> clip = expected_clip(n, 4, n * 4, 6);
  const std::vector<std::string> after(ev.begin() + 11, ev.end());
  CHECK(head(after, clip.size()) == clip);
  // update(): the found_inf copy (#4) still dies last.
  CHECK(ev.back() == "-#4");
}

TEST_CASE("clip_grad: refused by key where not modelled", "[clip_grad]") {
  auto refusal = [](const Sets& set) {
    return memsim_test::refusal_of([&] { build_program(scenario("1.0", set)); });
  };
  // FSDP1 is modelled (FullyShardedDataParallel.clip_grad_norm_: tests/test_fsdp1_clip.cpp).
  for (const Sets& set : std::vector<Sets>{
           {{"parallel.data", "2"}, {"parallel.zero", "1"}},
           {{"step.kind", "forward-backward"}},
           {{"optimizer.type", "none"}},
           {{"precision.params", "bf16"}, {"precision.master_weights", "true"}},
           {{"optimizer.impl", "fused"}, {"precision.autocast", "fp16"}, {"precision.grad_scaler", "true"}},
       }) {
    INFO(set.front().first << ": " << set.front().second);
    const std::string why = refusal(set);
    CHECK(why.find("clip.yaml: optimizer.max_grad_norm: ") != std::string::npos);
  }
  CHECK(refusal({{"optimizer.clip_foreach", "false"}}).find("clip.yaml: optimizer.clip_foreach: ") !=
        std::string::npos);
  // Bad values name the key.
  for (const Sets& set : std::vector<Sets>{{{"optimizer.max_grad_norm", "-1"}},
                                           {{"optimizer.max_grad_norm", "big"}}}) {
    const std::string bad = memsim_test::scenario_error(kLlama, "clip.yaml", set);
    CHECK(bad.find("optimizer.max_grad_norm") != std::string::npos);
  }
  const std::string orphan =
      memsim_test::scenario_error(kLlama, "clip.yaml", {{"optimizer.clip_keep_norm", "true"}});
  CHECK(orphan.find("optimizer.clip_keep_norm") != std::string::npos);
  CHECK(orphan.find("max_grad_norm is not set") != std::string::npos);
}

TEST_CASE("clip_grad: end to end through the CLI (the GradScaler GPU run's clip scenario)", "[clip_grad][cli]") {
  using memsim_test::memsim_command;
  using memsim_test::run_shell;
  const std::string file = MEMSIM_SOURCE_DIR + "/tests/data/gpu/gscaler/gs_llama_l4_d1024_s1024_b4_fp16_scaler_clip.yaml";
  const nlohmann::json on = memsim_test::run_json(file);
  const nlohmann::json off = memsim_test::run_json(file, "--set optimizer.max_grad_norm=0");
  // 4 layers: 1 + 4 x 9 + 2 = 39 grads; the largest, the 32000 x 1024 embedding / head,
  // has 500 chunks: a 78,000-B workspace (a small-pool request), transient, in the
  // optimizer phase; the measured step's peak is backward's, so clipping moves no peak,
  // only the allocation count (39 + 9 per step, 2 steps).
  CHECK(on["peak_allocated_bytes"].get<uint64_t>() == off["peak_allocated_bytes"].get<uint64_t>());
  CHECK(on["memory_stats"]["allocation.all.allocated"].get<uint64_t>() ==
        off["memory_stats"]["allocation.all.allocated"].get<uint64_t>() + 2 * (39 + 9));
  const memsim_test::CommandResult text = run_shell(memsim_command() + "run '" + file + "' 2>&1");
  CHECK(text.status == 0);
  CHECK(text.out.find("clip_grad_norm_ 1") != std::string::npos);
  const memsim_test::CommandResult bad =
      run_shell(memsim_command() + "run '" + file + "' --set optimizer.max_grad_norm=-2 2>&1");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("optimizer.max_grad_norm") != std::string::npos);
  const memsim_test::CommandResult refused = run_shell(
      memsim_command() + "run '" + file + "' --set optimizer.clip_foreach=false 2>&1");
  CHECK(refused.status == 1);
  CHECK(refused.out.find("optimizer.clip_foreach") != std::string::npos);
}

TEST_CASE("clip_grad: memsim's CPU path matches the torch 1.13 run of the 2.x stand-in", "[clip_grad][fixture]") {
  for (const char* dtype : {"fp32", "bf16"}) {
    for (const bool nonfinite : {false, true}) {
      const std::string name = std::string("clip_stand_in_2x_") + dtype + (nonfinite ? "_nonfinite" : "");
      INFO(name);
      const nlohmann::json fx = memsim_test::load_json(MEMSIM_SOURCE_DIR + "/tests/data/clip_grad/" + name + ".json");
      REQUIRE(fx.contains("events"));
      const memsim_test::AllocFrees expected = memsim_test::fixture_alloc_frees(fx);
      REQUIRE(expected.size() > 40);
      Sets set = {{"precision.params", dtype}};
      if (nonfinite) set.emplace_back("optimizer.clip_error_if_nonfinite", "true");
      Scenario s = scenario("1.0", set);
      s.device.kernel_scratch = false;
      const Program p = build_program(s);
      REQUIRE(parameters(p) == fx["grads"].get<size_t>());
      // memsim's optimizer phase from backward_end: the clip's events come first.
      const memsim_test::AllocFrees got = memsim_test::measured_alloc_frees(p, "backward_end", expected.size());
      CHECK(coarse(got) == coarse(expected));
    }
  }
  // torch 1.13's own clip_grad_norm_ differs in one place: its per-grad norms are a
  // temporary list inside the stack expression, so they die before the total norm exists.
  const nlohmann::json old = memsim_test::load_json(MEMSIM_SOURCE_DIR + "/tests/data/clip_grad/clip_torch113_fp32.json");
  const std::vector<std::string> c = coarse(memsim_test::fixture_alloc_frees(old));
  REQUIRE(c.size() > 25);
  CHECK(c[21] == "+84");  // the stack of 21 norms
  CHECK(c[22].rfind("-[4,4,", 0) == 0);  // then the 21 norms die
  CHECK(c[23] == "+4");   // then the total norm
}
