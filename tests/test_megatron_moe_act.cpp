// Megatron-Core `--recompute-modules moe_act` (model.moe.recompute: [moe_act]; issue #15
// item 2; graph/models/megatron_swiglu_experts.h, graph/ops/ops_megatron_arch.h
// checkpointed_weighted_swiglu / discard_moe_act, scenario/megatron_moe_keys.cpp,
// docs/moe-megatron.md "moe_act"):
//  - memsim's TEGroupedMLP chain against the torch CPU stand-in of CheckpointWithoutOutput
//    (tools/fixtures/gen_megatron_moe_act_fixtures.py -> tests/data/megatron_moe_act/
//    chain.json), every allocation and free, with and without moe_act;
//  - the whole model: the forward keeps M x F x e bytes less per MoE layer, the backward
//    recomputes one [M, F] per MoE layer right before fc2's backward;
//  - the refusals (Megatron's own and what memsim does not model).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/models/megatron_swiglu_experts.h"
#include "graph/runtime.h"
#include "json_test_support.h"
#include "sim/megatron/megatron_moe_parallel.h"
#include "sim/megatron/megatron_step.h"
#include "megatron_moe_test_support.h"
#include "test_paths.h"

using namespace memsim;
using memsim_test::activations_at_forward_end;
using memsim_test::normalise;
using memsim_test::runs;

namespace {

struct ChainRun {
  std::vector<std::pair<bool, uint64_t>> events;
  uint64_t recomputed = 0;  // bytes allocated by the re-run (kTensorRecomputed)
};

// memsim's chain on the fixture's shapes (fp32): x [M, h] and probs [M] leaves that require
// grad, the output's grad given by the caller (custom_backward), all as the stand-in does.
ChainRun run_chain(uint64_t M, uint64_t h, uint64_t F, bool moe_act) {
  Program p;
  ChainRun r;
  {
    graph::Runtime rt(p);
    rt.ctx.phase = Phase::setup;
    int32_t lx = -1, lp = -1;
    graph::Tensor x = rt.alloc_leaf(M * h * 4, TensorKind::activation, graph::OpKind::other, &lx);
    graph::Tensor probs = rt.alloc_leaf(M * 4, TensorKind::activation, graph::OpKind::other, &lp);
    graph::Tensor grad = rt.alloc(M * h * 4, TensorKind::temporary, graph::OpKind::other);
    const size_t from = p.events.size();
    rt.ctx.phase = Phase::forward;
    graph::Tensor out = graph::swiglu_experts(rt, x, probs, {M, h, F, 4, 2 * F * h * 4, h * F * 4, moe_act});
    rt.ctx.phase = Phase::backward;
    rt.backward(out.grad_fn, out.out_slot, grad.storage);
    out.reset();
    for (size_t i = from; i < p.events.size(); ++i) {
      const MemoryEvent& e = p.events[i];
      if (e.type != EventType::alloc && e.type != EventType::free) continue;
      r.events.push_back({e.type == EventType::alloc, p.tensors[e.tensor].bytes});
      if (e.type == EventType::alloc && (p.tensors[e.tensor].flags & kTensorRecomputed) != 0)
        r.recomputed += p.tensors[e.tensor].bytes;
    }
    // The leaves' .grad (x: fc1's dgrad, probs: the SwiGLU's weight grad) stay alive, as
    // x.grad and probs.grad do in the fixture.
    CHECK(rt.take_leaf_grad(lx) != graph::kNoStorage);
    CHECK(rt.take_leaf_grad(lp) != graph::kNoStorage);
    rt.freeze();
  }
  return r;
}

// h 64, 4 heads in 2 query groups, 4 SwiGLU experts of F 128 (TEGroupedMLP), top-2, no
// biases, T = 16 tokens, flash, no dropout, 2 layers (the first dense).
const char* kTiny = R"(
model:
  family: megatron
  layers: 2
  d_model: 64
  heads: 4
  kv_heads: 2
  d_ff: 256
  vocab: 512
  context_length: 16
  attention: flash
  dropout: 0.0
  tied_embeddings: true
  mlp: glu
  activation: silu
  qkv_bias: false
  o_bias: false
  mlp_bias: false
  moe: {experts: 4, top_k: 2, expert_d_ff: 128, grouped_gemm: true}
batch: {micro_batch: 1, seq_len: 16}
precision: {params: bf16, autocast: none, master_weights: true}
optimizer: {type: adam}
step: {kind: train, warmup_steps: 0}
parallel: {data: 2}
device: {preset: h100-80gb}
)";

using Overrides = std::vector<std::pair<std::string, std::string>>;

Scenario tiny(const Overrides& o = {}) { return load_scenario_text(kTiny, "tiny.yaml", o); }

std::string expect_error(const Overrides& o) {
  try {
    tiny(o);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

// Recomputed allocations of one Program: count and bytes, and whether each came right
// before fc2's backward (the next allocation is fc2's dgrad, of the same [M, F] size, in
// the same layer).
struct Recomputes {
  int count = 0;
  uint64_t bytes = 0;
  bool each_before_fc2_dgrad = true;
};
Recomputes recomputes(const Program& p) {
  Recomputes r;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type != EventType::alloc || (p.tensors[e.tensor].flags & kTensorRecomputed) == 0) continue;
    ++r.count;
    r.bytes += e.bytes;
    CHECK(p.str(e.op) == "weighted_swiglu");
    CHECK(e.phase == Phase::backward);
    size_t j = i + 1;
    while (j < p.events.size() && p.events[j].type != EventType::alloc) ++j;
    if (j == p.events.size() || p.events[j].bytes != e.bytes || p.events[j].layer != e.layer ||
        p.str(p.events[j].op) != "LinearWithGradAccumulationAndAsyncCommunicationBackward")
      r.each_before_fc2_dgrad = false;
  }
  return r;
}

}  // namespace

TEST_CASE("moe_act: TEGroupedMLP's chain matches the torch CPU stand-in event by event",
          "[megatron-moe-act]") {
  const nlohmann::json fx = memsim_test::load_json(MEMSIM_SOURCE_DIR + "/tests/data/megatron_moe_act/chain.json");
  REQUIRE(fx.at("cases").size() == 4);
  for (const auto& c : fx.at("cases")) {
    const uint64_t M = c.at("rows"), h = c.at("hidden"), F = c.at("ffn");
    const bool moe_act = c.at("moe_act");
    REQUIRE(c.at("elem").get<uint64_t>() == 4);
    std::vector<std::pair<bool, uint64_t>> expected;
    for (const auto& e : c.at("events")) expected.push_back({e.at("kind") == "alloc", e.at("bytes").get<uint64_t>()});
    REQUIRE(expected.size() > 10);
    const ChainRun got = run_chain(M, h, F, moe_act);
    INFO("M " << M << " h " << h << " F " << F << " moe_act " << moe_act);
    CHECK(normalise(got.events) == normalise(expected));
    // The re-run allocates exactly the activation's [M, F] (in the fixture: the clone at
    // the start of the backward), only with moe_act.
    CHECK(got.recomputed == (moe_act ? M * F * 4 : 0));
  }
  // The fixture's own figures: moe_act keeps M x F x 4 bytes less at the forward's end, and
  // in backward the recomputed [M, F] lives through the SwiGLU's backward, which can set a
  // higher transient peak (40 x 8 x 12: 17,984 against 16,064).
  const auto& cs = fx.at("cases");
  for (size_t i = 0; i + 1 < cs.size(); i += 2) {
    const uint64_t M = cs[i].at("rows"), F = cs[i].at("ffn");
    CHECK(cs[i].at("forward_end_live").get<uint64_t>() - cs[i + 1].at("forward_end_live").get<uint64_t>() ==
          M * F * 4);
  }
}

TEST_CASE("moe_act: the model keeps M x F x e bytes less per MoE layer and recomputes them",
          "[megatron-moe-act]") {
  // Both layers MoE, allgather, EP 1: M = T x K = 32 rows per layer, F 128, bf16.
  const uint64_t M = 32, F = 128, e = 2, L = 2;
  const uint64_t plain = activations_at_forward_end(tiny());
  const uint64_t act = activations_at_forward_end(tiny({{"model.moe.recompute", "[moe_act]"}}));
  std::printf("  moe_act: activations at forward end %llu -> %llu bytes\n",
              static_cast<unsigned long long>(plain), static_cast<unsigned long long>(act));
  CHECK(plain - act == L * M * F * e);
  {
    const Recomputes r = recomputes(build_megatron_program(tiny({{"model.moe.recompute", "[moe_act]"}})));
    CHECK(r.count == static_cast<int>(L));
    CHECK(r.bytes == L * M * F * e);
    CHECK(r.each_before_fc2_dgrad);
    CHECK(recomputes(build_megatron_program(tiny())).count == 0);
  }
  // first_dense_layers 1: only layer 1 is MoE.
  CHECK(activations_at_forward_end(tiny({{"model.moe.first_dense_layers", "1"}})) -
            activations_at_forward_end(
                tiny({{"model.moe.first_dense_layers", "1"}, {"model.moe.recompute", "[moe_act]"}})) ==
        M * F * e);
  // EP 2 x ETP 2 (alltoall, TP 2 + SP: T = 8 tokens on the rank): balanced, each expert gets
  // T x K / E = 4 of this rank's rows; rank 0's two experts receive EP x 8 from the
  // all-to-all, which the ETP gather doubles: M = 32 rows of F / ETP = 64.
  const Overrides etp = {{"parallel.data", "4"},  {"parallel.tensor", "2"},
                         {"parallel.sequence", "true"}, {"parallel.expert", "2"},
                         {"parallel.expert_tensor", "2"}, {"model.moe.dispatcher", "alltoall"}};
  Overrides etp_act = etp;
  etp_act.push_back({"model.moe.recompute", "[moe_act]"});
  const Scenario se = tiny(etp);
  const graph::MegatronMoeShape shape = megatron_moe_shape(se);
  CHECK(shape.expert_ffn() == 64);
  const uint64_t rows_etp = 2 * 2 * 2 * (8 * 2 / 4);  // ETP x EP x El x T K / E
  CHECK(activations_at_forward_end(se) - activations_at_forward_end(tiny(etp_act)) == L * rows_etp * 64 * e);
  CHECK(recomputes(build_megatron_program(tiny(etp_act))).bytes == L * rows_etp * 64 * e);
  // Composes with shared experts (their own checkpoint), the distributed optimizer,
  // pipeline stages (1F1B, interleaved), and the second step.
  CHECK(runs(tiny({{"model.moe.recompute", "[moe_act, shared_experts]"}, {"model.moe.shared_experts", "1"},
                   {"checkpoint.policy", "selective"}, {"parallel.zero", "1"}, {"step.warmup_steps", "1"}})));
  CHECK(runs(tiny({{"model.moe.recompute", "[moe_act]"}, {"parallel.pipeline", "2"}, {"parallel.data", "1"},
                   {"batch.grad_accum", "4"}})));
  CHECK(runs(tiny({{"model.moe.recompute", "[moe_act]"}, {"model.layers", "4"}, {"parallel.pipeline", "2"},
                   {"parallel.data", "1"}, {"parallel.pipeline_schedule", "interleaved"},
                   {"parallel.virtual_stages", "2"}, {"batch.grad_accum", "4"}})));
  CHECK(runs(tiny(etp_act)));
}

TEST_CASE("moe_act: refusals", "[megatron-moe-act]") {
  // Megatron-LM d98e8a64 transformer_config.py: "moe_act in recompute_modules is only
  // supported with moe_grouped_gemm."
  const std::string no_gg = expect_error({{"model.moe.grouped_gemm", "false"}, {"model.moe.recompute", "[moe_act]"}});
  CHECK_THAT(no_gg, Catch::Contains("model.moe.recompute") && Catch::Contains("moe_grouped_gemm"));
  // Nested in the MoE layer's reentrant checkpoint: not modelled.
  CHECK_THAT(expect_error({{"model.moe.recompute", "[moe, moe_act]"}}),
             Catch::Contains("model.moe.recompute") && Catch::Contains("not modelled"));
  // --recompute-modules need --recompute-granularity selective.
  CHECK_THAT(expect_error({{"model.moe.recompute", "[moe_act]"}, {"checkpoint.policy", "full"}}),
             Catch::Contains("model.moe.recompute") && Catch::Contains("selective"));
  CHECK_THAT(expect_error({{"model.moe.recompute", "[moe_acts]"}}), Catch::Contains("moe_act"));
}
