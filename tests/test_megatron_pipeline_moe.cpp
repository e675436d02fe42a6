// Pipeline stages of a Megatron-Core MoE GPT (issue #15, Megatron part 3;
// sim/megatron/megatron_pipeline_moe.h, docs/moe-megatron.md "Pipeline stages"): each
// stage's parameters against an independent hand count in which a layer is MoE by its
// GLOBAL index (Megatron-LM d98e8a64 get_transformer_layer_offset + the sliced
// moe_layer_pattern), the two DDP buffers and the distributed optimizer's shards per stage,
// the MoE activations kept per in-flight micro-batch (1F1B: stage k holds min(p - k, m)),
// interleaved chunks, per-layer routing counts by the global MoE index, and the refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/analysis/layer_bytes.h"
#include "sim/analysis/parameter_count.h"
#include "sim/megatron/megatron_moe_parallel.h"
#include "sim/megatron/megatron_pipeline.h"
#include "sim/megatron/megatron_pipeline_moe.h"
#include "sim/megatron/megatron_step.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// h 64, 4 heads, d_ff 256, 4 experts of F 128 (top-2), T = 16 tokens, 4 layers of which the
// first is dense (first_dense_layers 1), tied embedding, flash, no dropout, biases on,
// data 2 x pipeline 2, EP 2 (expert data parallel 1), the distributed optimizer.
const char* kTiny = R"(
model:
  family: megatron
  layers: 4
  d_model: 64
  heads: 4
  d_ff: 256
  vocab: 512
  context_length: 16
  attention: flash
  dropout: 0.0
  tied_embeddings: true
  moe: {experts: 4, top_k: 2, expert_d_ff: 128, first_dense_layers: 1}
batch: {micro_batch: 1, seq_len: 16, grad_accum: 4}
precision: {params: bf16, autocast: none, master_weights: true}
optimizer: {type: adam}
step: {kind: train, warmup_steps: 1}
parallel: {data: 2, pipeline: 2, zero: 1, expert: 2}
device: {preset: h100-80gb}
)";

using Overrides = std::vector<std::pair<std::string, std::string>>;

Scenario tiny(const Overrides& o = {}) { return load_scenario_text(kTiny, "tiny-pp-moe.yaml", o); }

constexpr uint64_t h = 64, Fd = 256, F = 128, V = 512, P = 16, E = 4;

// Hand count of one layer's parameters (biases on; EP 2: 2 local experts).
uint64_t layer_params(bool moe, uint64_t local_experts) {
  const uint64_t attention = 3 * h * h + 3 * h + h * h + h;
  const uint64_t norms = 4 * h;
  const uint64_t mlp = moe ? E * h + E + local_experts * (2 * h * F + F + h) : 2 * h * Fd + Fd + h;
  return attention + norms + mlp;
}
uint64_t expert_params(bool moe, uint64_t local_experts) {
  return moe ? local_experts * (2 * h * F + F + h) : 0;
}

struct StageCount {
  uint64_t all = 0, expert = 0;
};
// Stage k of p (one chunk per rank), first_dense global layers dense, L layers.
StageCount hand_count(int64_t k, int64_t p, int64_t L, int64_t first_dense, uint64_t local_experts) {
  StageCount c;
  const int64_t n = L / p;
  for (int64_t g = k * n; g < (k + 1) * n; ++g) {
    c.all += layer_params(g >= first_dense, local_experts);
    c.expert += expert_params(g >= first_dense, local_experts);
  }
  if (k == 0) c.all += V * h + P * h;           // word + position embedding
  if (k == p - 1) c.all += 2 * h + (k == 0 ? 0 : V * h);  // final norm + the tied copy
  return c;
}

LiveBytes stage_live(const Scenario& s, int64_t stage, const char* mark) {
  Program program;
  build_megatron_stage_program(s, {}, stage, program);
  LiveBytes l = live_bytes_at_mark(program, mark);
  REQUIRE(l.found_mark);
  return l;
}

uint64_t padded(uint64_t n, uint64_t d) { return (n + d - 1) / d * d; }

std::string expect_error(const Overrides& o) {
  try {
    tiny(o);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

// What one routed row keeps after forward with the allgather dispatcher (the one-stage
// count of tests/test_megatron_moe.cpp: permuted input, fc1 + bias, gelu, the probs
// product, its probability, its int64 index).
constexpr uint64_t kPerRow = h * 2 + 3 * F * 2 + 2 + 8;

}  // namespace

TEST_CASE("pipeline MoE: each stage's parameters, by the global layer index, equal a hand count",
          "[pipeline-moe]") {
  for (int64_t p : {2, 4}) {
    for (const char* ep : {"1", "2"}) {
      const Scenario s = tiny({{"parallel.pipeline", std::to_string(p)}, {"parallel.expert", ep}});
      const uint64_t El = E / static_cast<uint64_t>(s.megatron_moe.expert);
      uint64_t total = 0;
      for (int64_t k = 0; k < p; ++k) {
        const StageCount want = hand_count(k, p, 4, 1, El);
        const LiveBytes fwd = stage_live(s, k, "forward_end");
        INFO("p " << p << ", EP " << ep << ", stage " << k);
        CHECK(fwd.by_kind[int(TensorKind::parameter)] == 2 * want.all);
        total += want.all;
        // Stage 0 of 4 holds layer 0 only: dense, no expert buffer content. The others hold
        // MoE layers although their local index is 0.
        if (p == 4) CHECK((want.expert == 0) == (k == 0));
      }
      // The stages add up to the whole model plus the last stage's copy of the tied embedding.
      const graph::MegatronShape whole = megatron_shape(s);
      CHECK(total == static_cast<uint64_t>(graph::megatron_parameter_count(whole)) + V * h);
    }
  }
}

TEST_CASE("pipeline MoE: per stage, the dense and expert DDP buffers and the optimizer's shards",
          "[pipeline-moe]") {
  // data 2, EP 2: expert data parallel 1. Dense buffer padded to 2 and halved by the
  // distributed optimizer; the expert buffer whole.
  const Scenario s = tiny();
  REQUIRE(expert_data_parallel(s) == 1);
  for (int64_t k : {0, 1}) {
    const StageCount c = hand_count(k, 2, 4, 1, 2);
    const uint64_t dense = c.all - c.expert;
    const LiveBytes fwd = stage_live(s, k, "forward_end");
    CHECK(fwd.by_kind[int(TensorKind::gradient)] == 4 * (padded(dense, 2) + c.expert));
    const LiveBytes opt = stage_live(s, k, "optimizer_end");
    CHECK(opt.by_kind[int(TensorKind::optimizer_state)] == 12 * (padded(dense, 2) / 2 + c.expert));
  }
  // Without the distributed optimizer: 12 bytes per parameter, unpadded buffers.
  const Scenario full = tiny({{"parallel.zero", "0"}});
  for (int64_t k : {0, 1}) {
    const StageCount c = hand_count(k, 2, 4, 1, 2);
    CHECK(stage_live(full, k, "forward_end").by_kind[int(TensorKind::gradient)] == 4 * c.all);
    CHECK(stage_live(full, k, "optimizer_end").by_kind[int(TensorKind::optimizer_state)] == 12 * c.all);
  }
  // data 4, EP 2: expert data parallel 2; both buffers padded and halved / quartered.
  const Scenario edp2 = tiny({{"parallel.data", "4"}});
  REQUIRE(expert_data_parallel(edp2) == 2);
  const StageCount c = hand_count(1, 2, 4, 1, 2);
  const uint64_t dense = c.all - c.expert;
  CHECK(stage_live(edp2, 1, "optimizer_end").by_kind[int(TensorKind::optimizer_state)] ==
        12 * (padded(dense, 4) / 4 + padded(c.expert, 2) / 2));
}

TEST_CASE("pipeline MoE: a stage keeps its MoE layers' routed rows once per in-flight micro-batch",
          "[pipeline-moe]") {
  // EP 2, allgather: rank 0's experts 0 and 1 get 32 rows (balanced) or 64 (worst case) per
  // MoE layer and micro-batch. At forward_end (after a stage's last forward) 1F1B stage k
  // of p holds min(p - k, m) micro-batches.
  for (int64_t p : {2, 4}) {
    for (int64_t m : {1, 4}) {
      const Overrides base = {{"parallel.pipeline", std::to_string(p)}, {"batch.grad_accum", std::to_string(m)}};
      Overrides worst = base;
      worst.emplace_back("model.moe.routing", "worst-case");
      const Scenario b = tiny(base), w = tiny(worst);
      for (int64_t k = 0; k < p; ++k) {
        int64_t moe_layers = 0;
        for (int64_t g = k * (4 / p); g < (k + 1) * (4 / p); ++g) moe_layers += g >= 1 ? 1 : 0;
        const int64_t in_flight = std::min(p - k, m);
        const uint64_t diff = stage_live(w, k, "forward_end").by_kind[int(TensorKind::activation)] -
                              stage_live(b, k, "forward_end").by_kind[int(TensorKind::activation)];
        INFO("p " << p << ", m " << m << ", stage " << k);
        CHECK(diff == static_cast<uint64_t>(in_flight * moe_layers) * (64 - 32) * kPerRow);
      }
    }
  }
}

TEST_CASE("pipeline MoE: per-layer routing counts follow the global MoE layer index",
          "[pipeline-moe]") {
  // EP 2: rank 0 receives (c0 + c1) x 2 rows. Three MoE layers (global 1, 2, 3): rows 32,
  // 48, 64. p = 2: stage 0 holds MoE layer 0 (32 rows), stage 1 MoE layers 1 and 2.
  const Overrides base = {{"batch.grad_accum", "1"}};
  Overrides counts = base;
  counts.emplace_back("model.moe.routing", "counts:[8,8,8,8,12,12,4,4,16,16,0,0]");
  const Scenario b = tiny(base), c = tiny(counts);
  auto acts = [](const Scenario& s, int64_t k) {
    return stage_live(s, k, "forward_end").by_kind[int(TensorKind::activation)];
  };
  CHECK(acts(c, 0) == acts(b, 0));
  CHECK(acts(c, 1) - acts(b, 1) == ((48 - 32) + (64 - 32)) * kPerRow);
  // The stage key tells stage 0 and 1 apart by their routing (each is built).
  CHECK(megatron_stage_key(c, 0) != megatron_stage_key(c, 1));
}

TEST_CASE("pipeline MoE: interleaved chunks take Megatron's layer offsets", "[pipeline-moe]") {
  // p 2, v 2, 4 layers: rank 0 holds global layers 0 (dense) and 2, rank 1 layers 1 and 3.
  const Scenario s = tiny({{"parallel.pipeline_schedule", "interleaved"}, {"parallel.virtual_stages", "2"}});
  CHECK(megatron_chunk_layer_offset(s, 0, 0) == 0);
  CHECK(megatron_chunk_layer_offset(s, 0, 1) == 2);
  CHECK(megatron_chunk_layer_offset(s, 1, 0) == 1);
  CHECK(megatron_chunk_layer_offset(s, 1, 1) == 3);
  const uint64_t rank0 = layer_params(false, 2) + layer_params(true, 2) + V * h + P * h;
  const uint64_t rank1 = 2 * layer_params(true, 2) + 2 * h + V * h;
  CHECK(stage_live(s, 0, "forward_end").by_kind[int(TensorKind::parameter)] == 2 * rank0);
  CHECK(stage_live(s, 1, "forward_end").by_kind[int(TensorKind::parameter)] == 2 * rank1);
  // Two chunks, each its own DDP with a dense and an expert buffer (EDP 1, data 2).
  const uint64_t e = expert_params(true, 2);
  const uint64_t d0a = layer_params(false, 2) + V * h + P * h, d0b = layer_params(true, 2) - e;
  CHECK(stage_live(s, 0, "forward_end").by_kind[int(TensorKind::gradient)] ==
        4 * (padded(d0a, 2) + 0 + padded(d0b, 2) + e));
}

TEST_CASE("pipeline MoE: recompute, dispatchers and the whole pipeline run end to end",
          "[pipeline-moe]") {
  for (const char* d : {"allgather", "alltoall"}) {
    const Scenario s = tiny({{"model.moe.dispatcher", d}, {"model.moe.shared_experts", "1"},
                             {"model.moe.aux_loss_coeff", "0.01"}});
    const Program program = build_program(s);
    CHECK(program.rank.pipeline == 2);
    SimulatedDevice device(s.device.capacity, s.device.cuda_context);
    CHECK_FALSE(execute(program, s.allocator, device).oom.has_value());
    // --recompute-modules moe alone (no checkpoint.policy) keeps fewer activations per stage.
    const Scenario r = tiny({{"model.moe.dispatcher", d}, {"model.moe.recompute", "[moe]"}});
    const Scenario n = tiny({{"model.moe.dispatcher", d}});
    for (int64_t k : {0, 1})
      CHECK(stage_live(r, k, "forward_end").by_kind[int(TensorKind::activation)] <
            stage_live(n, k, "forward_end").by_kind[int(TensorKind::activation)]);
  }
}

TEST_CASE("pipeline MoE: TEGroupedMLP's workspaces and dummy wgrads are one set per rank, "
          "shared by the interleaved chunks",
          "[pipeline-moe]") {
  // Transformer Engine d0067d0d: get_cublas_workspace(grouped_gemm=True) is lru_cached (4
  // stream workspaces of 32 MiB + 1024 on sm_90) and get_dummy_wgrad caches one tensor per
  // (shape, dtype) in a module-level dict: process-wide, whatever the number of model chunks.
  // p 2, v 2: rank 1 holds global layers 1 and 3, both MoE, in two chunks.
  const Overrides grouped = {{"model.mlp", "glu"}, {"model.activation", "silu"}, {"model.o_bias", "false"},
                             {"model.mlp_bias", "false"}, {"model.qkv_bias", "false"},
                             {"model.moe.grouped_gemm", "true"}};
  Overrides inter = grouped;
  inter.emplace_back("parallel.pipeline_schedule", "interleaved");
  inter.emplace_back("parallel.virtual_stages", "2");
  const Scenario one = tiny(grouped), two = tiny(inter);
  struct Te {
    int64_t workspaces = 0, dummies = 0;
    uint64_t bytes = 0;
  };
  auto te = [](const Scenario& s, int64_t stage) {
    Program program;
    build_megatron_stage_program(s, {}, stage, program);
    Te n;
    for (const MemoryEvent& e : program.events) {
      if (e.type != EventType::alloc) continue;
      const std::string& name = program.str(program.tensors[e.tensor].name);
      if (name == "TE grouped GEMM cuBLAS workspace") ++n.workspaces, n.bytes += program.tensors[e.tensor].bytes;
      if (name == "TE dummy wgrad") ++n.dummies, n.bytes += program.tensors[e.tensor].bytes;
    }
    return n;
  };
  const uint64_t ws = 32 * 1024 * 1024 + 1024;
  for (int64_t k : {0, 1}) {
    INFO("stage " << k);
    for (const Scenario* s : {&one, &two}) {
      const Te n = te(*s, k);
      CHECK(n.workspaces == 4);
      CHECK(n.dummies == 2);
      CHECK(n.bytes == 4 * ws + (2 * F * h + h * F) * 2);
    }
  }
  // The whole interleaved pipeline runs end to end.
  const Program program = build_program(two);
  SimulatedDevice device(two.device.capacity, two.device.cuda_context);
  CHECK_FALSE(execute(program, two.allocator, device).oom.has_value());
}

TEST_CASE("pipeline MoE: an uneven split keeps MoE layers by their global index",
          "[pipeline-moe]") {
  // 6 layers (layer 0 dense), p 2, 2 on the first stage and 4 on the last (Megatron's
  // --decoder-first/last-pipeline-num-layers): stage 0 builds global layers 0 and 1, stage 1
  // layers 2-5, all MoE although stage 1 numbers them from 0.
  const Scenario s = tiny({{"model.layers", "6"}, {"parallel.pipeline_first_layers", "2"},
                           {"parallel.pipeline_last_layers", "4"}});
  const uint64_t stage0 = layer_params(false, 2) + layer_params(true, 2) + V * h + P * h;
  const uint64_t stage1 = 4 * layer_params(true, 2) + 2 * h + V * h;
  CHECK(stage_live(s, 0, "forward_end").by_kind[int(TensorKind::parameter)] == 2 * stage0);
  CHECK(stage_live(s, 1, "forward_end").by_kind[int(TensorKind::parameter)] == 2 * stage1);
  // The JSON report's parameter_count_per_rank counts them by the global index too (it used
  // the local one: stage 1's first layer would have been dense).
  CHECK(static_cast<uint64_t>(parameter_count_per_rank(s, 0)) == stage0);
  CHECK(static_cast<uint64_t>(parameter_count_per_rank(s, 1)) == stage1);
  CHECK(static_cast<uint64_t>(parameter_count_per_rank(tiny({{"parallel.pipeline", "4"}}), 1)) ==
        hand_count(1, 4, 4, 1, 2).all);
  // Stage 1's expert DDP buffer holds its 4 MoE layers' experts (EDP 1: unpadded, unsharded).
  const uint64_t dense1 = stage1 - 4 * expert_params(true, 2);
  CHECK(stage_live(s, 1, "forward_end").by_kind[int(TensorKind::gradient)] ==
        4 * (padded(dense1, 2) + 4 * expert_params(true, 2)));
  // The stage keys tell the MoE layers apart by the global index.
  CHECK(megatron_stage_key(s, 0) != megatron_stage_key(s, 1));
}

TEST_CASE("pipeline MoE: what is not modelled exits with the key named", "[pipeline-moe]") {
  // TEGroupedMLP with the interleaved schedule is modelled (the test above).
  CHECK_NOTHROW(tiny({{"parallel.pipeline_schedule", "interleaved"}, {"parallel.virtual_stages", "2"},
                      {"model.mlp", "glu"}, {"model.activation", "silu"}, {"model.o_bias", "false"},
                      {"model.mlp_bias", "false"}, {"model.qkv_bias", "false"},
                      {"model.moe.grouped_gemm", "true"}}));
  // EP x PP must divide the world (Megatron's expert_tensor_model_pipeline_parallel_size).
  CHECK_THAT(expect_error({{"parallel.expert", "4"}, {"parallel.data", "2"}, {"parallel.pipeline", "4"}}),
             Catch::Contains("parallel.expert") && Catch::Contains("does not divide the world"));
  CHECK_THAT(expect_error({{"parallel.expert_tensor", "2"}}), Catch::Contains("parallel.expert_tensor"));
  // The 1F1B grouped-GEMM pipeline is modelled.
  CHECK_NOTHROW(tiny({{"model.mlp", "glu"}, {"model.activation", "silu"}, {"model.o_bias", "false"},
                      {"model.mlp_bias", "false"}, {"model.qkv_bias", "false"}, {"model.moe.grouped_gemm", "true"}}));
}

TEST_CASE("pipeline MoE: the shipped Mixtral TP1 PP4 EP8 scenario, stage by stage, against "
          "Megatron's theoretical_memory_usage.py",
          "[pipeline-moe]") {
  const Scenario s =
      load_scenario(std::string(MEMSIM_SOURCE_DIR) + "/scenarios/mixtral-8x7b-megatron-pp4-ep8.yaml");
  REQUIRE(s.parallel.pipeline == 4);
  REQUIRE(expert_data_parallel(s) == 1);
  // tools/megatron/theoretical_moe_memory.py, config F (compute_weight_and_optimizer_memory
  // at d98e8a64): the most loaded shard (one embedding) and the other shards, bytes.
  const double most_loaded = 28869737472.0, other = 27886697472.0;
  // What the formula spreads or leaves out, in dense parameters at 6 + 12/8 bytes: the
  // learned position embedding (4096 x 4096, stage 0 only) and the final LayerNorm (2h on the
  // last stage; the formula puts a quarter of it on every stage).
  const double per_dense = 6 + 12.0 / 8, h = 4096, quarter_norm = 2 * h / 4;
  const double expected[4] = {most_loaded + per_dense * (h * h - quarter_norm), other - per_dense * quarter_norm,
                              other - per_dense * quarter_norm, most_loaded + per_dense * (2 * h - quarter_norm)};
  for (int64_t k = 0; k < 4; ++k) {
    Program program;
    build_megatron_stage_program(s, {}, k, program);
    const LiveBytes opt = live_bytes_at_mark(program, "optimizer_end");
    const LiveBytes fwd = live_bytes_at_mark(program, "forward_end");
    REQUIRE(opt.found_mark);
    REQUIRE(fwd.found_mark);
    const uint64_t state = opt.by_kind[int(TensorKind::parameter)] + opt.by_kind[int(TensorKind::gradient)] +
                           opt.by_kind[int(TensorKind::optimizer_state)];
    SimulatedDevice device(1ull << 60, 0);
    ExecuteOptions exec;
    exec.record_by_kind = false;
    const Timeline t = execute(program, s.allocator, device, exec);
    std::printf("  stage %lld: model state %llu B (formula %.0f), activations at forward_end %llu B, "
                "peak allocated %llu B, peak reserved %llu B\n",
                static_cast<long long>(k), static_cast<unsigned long long>(state), expected[k],
                static_cast<unsigned long long>(fwd.by_kind[int(TensorKind::activation)]),
                static_cast<unsigned long long>(t.final_stats.allocated_bytes.all.peak),
                static_cast<unsigned long long>(t.final_stats.reserved_bytes.all.peak));
    CHECK(static_cast<double>(state) == expected[k]);
  }
}
