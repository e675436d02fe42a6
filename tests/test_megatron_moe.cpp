// Megatron-Core MoE in the megatron family (issue #15, Megatron part; graph/models/
// megatron_moe.cpp, sim/megatron/megatron_moe_parallel.h, scenario/megatron_moe_keys.h,
// docs/moe-megatron.md): exact parameter / grad-buffer / optimizer bytes with expert
// parallelism, the per-routed-row activation bytes against a hand count, capacity-factor
// dropping and padding, recompute, both dispatchers end to end, and the refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "graph/models/megatron.h"
#include "graph/models/megatron_moe.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/megatron/megatron_moe_parallel.h"
#include "sim/megatron/megatron_step.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "megatron_moe_test_support.h"
#include "test_paths.h"

using namespace memsim;
using memsim_test::activations_at_forward_end;
using memsim_test::live_at;
using memsim_test::runs;

namespace {

// h 64, 4 heads, 4 experts of F 128, top-2, T = 16 tokens, flash, no dropout, 1 layer.
const char* kTiny = R"(
model:
  family: megatron
  layers: 1
  d_model: 64
  heads: 4
  d_ff: 256
  vocab: 512
  context_length: 16
  attention: flash
  dropout: 0.0
  tied_embeddings: true
  moe: {experts: 4, top_k: 2, expert_d_ff: 128}
batch: {micro_batch: 1, seq_len: 16}
precision: {params: bf16, autocast: none, master_weights: true}
optimizer: {type: adam}
step: {kind: train, warmup_steps: 0}
parallel: {data: 2}
device: {preset: h100-80gb}
)";

Scenario tiny(const std::vector<std::pair<std::string, std::string>>& o = {}) {
  return load_scenario_text(kTiny, "tiny.yaml", o);
}

// What one routed row keeps after forward (allgather): its permuted hidden state (saved by
// linear_fc1), fc1 + bias (saved by gelu), gelu's output (saved by the probs product),
// the product (saved by linear_fc2), its probability (masked_select, saved by the
// product) and its int64 index (saved by index_select and scatter_add_). e = 2.
constexpr uint64_t kH = 64, kF = 128;
constexpr uint64_t kPerRow = kH * 2 + 3 * kF * 2 + 2 + 8;

std::string expect_error(const std::vector<std::pair<std::string, std::string>>& o) {
  try {
    tiny(o);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("megatron MoE: capacity = ceil(T*K/E * factor), kept = min(routed, capacity)",
          "[megatron-moe]") {
  CHECK(graph::megatron_moe_capacity(16, 2, 4, 1.0) == 8);
  CHECK(graph::megatron_moe_capacity(16, 2, 4, 0.5) == 4);
  CHECK(graph::megatron_moe_capacity(16, 2, 3, 1.0) == 11);   // ceil(32 / 3)
  CHECK(graph::megatron_moe_capacity(16, 2, 4, 1.25) == 10);
  graph::MegatronMoeShape m;
  m.spec.experts = 4;
  m.spec.top_k = 2;
  m.spec.routing = graph::MoeRouting::worst_case;  // [16, 16, 0, 0]
  graph::MegatronMoeTokens t = graph::megatron_moe_tokens(m, 16, 0);
  CHECK(t.sent == 32);
  CHECK(t.local == 32);
  m.capacity_factor = 1.0;
  t = graph::megatron_moe_tokens(m, 16, 0);
  CHECK(t.capacity == 8);
  CHECK(t.kept == std::vector<int64_t>{8, 8, 0, 0});
  CHECK(t.local == 16);
  m.pad_to_capacity = true;
  t = graph::megatron_moe_tokens(m, 16, 0);
  CHECK(t.kept == std::vector<int64_t>{8, 8, 8, 8});
  m.capacity_factor = 4.0;  // capacity 32 > 16 tokens: the mask is all ones
  t = graph::megatron_moe_tokens(m, 16, 0);
  CHECK(t.kept == std::vector<int64_t>{16, 16, 16, 16});
  // EP 2: rank 0 holds experts 0, 1 and gets them from both ranks.
  m.capacity_factor = 0;
  m.pad_to_capacity = false;
  m.expert_parallel = 2;
  t = graph::megatron_moe_tokens(m, 16, 0);
  CHECK(t.local == 2 * 32);
  CHECK(t.gathered == 32);
  m.spec.routing = graph::MoeRouting::balanced;  // 8 each
  t = graph::megatron_moe_tokens(m, 16, 0);
  CHECK(t.local == 2 * 16);
}

TEST_CASE("megatron MoE: parameters, the two DDP buffers and the distributed optimizer's shards",
          "[megatron-moe]") {
  // EP 2 of 4 experts over data 2 x tensor 1: expert data parallel 1. Distributed optimizer.
  const Scenario s = tiny({{"parallel.expert", "2"}, {"parallel.zero", "1"}});
  CHECK(expert_data_parallel(s) == 1);
  const graph::MegatronShape shape = megatron_shape(s);
  const uint64_t h = 64, F = 128, V = 512, P = 16, E = 4, El = 2;
  // Hand count: embeddings, attention (QKV, proj + biases), two LayerNorms, router (E x h +
  // E), El experts (fc1, fc2 + biases), final LayerNorm, untied? no: tied output layer.
  const uint64_t attention = 3 * h * h + 3 * h + h * h + h;
  const uint64_t norms = 4 * h;
  const uint64_t router = E * h + E;
  const uint64_t expert = El * (2 * h * F + F + h);
  const uint64_t dense = V * h + P * h + attention + norms + router + 2 * h;
  CHECK(static_cast<uint64_t>(graph::megatron_parameter_count(shape)) == dense + expert);
  const LiveBytes fwd = live_at(s, "forward_end");
  CHECK(fwd.by_kind[int(TensorKind::parameter)] == 2 * (dense + expert));
  // fp32 main_grad: the dense buffer padded to a multiple of data (2), the expert one of
  // the expert data-parallel size (1).
  const uint64_t dense_pad = (dense + 1) / 2 * 2;
  CHECK(fwd.by_kind[int(TensorKind::gradient)] == 4 * (dense_pad + expert));
  // After the step: fp32 main params + exp_avg + exp_avg_sq of rank 0's shards: half the
  // (padded) dense buffer, the whole expert buffer.
  const LiveBytes opt = live_at(s, "optimizer_end");
  CHECK(opt.by_kind[int(TensorKind::optimizer_state)] == 12 * (dense_pad / 2 + expert));
  // Without the distributed optimizer: everything, 12 bytes per parameter.
  const LiveBytes full = live_at(tiny({{"parallel.expert", "2"}}), "optimizer_end");
  CHECK(full.by_kind[int(TensorKind::optimizer_state)] == 12 * (dense + expert));
}

TEST_CASE("megatron MoE: activations grow by the hand-counted bytes per routed row",
          "[megatron-moe]") {
  // Allgather, EP 2: rank 0's experts 0 and 1 receive from both ranks. Worst case: 16 + 16
  // of this rank's rows, x 2 ranks = 64 rows; balanced 8 + 8, x 2 = 32 rows.
  const uint64_t worst = activations_at_forward_end(
      tiny({{"parallel.expert", "2"}, {"model.moe.routing", "worst-case"}}));
  const uint64_t balanced = activations_at_forward_end(tiny({{"parallel.expert", "2"}}));
  std::printf("  MoE activations at forward end: balanced %llu, worst-case %llu bytes\n",
              static_cast<unsigned long long>(balanced), static_cast<unsigned long long>(worst));
  CHECK(worst - balanced == (64 - 32) * kPerRow);
  // counts: [12, 4, 8, 8] -> rank 0 gets (12 + 4) x 2 = 32 rows, as balanced.
  CHECK(activations_at_forward_end(tiny({{"parallel.expert", "2"},
                                         {"model.moe.routing", "counts:[12,4,8,8]"}})) == balanced);
  // [16, 12, 4, 0] -> 56 rows.
  CHECK(activations_at_forward_end(tiny({{"parallel.expert", "2"},
                                         {"model.moe.routing", "counts:[16,12,4,0]"}})) ==
        balanced + (56 - 32) * kPerRow);
}

TEST_CASE("megatron MoE: a capacity factor drops rows, padding fills every expert to capacity",
          "[megatron-moe]") {
  // EP 1, worst-case routing: experts 0, 1 get all 16 tokens. Capacity ceil(16*2/4 * f).
  const auto base = std::vector<std::pair<std::string, std::string>>{{"model.moe.routing", "worst-case"}};
  auto with = [&](std::vector<std::pair<std::string, std::string>> o) {
    o.insert(o.begin(), base.begin(), base.end());
    return activations_at_forward_end(tiny(o));
  };
  const uint64_t dropless = with({});                                   // 32 rows
  const uint64_t cf1 = with({{"model.moe.capacity_factor", "1.0"}});    // 8 + 8 = 16 rows
  const uint64_t cf05 = with({{"model.moe.capacity_factor", "0.5"}});   // 4 + 4 = 8 rows
  const uint64_t pad05 = with({{"model.moe.capacity_factor", "0.5"}, {"model.moe.pad_to_capacity", "true"}});  // 4 x 4
  const uint64_t pad1 = with({{"model.moe.capacity_factor", "1.0"}, {"model.moe.pad_to_capacity", "true"}});   // 8 x 4
  std::printf("  dropless %llu, cf 1.0 %llu, cf 0.5 %llu, cf 0.5 padded %llu, cf 1.0 padded %llu\n",
              (unsigned long long)dropless, (unsigned long long)cf1, (unsigned long long)cf05,
              (unsigned long long)pad05, (unsigned long long)pad1);
  CHECK(dropless - cf1 == (32 - 16) * kPerRow);
  CHECK(cf1 - cf05 == (16 - 8) * kPerRow);
  CHECK(pad05 - cf05 == (16 - 8) * kPerRow);
  CHECK(pad1 == dropless);  // 4 x 8 = 32 rows, as dropless worst-case
}

TEST_CASE("megatron MoE: both dispatchers, shared experts and recompute run end to end",
          "[megatron-moe]") {
  for (const char* d : {"allgather", "alltoall"}) {
    for (const char* ep : {"1", "2"}) {
      Scenario s = tiny({{"parallel.expert", ep}, {"model.moe.dispatcher", d},
                         {"model.moe.shared_experts", "1"}, {"step.warmup_steps", "1"}});
      const Program program = build_program(s);
      SimulatedDevice device(s.device.capacity, s.device.cuda_context);
      const Timeline t = execute(program, s.allocator, device);
      REQUIRE_FALSE(t.oom.has_value());
      REQUIRE_FALSE(t.allocated.empty());
      CHECK(*std::max_element(t.allocated.begin(), t.allocated.end()) > 0);
      // The recompute of the whole MoE layer keeps only its input: fewer activations.
      Scenario r = s;
      r.megatron_moe.recompute_moe = true;
      CHECK(activations_at_forward_end(r) < activations_at_forward_end(s));
      Scenario sh = s;
      sh.megatron_moe.recompute_shared_experts = true;
      CHECK(activations_at_forward_end(sh) < activations_at_forward_end(s));
      const Program rp = build_program(r);
      SimulatedDevice rd(r.device.capacity, r.device.cuda_context);
      CHECK_FALSE(execute(rp, r.allocator, rd).oom.has_value());
    }
  }
}

TEST_CASE("megatron MoE: the shipped scenario runs end to end", "[megatron-moe]") {
  const Scenario s =
      load_scenario(std::string(MEMSIM_SOURCE_DIR) + "/scenarios/mixtral-8x7b-megatron-moe-ep8.yaml");
  CHECK(s.megatron_moe.expert == 8);
  CHECK(expert_data_parallel(s) == 2);
  Scenario small = s;
  small.model.layers = 2;  // the per-layer accounting; keeps the test fast
  const Program program = build_program(small);
  SimulatedDevice device(small.device.capacity, small.device.cuda_context);
  const Timeline t = execute(program, small.allocator, device);
  REQUIRE_FALSE(t.oom.has_value());
}

TEST_CASE("megatron MoE: bad input and what is not modelled exit with the key named",
          "[megatron-moe]") {
  CHECK_THAT(expect_error({{"parallel.expert", "3"}}), Catch::Contains("parallel.expert") &&
                                                           Catch::Contains("do not divide model.moe.experts"));
  CHECK_THAT(expect_error({{"parallel.expert", "4"}}), Catch::Contains("parallel.expert") &&
                                                           Catch::Contains("does not divide the world"));
  CHECK_THAT(expect_error({{"model.moe.capacity_factor", "0"}}), Catch::Contains("model.moe.capacity_factor"));
  CHECK_THAT(expect_error({{"model.moe.capacity_factor", "-1"}}), Catch::Contains("model.moe.capacity_factor"));
  CHECK_THAT(expect_error({{"model.moe.top_k", "5"}}), Catch::Contains("model.moe.top_k"));
  // Expert tensor parallelism is modelled (tests/test_megatron_moe_etp.cpp, [megatron-etp]),
  // but Megatron asserts ETP == 1 with linear biases, which this tiny model has.
  CHECK_THAT(expect_error({{"parallel.expert_tensor", "2"}}),
             Catch::Contains("parallel.expert_tensor") && Catch::Contains("Bias in Moe"));
  CHECK_THAT(expect_error({{"model.moe.grouped_gemm", "true"}}), Catch::Contains("model.moe.grouped_gemm"));
  CHECK_THAT(expect_error({{"model.moe.dispatcher", "flex"}}), Catch::Contains("model.moe.dispatcher"));
  CHECK_THAT(expect_error({{"model.moe.recompute", "[moe_act]"}}), Catch::Contains("model.moe.recompute"));
  CHECK_THAT(expect_error({{"model.moe.recompute", "[moe]"}, {"checkpoint.policy", "full"}}),
             Catch::Contains("model.moe.recompute") && Catch::Contains("selective"));
  CHECK_THAT(expect_error({{"model.moe.pad_to_capacity", "true"}}), Catch::Contains("model.moe.pad_to_capacity"));
  CHECK_THAT(expect_error({{"parallel.tensor", "2"}, {"parallel.expert_tensor", "1"}}),
             Catch::Contains("parallel.sequence"));
  // Without parallel.expert_tensor, ETP is Megatron's default, the tensor-parallel size:
  // TP 2 on this biased model is Megatron's bias assertion, and the message says why.
  CHECK_THAT(expect_error({{"parallel.tensor", "2"}}),
             Catch::Contains("Bias in Moe") && Catch::Contains("Megatron's default is the tensor-parallel size"));
  // Pipeline stages are modelled (tests/test_megatron_pipeline_moe.cpp, tag [pipeline-moe]).
  CHECK(expect_error({{"model.layers", "2"}, {"parallel.pipeline", "2"}}).empty());
  CHECK_THAT(expect_error({{"model.moe.norm_topk", "false"}}), Catch::Contains("model.moe.norm_topk"));
  // Megatron's keys on another family.
  try {
    load_scenario_text(R"(
model: {family: hf-llama, layers: 1, d_model: 64, heads: 4, d_ff: 128, vocab: 128, moe: {experts: 4, top_k: 2, dispatcher: alltoall}}
batch: {micro_batch: 1, seq_len: 8}
)", "hf.yaml");
    FAIL("expected a ScenarioError");
  } catch (const ScenarioError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("model.moe.dispatcher"));
  }
  // The default of every key reproduces a dropless EP 1 allgather run.
  const Scenario d = tiny();
  CHECK(d.megatron_moe.expert == 1);
  CHECK_FALSE(d.megatron_moe.capacity_factor.has_value());
  CHECK(d.megatron_moe.dispatcher == MoeDispatcher::allgather);
}
