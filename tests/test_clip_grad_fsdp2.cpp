// optimizer.max_grad_norm over FSDP2 (sim/step/clip_grad_dtensor.h; docs/clip-grad.md "Over
// FSDP2's DTensor gradients"): torch.nn.utils.clip_grad_norm_ on the shards' DTensor grads,
// checked event by event against hand arithmetic from the cited source (torch 1.13, the
// CPU build here, has neither FSDP2 nor DTensor): _foreach_norm over the local shards (its
// workspace counts the largest *shard's* chunks), the [N] stack, the stack's _NormPartial
// -> Replicate redistribution (x ** 2, the all_reduce's clone, ** 0.5) before the 0-d
// total norm, then the local coefficient; HSDP; torchtitan's model code; a kept norm; the
// refusals by key; the shipped scenario through the CLI; and the CPU path against torch 1.13
// runs of the local ops written out (tools/fixtures/gen_clip_grad_fsdp2_fixtures.py).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.h"
#include "json_test_support.h"
#include "program/program.h"
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

// 2-layer hf-llama, D 256, F 1000, vocab 1001, fp32, FSDP2 over 4 ranks (tests/test_fsdp2.cpp's
// model), CUDA kernels (workspaces) on.
const std::string kFsdp2 =
    "model: { family: hf-llama, layers: 2, d_model: 256, heads: 4, kv_heads: 4, d_ff: 1000,\n"
    "         vocab: 1001, context_length: 64 }\n"
    "batch: { micro_batch: 2, seq_len: 64 }\n"
    "precision: { params: fp32 }\n"
    "optimizer: { type: adamw, impl: foreach }\n"
    "step: { kind: train, warmup_steps: 1 }\n"
    "parallel: { data: 4, sharding: fsdp2 }\n"
    "device: { capacity: 1TiB }\n";

// 21 grads: embed_tokens, 2 x (q k v o gate up down + 2 norms), norm, lm_head.
constexpr size_t kGrads = 1 + 2 * 9 + 2;

Scenario scenario(const std::string& norm, Sets set = {}) {
  if (!norm.empty()) set.insert(set.begin(), {"optimizer.max_grad_norm", norm});
  return load_scenario_text(kFsdp2, "fsdp2clip.yaml", set);
}

// clip_grad_norm_ over n DTensor grads of e bytes per element, workspace ws bytes:
// torch/nn/utils/clip_grad.py's statements with the DTensor dispatch of each (the
// comments cite the rule).
std::vector<std::string> expected(size_t n, uint64_t e, uint64_t ws, bool nonfinite = false,
                                  bool keep = false) {
  memsim_test::ExpectedEvents x{{}, 0};
  // torch._foreach_norm(device_grads): foreach_norm_strategy, Shard(0) -> _NormPartial(2),
  // no redistribution; the local op is ForeachReduceOp.cu's on the local shards.
  const size_t per_tensor = x.add(ws, "zeros");
  const size_t global_output = x.add(320 * 4, "zeros");
  std::vector<size_t> norms;
  for (size_t i = 0; i < n; ++i) norms.push_back(x.add(e, "sum"));
  const size_t global_norm = x.add(e, "sum");
  x.drop(global_output);
  x.drop(per_tensor);
  x.drop(global_norm);
  // torch.stack(norms): stack_strategy follows _NormPartial: a local [N].
  const size_t stacked = x.add(n * e, "cat");
  // linalg.vector_norm(stack): the Partial stack made Replicate first (_NormPartial.
  // _reduce_value: ** 2, _c10d_functional.all_reduce's clone, ** 0.5; the square, then the
  // clone die at its return), the 0-d total, the redistributed argument dies, the stack.
  const size_t squared = x.add(n * e, "pow");
  const size_t reduced = x.add(n * e, "clone");
  const size_t replicated = x.add(n * e, "pow");
  x.drop(squared);
  x.drop(reduced);
  const size_t total = x.add(e, "sum");
  x.drop(replicated);
  x.drop(stacked);
  // A Replicate total norm: the rest is local, as on one GPU.
  memsim_test::expect_clip_after_total(x, norms, total, e, nonfinite, keep);
  return x.v;
}

std::string refusal(const Sets& set) {
  return memsim_test::refusal_of([&] { build_program(scenario("1.0", set)); });
}

}  // namespace

TEST_CASE("clip_grad fsdp2: foreach norms of the local shards, the stack's all-reduce, the local clamp",
          "[clip_grad][fsdp2]") {
  const Program on = build_program(scenario("1.0"));
  const Program off = build_program(scenario(""));
  // The largest local shard: embed_tokens / lm_head, ceil(1001 / 4) = 251 rows x 256 =
  // 64,256 elements < 65,536: one chunk, so output_per_tensor = zeros(21 x 1) fp32 = 84 B
  // (unsharded, 256,256 elements would be 4 chunks: 336 B).
  const std::vector<std::string> clip = expected(kGrads, 4, kGrads * 1 * 4);
  const std::vector<std::string> ev = step_events(on, "backward_end", "optimizer_end");
  CHECK(head(ev, clip.size()) == clip);
  // The optimizer's step after it is the unclipped run's.
  const std::vector<std::string> plain = step_events(off, "backward_end", "optimizer_end");
  CHECK(ev.size() == clip.size() + plain.size());
  // N + 12 allocations a step (one GPU: N + 9), two steps.
  CHECK(allocations(on) == allocations(off) + 2 * (kGrads + 12));
}

TEST_CASE("clip_grad fsdp2: the workspace counts the largest shard's chunks", "[clip_grad][fsdp2]") {
  // vocab 2100: ceil(2100 / 4) = 525 rows x 256 = 134,400 elements: 3 chunks (the full
  // 537,600-element embedding would be 9): 21 x 3 x 4 = 252 B.
  const Program on = build_program(scenario("1.0", {{"model.vocab", "2100"}}));
  const std::vector<std::string> ev = step_events(on, "backward_end", "optimizer_end");
  REQUIRE(!ev.empty());
  CHECK(ev.front() == "+252 zeros #0");
  CHECK(head(ev, expected(kGrads, 4, 252).size()) == expected(kGrads, 4, 252));
}

TEST_CASE("clip_grad fsdp2: bf16 shards, HSDP, error_if_nonfinite", "[clip_grad][fsdp2]") {
  // bf16 parameters: 2-byte norms and [N] tensors, fp32 (opmath) workspaces.
  const Program bf16 = build_program(scenario("1.0", {{"precision.params", "bf16"}}));
  CHECK(head(step_events(bf16, "backward_end", "optimizer_end"), expected(kGrads, 2, 84).size()) ==
        expected(kGrads, 2, 84));
  // HSDP (2 replicas of 4-rank shard groups): the grads are (Replicate, Shard(0)), the
  // norms (Replicate, _NormPartial): one partial mesh dimension, the same events.
  const Program hsdp = build_program(scenario("1.0", {{"parallel.data", "8"}, {"parallel.replicate", "2"}}));
  CHECK(head(step_events(hsdp, "backward_end", "optimizer_end"), expected(kGrads, 4, 84).size()) ==
        expected(kGrads, 4, 84));
  // isnan / isinf / logical_or of the Replicate total norm are local.
  const Program nf = build_program(scenario("1.0", {{"optimizer.clip_error_if_nonfinite", "true"}}));
  CHECK(head(step_events(nf, "backward_end", "optimizer_end"), expected(kGrads, 4, 84, true).size()) ==
        expected(kGrads, 4, 84, true));
}

TEST_CASE("clip_grad fsdp2: torchtitan's model code and its kept grad_norm", "[clip_grad][fsdp2]") {
  // torchtitan's dist_utils.clip_grad_norm_: get_total_norm, then full_tensor() of the
  // Replicate total (no redistribution), clip_grads_with_norm_; the trainer binds grad_norm.
  const Sets titan = {{"model.implementation", "torchtitan"}, {"model.attention", "mem-efficient"},
                      {"optimizer.clip_keep_norm", "true"}};
  const Program on = build_program(scenario("1.0", titan));
  const std::vector<std::string> clip = expected(kGrads, 4, 84, false, true);
  const std::vector<std::string> ev = step_events(on, "backward_end", "optimizer_end");
  REQUIRE(ev.size() > clip.size());
  CHECK(head(ev, clip.size()) == clip);
  CHECK(ev[clip.size()] == "-4");  // the warm-up step's kept norm dies after the new clip
}

TEST_CASE("clip_grad fsdp2: refused by key where not modelled", "[clip_grad][fsdp2]") {
  CHECK(refusal({{"parallel.cpu_offload", "true"}}).find("fsdp2clip.yaml: parallel.cpu_offload: ") !=
        std::string::npos);
  CHECK(refusal({{"parallel.data", "8"}, {"parallel.context", "2"}, {"model.attention", "flash"},
                 {"parallel.fsdp_mixed_precision", "bf16"}})
            .find("fsdp2clip.yaml: optimizer.max_grad_norm: ") != std::string::npos);
  // With the GradScaler (modelled over FSDP2: tests/test_grad_scaler_fsdp2.cpp) a fused
  // optimizer after the explicit unscale_ stays refused, as on one GPU.
  CHECK(refusal({{"precision.autocast", "fp16"}, {"precision.grad_scaler", "true"}, {"optimizer.impl", "fused"}})
            .find("fsdp2clip.yaml: optimizer.max_grad_norm: ") != std::string::npos);
}

TEST_CASE("clip_grad fsdp2: the shipped torchtitan scenario through the CLI", "[clip_grad][fsdp2][cli]") {
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-torchtitan-fsdp2-clip-8xh100.yaml";
  const nlohmann::json on = memsim_test::run_json(file);
  const nlohmann::json off =
      memsim_test::run_json(file, "--set optimizer.max_grad_norm=0 --set optimizer.clip_keep_norm=false");
  // Llama 3 8B: 1 + 32 x 9 + 2 = 291 grads; two clips (warm-up, measured) of 291 + 12
  // allocations each. The measured step's peak (the loss's backward) holds the warm-up
  // step's kept grad_norm: one 512-B block more.
  CHECK(on["memory_stats"]["allocation.all.allocated"].get<uint64_t>() ==
        off["memory_stats"]["allocation.all.allocated"].get<uint64_t>() + 2 * (291 + 12));
  CHECK(on["peak_allocated_bytes"].get<uint64_t>() == off["peak_allocated_bytes"].get<uint64_t>() + 512);
  const memsim_test::CommandResult bad = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set parallel.cpu_offload=true 2>&1");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("parallel.cpu_offload") != std::string::npos);
}

TEST_CASE("clip_grad fsdp2: the CPU path matches torch 1.13 runs of the local ops", "[clip_grad][fsdp2][fixture]") {
  for (const char* dtype : {"fp32", "bf16"}) {
    for (const bool nonfinite : {false, true}) {
      const std::string name = std::string("clip_fsdp2_local_stand_in_") + dtype + (nonfinite ? "_nonfinite" : "");
      INFO(name);
      const nlohmann::json fx = memsim_test::load_json(MEMSIM_SOURCE_DIR + "/tests/data/clip_grad/" + name + ".json");
      REQUIRE(fx.contains("events"));
      REQUIRE(fx["grads"].get<size_t>() == kGrads);
      const memsim_test::AllocFrees expected_ev = memsim_test::fixture_alloc_frees(fx);
      REQUIRE(expected_ev.size() >= 60);
      Sets set = {{"precision.params", dtype}};
      if (nonfinite) set.emplace_back("optimizer.clip_error_if_nonfinite", "true");
      Scenario s = scenario("1.0", set);
      s.device.kernel_scratch = false;  // ATen's CPU _foreach_norm: one norm per tensor
      const Program p = build_program(s);
      const memsim_test::AllocFrees got = memsim_test::measured_alloc_frees(p, "backward_end", expected_ev.size());
      CHECK(coarse(got) == coarse(expected_ev));
    }
  }
}
