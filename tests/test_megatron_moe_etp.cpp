// Megatron-Core expert tensor parallelism (issue #15, `parallel.expert_tensor` > 1;
// graph/models/megatron_moe.cpp, graph/ops/ops_megatron_moe.h, sim/megatron/
// megatron_moe_parallel.h, scenario/megatron_moe_keys.h, docs/moe-megatron.md "Expert tensor
// parallelism"): per-rank expert parameters, DDP buffers and distributed-optimizer shards
// against Megatron-LM d98e8a64's theoretical_memory_usage.py split (experts / (ETP x EP),
// expert data parallel world / (ETP x EP x PP)); the routed rows the ETP gathers add, to the
// byte per row; ProcessGroupNCCL's stacked copies of the alltoall dispatcher's ETP
// collectives; TEGroupedMLP's per-rank dummy wgrads; pipeline stages; the refusals.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "graph/models/megatron.h"
#include "graph/models/megatron_moe.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/megatron/megatron_moe_parallel.h"
#include "sim/megatron/megatron_pipeline.h"
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

// h 64, 4 heads, 4 GeLU experts of F 128, top-2, T = 16 tokens, flash, no dropout, 1 layer,
// no linear biases (Megatron asserts "Bias in Moe is only supported when ETP==1").
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
  qkv_bias: false
  o_bias: false
  mlp_bias: false
  moe: {experts: 4, top_k: 2, expert_d_ff: 128}
batch: {micro_batch: 1, seq_len: 16}
precision: {params: bf16, autocast: none, master_weights: true}
optimizer: {type: adam}
step: {kind: train, warmup_steps: 0}
parallel: {data: 4, expert: 2, expert_tensor: 2}
device: {preset: h100-80gb}
)";

using Overrides = std::vector<std::pair<std::string, std::string>>;

Scenario tiny(const Overrides& o = {}) { return load_scenario_text(kTiny, "tiny-etp.yaml", o); }

constexpr uint64_t h = 64, F = 128, V = 512, P = 16, E = 4, T = 16, K = 2, e = 2;

std::string expect_error(const Overrides& o) {
  try {
    tiny(o);
  } catch (const ScenarioError& ex) {
    return ex.what();
  }
  return "";
}

uint64_t padded(uint64_t n, uint64_t d) { return (n + d - 1) / d * d; }

// What one routed row keeps after forward on an expert of per-rank width f = F / ETP (GeLU,
// no bias): its permuted input (saved by linear_fc1), fc1's output (saved by gelu), gelu's
// output (saved by the probs product), the product (saved by linear_fc2), its probability;
// allgather adds its int64 index (saved by index_select and scatter_add_).
constexpr uint64_t per_row(uint64_t f, bool index) { return h * e + 3 * f * e + e + (index ? 8 : 0); }

// Temporaries (no autograd node keeps them) allocated by op `op` in `phase`.
std::vector<uint64_t> temporaries(const Program& p, const char* op, Phase phase) {
  std::vector<uint64_t> out;
  for (const MemoryEvent& ev : p.events)
    if (ev.type == EventType::alloc && ev.kind == TensorKind::temporary && ev.phase == phase &&
        p.str(ev.op) == op)
      out.push_back(ev.bytes);
  return out;
}

}  // namespace

TEST_CASE("megatron ETP: every rank of the ETP x EP group routes alike: rows x EP x ETP",
          "[megatron-etp]") {
  graph::MegatronMoeShape m;
  m.spec.experts = 4;
  m.spec.top_k = 2;
  m.expert_parallel = 2;
  m.expert_tensor = 2;
  m.spec.expert_d_ff = 128;
  CHECK(m.expert_ffn() == 64);
  // Balanced: 8 rows to each expert from this rank; rank 0 holds experts 0, 1.
  graph::MegatronMoeTokens t = graph::megatron_moe_tokens(m, 16, 0);
  CHECK(t.gathered == 16 * 2 * 2);   // allgather over the ETP x EP group
  CHECK(t.received == 2 * (8 + 8));  // alltoall: after the EP all-to-all
  CHECK(t.local == 2 * 2 * (8 + 8)); // after the ETP all-gather
  m.spec.routing = graph::MoeRouting::worst_case;  // [16, 16, 0, 0]
  t = graph::megatron_moe_tokens(m, 16, 0);
  CHECK(t.received == 2 * 32);
  CHECK(t.local == 4 * 32);
  // ETP 1 is the EP-only accounting of [megatron-moe].
  m.expert_tensor = 1;
  t = graph::megatron_moe_tokens(m, 16, 0);
  CHECK(t.gathered == 32);
  CHECK(t.local == t.received);
}

TEST_CASE("megatron ETP: per-rank expert parameters, the two DDP buffers and the optimizer's "
          "shards follow theoretical_memory_usage.py's split",
          "[megatron-etp]") {
  // world = data 4 x tensor 1; EP 2 x ETP 2: expert data parallel 4 / (2 x 2) = 1.
  const Scenario s = tiny({{"parallel.zero", "1"}});
  REQUIRE(expert_data_parallel(s) == 1);
  const graph::MegatronShape shape = megatron_shape(s);
  CHECK(shape.moe.expert_tensor == 2);
  // The formula's expert_sharded_params = routed_expert_params / (ETP x EP) with
  // routed_expert_params = E x 2 h F (GeLU, no bias): this rank's 2 experts of fc1 [F/2, h]
  // and fc2 [h, F/2].
  const uint64_t expert = E * 2 * h * F / (2 * 2);
  CHECK(expert == 2 * (F / 2 * h + h * F / 2));
  const uint64_t dense = V * h + P * h + 4 * h * h + 4 * h + E * h + 2 * h;  // no biases
  CHECK(static_cast<uint64_t>(graph::megatron_parameter_count(shape)) == dense + expert);
  const LiveBytes fwd = live_at(s, "forward_end");
  CHECK(fwd.by_kind[int(TensorKind::parameter)] == 2 * (dense + expert));
  // fp32 main_grad: the dense buffer padded to data (4), the expert one to EDP (1).
  CHECK(fwd.by_kind[int(TensorKind::gradient)] == 4 * (padded(dense, 4) + expert));
  const LiveBytes opt = live_at(s, "optimizer_end");
  CHECK(opt.by_kind[int(TensorKind::optimizer_state)] == 12 * (padded(dense, 4) / 4 + expert));
  // data 8: EDP 2, the expert buffer padded to 2 and halved by the distributed optimizer.
  const Scenario s8 = tiny({{"parallel.zero", "1"}, {"parallel.data", "8"}});
  REQUIRE(expert_data_parallel(s8) == 2);
  CHECK(live_at(s8, "optimizer_end").by_kind[int(TensorKind::optimizer_state)] ==
        12 * (padded(dense, 8) / 8 + padded(expert, 2) / 2));
  // ETP 4 (F / 4 columns each): a quarter of each expert.
  const Scenario s4 = tiny({{"parallel.expert_tensor", "4"}, {"parallel.data", "8"}});
  REQUIRE(expert_data_parallel(s4) == 1);
  CHECK(static_cast<uint64_t>(graph::megatron_parameter_count(megatron_shape(s4))) ==
        dense + E * 2 * h * F / (4 * 2));
  // Without the distributed optimizer: 12 bytes per parameter.
  CHECK(live_at(tiny(), "optimizer_end").by_kind[int(TensorKind::optimizer_state)] == 12 * (dense + expert));
  // SwiGLU experts (fc1 [2F/ETP, h]; gated_linear_multiplier 3/2 in the formula).
  const Scenario sw = tiny({{"model.mlp", "glu"}, {"model.activation", "silu"}});
  CHECK(static_cast<uint64_t>(graph::megatron_parameter_count(megatron_shape(sw))) ==
        V * h + P * h + 4 * h * h + 4 * h + E * h + 2 * h + E * 3 * h * F / (2 * 2));
}

TEST_CASE("megatron ETP: each routed row the ETP gather adds keeps the hand-counted bytes",
          "[megatron-etp]") {
  // EP 2 x ETP 2: rank 0's experts 0, 1 process the rows of all 4 ranks of the ETP x EP
  // group. Balanced 8 + 8 per rank = 64 rows, worst case 16 + 16 per rank = 128 rows, each
  // keeping an expert of F / 2 columns.
  const uint64_t f = F / 2;
  const uint64_t ag_bal = activations_at_forward_end(tiny());
  const uint64_t ag_worst = activations_at_forward_end(tiny({{"model.moe.routing", "worst-case"}}));
  std::printf("  ETP 2 allgather activations at forward end: balanced %llu, worst-case %llu bytes\n",
              static_cast<unsigned long long>(ag_bal), static_cast<unsigned long long>(ag_worst));
  CHECK(ag_worst - ag_bal == (128 - 64) * per_row(f, true));
  // counts [16, 12, 4, 0]: (16 + 12) x 4 = 112 rows.
  CHECK(activations_at_forward_end(tiny({{"model.moe.routing", "counts:[16,12,4,0]"}})) ==
        ag_bal + (112 - 64) * per_row(f, true));
  // alltoall: the experts' rows keep the same bytes without the index (this rank's sent rows,
  // T x K dropless, and their indices do not change with the routing).
  const uint64_t a2a_bal = activations_at_forward_end(tiny({{"model.moe.dispatcher", "alltoall"}}));
  const uint64_t a2a_worst = activations_at_forward_end(
      tiny({{"model.moe.dispatcher", "alltoall"}, {"model.moe.routing", "worst-case"}}));
  std::printf("  ETP 2 alltoall activations at forward end: balanced %llu, worst-case %llu bytes\n",
              static_cast<unsigned long long>(a2a_bal), static_cast<unsigned long long>(a2a_worst));
  CHECK(a2a_worst - a2a_bal == (128 - 64) * per_row(f, false));
  // ETP 2 against ETP 1 at EP 2 (data 4 both): twice the rows at half the width; the
  // allgather dispatcher's map columns (local_map [N, El] and the permute mask [El, N], bool)
  // grow with N = T x EP x ETP.
  const uint64_t ag_etp1 = activations_at_forward_end(tiny({{"parallel.expert_tensor", "1"}}));
  const uint64_t El = 2, N1 = T * 2, N2 = T * 2 * 2;
  CHECK(ag_bal - ag_etp1 == 64 * per_row(f, true) - 32 * per_row(F, true) + 2 * El * (N2 - N1));
}

TEST_CASE("megatron ETP: the alltoall dispatcher's ETP all-gather and reduce-scatter, with "
          "ProcessGroupNCCL's stacked copies",
          "[megatron-etp]") {
  // EP 2 x ETP 2, balanced: this rank receives Mr = 2 x 16 = 32 rows from the EP all-to-all
  // and gathers M = 64 over ETP.
  const uint64_t Mr = 32, M = 64;
  const Scenario s = tiny({{"model.moe.dispatcher", "alltoall"}});
  const Program p = build_megatron_program(s);
  // Forward: tokens [M, h] and probs [M] gathered (each with its stacked list copy), the
  // experts' output reduce-scattered to [Mr, h] (its [M, h] input stacked).
  CHECK(temporaries(p, "gather_from_sequence_parallel_region", Phase::forward) ==
        std::vector<uint64_t>{M * h * e, M * e});
  CHECK(temporaries(p, "reduce_scatter_to_sequence_parallel_region", Phase::forward) ==
        std::vector<uint64_t>{M * h * e});
  // Backward: the reduce-scatter's grad all-gathered to [M, h], the gathers' grads
  // reduce-scattered (probs first: reverse order), each with its stacked copy.
  const std::vector<uint64_t> bwd_gather =
      temporaries(p, "_ReduceScatterToSequenceParallelRegionBackward", Phase::backward);
  const std::vector<uint64_t> bwd_rs = temporaries(p, "_GatherFromSequenceParallelRegionBackward", Phase::backward);
  std::printf("  backward temporaries: RS-backward %zu, gather-backward %zu\n", bwd_gather.size(), bwd_rs.size());
  // Each backward allocates its output (a temporary grad) and the stacked copy.
  CHECK(bwd_gather == std::vector<uint64_t>{M * h * e, M * h * e});
  CHECK(bwd_rs == std::vector<uint64_t>{Mr * e, M * e, Mr * h * e, M * h * e});
  // With pad_to_capacity the splits are None: all_gather_into_tensor / reduce_scatter_tensor,
  // no stacked copies.
  const Program padded_p = build_megatron_program(tiny({{"model.moe.dispatcher", "alltoall"},
                                                        {"model.moe.capacity_factor", "1.0"},
                                                        {"model.moe.pad_to_capacity", "true"}}));
  CHECK(temporaries(padded_p, "gather_from_sequence_parallel_region", Phase::forward).empty());
  CHECK(temporaries(padded_p, "reduce_scatter_to_sequence_parallel_region", Phase::forward).empty());
  // The allgather dispatcher's collectives have equal splits: no stacked copies either.
  const Program ag = build_megatron_program(tiny());
  CHECK(temporaries(ag, "gather_from_sequence_parallel_region", Phase::forward).empty());
  // ETP 1: the alltoall dispatcher makes no ETP collectives.
  const Program a1 = build_megatron_program(tiny({{"model.moe.dispatcher", "alltoall"}, {"parallel.expert_tensor", "1"}}));
  CHECK(temporaries(a1, "gather_from_sequence_parallel_region", Phase::forward).empty());
}

TEST_CASE("megatron ETP: TEGroupedMLP keeps this rank's share in its dummy wgrads",
          "[megatron-etp]") {
  const Overrides swiglu = {{"model.mlp", "glu"}, {"model.activation", "silu"}};
  Overrides grouped = swiglu;
  grouped.push_back({"model.moe.grouped_gemm", "true"});
  const LiveBytes a = live_at(tiny(swiglu), "forward_end");
  const LiveBytes b = live_at(tiny(grouped), "forward_end");
  // get_dummy_wgrad's cached [2F/ETP, h] and [h, F/ETP] (bf16) and TE's 4 workspaces.
  CHECK(b.by_kind[int(TensorKind::other)] - a.by_kind[int(TensorKind::other)] ==
        4 * (32ull * 1024 * 1024 + 1024) + (2 * (F / 2) * h + h * (F / 2)) * e);
  CHECK(b.by_kind[int(TensorKind::activation)] == a.by_kind[int(TensorKind::activation)]);
}

TEST_CASE("megatron ETP: dispatchers, recompute, grouped GEMM, tensor parallel and pipeline "
          "stages run end to end",
          "[megatron-etp]") {
  for (const char* d : {"allgather", "alltoall"}) {
    for (const char* ep : {"1", "2"}) {
      INFO("dispatcher " << d << ", EP " << ep);
      const Scenario s = tiny({{"parallel.expert", ep}, {"model.moe.dispatcher", d},
                               {"model.moe.shared_experts", "1"}, {"step.warmup_steps", "1"}});
      CHECK(runs(s));
      Scenario r = s;
      r.megatron_moe.recompute_moe = true;
      CHECK(activations_at_forward_end(r) < activations_at_forward_end(s));
      CHECK(runs(r));
    }
  }
  CHECK(runs(tiny({{"model.mlp", "glu"}, {"model.activation", "silu"}, {"model.moe.grouped_gemm", "true"},
                   {"model.moe.dispatcher", "alltoall"}, {"step.warmup_steps", "1"}})));
  CHECK(runs(tiny({{"model.moe.capacity_factor", "1.0"}, {"model.moe.pad_to_capacity", "true"},
                   {"model.moe.dispatcher", "alltoall"}, {"step.warmup_steps", "1"}})));
  // Megatron's default ETP = TP: TP 2 + SP, ETP 2 (data 2 x tensor 2 = 4 ranks, EP 2: EDP 1).
  const Scenario tp = tiny({{"parallel.data", "2"}, {"parallel.tensor", "2"}, {"parallel.sequence", "true"},
                            {"model.moe.dispatcher", "alltoall"}, {"parallel.zero", "1"}});
  REQUIRE(expert_data_parallel(tp) == 1);
  CHECK(runs(tp));
  // Pipeline 2 (2 layers; 8 ranks: data 4 x pipeline 2, EP 2 x ETP 2 x PP 2 = 8: EDP 1): each
  // stage holds one MoE layer with this rank's half experts.
  const Scenario pp = tiny({{"model.layers", "2"}, {"parallel.pipeline", "2"}, {"batch.grad_accum", "2"},
                            {"parallel.zero", "1"}, {"step.warmup_steps", "1"}});
  REQUIRE(expert_data_parallel(pp) == 1);
  const uint64_t expert = 2 * (F / 2 * h + h * F / 2);
  for (int64_t k : {0, 1}) {
    Program program;
    build_megatron_stage_program(pp, {}, k, program);
    const LiveBytes fwd = live_bytes_at_mark(program, "forward_end");
    REQUIRE(fwd.found_mark);
    const uint64_t layer = 4 * h * h + 4 * h + E * h + expert;
    const uint64_t all = layer + (k == 0 ? V * h + P * h : 2 * h + V * h);
    INFO("stage " << k);
    CHECK(fwd.by_kind[int(TensorKind::parameter)] == 2 * all);
    CHECK(fwd.by_kind[int(TensorKind::gradient)] == 4 * (padded(all - expert, 4) + expert));
  }
  CHECK(runs(pp));
}

TEST_CASE("megatron ETP: bad values and what Megatron rejects exit with the key named",
          "[megatron-etp]") {
  // 3 does not divide expert_d_ff 128 (the world of data 6 is fine: EP 1 x ETP 3).
  CHECK_THAT(expect_error({{"parallel.expert", "1"}, {"parallel.expert_tensor", "3"}, {"parallel.data", "6"}}),
             Catch::Contains("parallel.expert_tensor") && Catch::Contains("expert_d_ff"));
  // EP 2 x ETP 4 = 8 does not divide the world of 4 ranks (EP alone would).
  CHECK_THAT(expect_error({{"parallel.expert_tensor", "4"}}),
             Catch::Contains("parallel.expert_tensor") && Catch::Contains("does not divide the world"));
  CHECK_THAT(expect_error({{"parallel.expert_tensor", "0"}}), Catch::Contains("parallel.expert_tensor"));
  CHECK_THAT(expect_error({{"parallel.expert_tensor", "two"}}), Catch::Contains("parallel.expert_tensor"));
  // Linear biases on: Megatron's TransformerConfig asserts ETP == 1.
  CHECK_THAT(expect_error({{"model.qkv_bias", "true"}, {"model.o_bias", "true"}, {"model.mlp_bias", "true"}}),
             Catch::Contains("parallel.expert_tensor") && Catch::Contains("Bias in Moe"));
  // ETP 1 with biases stays fine; so does the default.
  CHECK(expect_error({{"parallel.expert_tensor", "1"}, {"model.qkv_bias", "true"}, {"model.o_bias", "true"},
                      {"model.mlp_bias", "true"}}).empty());
  CHECK(expect_error({}).empty());
}

TEST_CASE("megatron ETP: the shipped Mixtral ETP 2 scenario against theoretical_memory_usage.py",
          "[megatron-etp]") {
  const Scenario s = load_scenario(std::string(MEMSIM_SOURCE_DIR) +
                                   "/scenarios/mixtral-8x7b-megatron-swiglu-gqa-etp2-ep8.yaml");
  REQUIRE(s.megatron_moe.expert_tensor == 2);
  REQUIRE(expert_data_parallel(s) == 2);
  const Program program = build_megatron_program(s);
  const LiveBytes opt = live_bytes_at_mark(program, "optimizer_end");
  REQUIRE(opt.found_mark);
  const uint64_t state = opt.by_kind[int(TensorKind::parameter)] + opt.by_kind[int(TensorKind::gradient)] +
                         opt.by_kind[int(TensorKind::optimizer_state)];
  // tools/megatron/theoretical_moe_memory.py config G (compute_weight_and_optimizer_memory at
  // d98e8a64) plus what the formula leaves out: the learned position embedding (4096 x 4096)
  // at 6 + 12/16 bytes per dense parameter.
  const double formula = 39248123904.0;
  const double expected = formula + (6 + 12.0 / 16) * 4096.0 * 4096.0;
  std::printf("  shipped ETP 2: model state %llu B (formula %.0f + position embedding = %.0f)\n",
              static_cast<unsigned long long>(state), formula, expected);
  CHECK(static_cast<double>(state) == expected);
  Scenario small = s;
  small.model.layers = 2;
  CHECK(runs(small));
}

TEST_CASE("megatron ETP: without the key it is the tensor-parallel size, as in Megatron",
          "[megatron-etp]") {
  // megatron/training/arguments.py: expert_tensor_parallel_size None -> tensor_model_parallel_size.
  std::string text = kTiny;
  const std::string given = "parallel: {data: 4, expert: 2, expert_tensor: 2}";
  REQUIRE(text.find(given) != std::string::npos);
  text.replace(text.find(given), given.size(), "parallel: {data: 2, tensor: 2, sequence: true, expert: 2}");
  CHECK(load_scenario_text(text, "tiny-etp-default.yaml").megatron_moe.expert_tensor == 2);
  CHECK(load_scenario_text(text, "tiny-etp-default.yaml", {{"parallel.expert_tensor", "1"}})
            .megatron_moe.expert_tensor == 1);
  CHECK(tiny({{"parallel.expert_tensor", "1"}}).megatron_moe.expert_tensor == 1);
}

TEST_CASE("megatron ETP: the allgather dispatcher's backward, one MoE layer's allocations "
          "against the hand derivation (the hidden states' grad lands in the global buffer)",
          "[megatron-etp]") {
  // Megatron-LM d98e8a64 mappings.py: token_dispatch gathers the hidden states with
  // use_global_buffer=True; _GatherFromSequenceParallelRegion.backward passes
  // ctx.use_global_buffer to _reduce_scatter_along_first_dim, whose output is then
  // get_global_memory_buffer().get_tensor([T, h], "mpu"): a view of the buffer, which the
  // forward already grew to [N, h]. The probabilities' gather and token_combine's
  // reduce-scatter have no global buffer: their backwards allocate new tensors.
  // EP 2 x ETP 2, balanced: T 16 rows, N = T x 4 = 64 gathered, each local expert (El 2 of E
  // 4, per-rank width f = F / 2 = 64) gets N x K / E = 32 rows: M = 64.
  const uint64_t N = 64, M = 64, El = 2, f = F / 2;
  const Program p = build_megatron_program(tiny());
  std::vector<std::pair<std::string, uint64_t>> got;
  bool in_moe = false;
  for (const MemoryEvent& ev : p.events) {
    if (ev.type != EventType::alloc || ev.phase != Phase::backward || ev.layer != 0) continue;
    const std::string op = p.str(ev.op);
    if (op == "_ReduceScatterToSequenceParallelRegionBackward") in_moe = true;
    if (!in_moe) continue;
    if (op == "FusedLayerNormAffineFunctionBackward") break;  // the pre-MLP LayerNorm
    got.emplace_back(op, ev.bytes);
  }
  const std::string lin = "LinearWithGradAccumulationAndAsyncCommunicationBackward";
  const std::vector<std::pair<std::string, uint64_t>> want = {
      {"_ReduceScatterToSequenceParallelRegionBackward", N * h * e},  // token_combine: new [N, h]
      {"ScatterAddBackward0", M * h * e},                             // unpermute: grad.gather(0, index)
      {lin, M * f * e}, {lin, El * h * f * e},                        // fc2: dgrad, wgrad (to main_grad)
      {"MulBackward0", M * f * e}, {"MulBackward0", M * f * e},       // * probs: both operands
      {"MulBackward0", M * e},                                        //   summed to probs [M, 1]
      {"GeluBackward0", M * f * e},
      {lin, M * h * e}, {lin, El * f * h * e},                        // fc1: dgrad, wgrad
      {"MaskedSelectBackward0", El * N * e},                          // zeros_like(local_probs.T)
      {"IndexSelectBackward0", N * h * e},                            // zeros([N, h]).index_add_
      {"SliceBackward0", N * E * e},                                  // the local columns of [N, E]
      // the hidden states' gather: nothing (the global buffer's first T x h elements)
      {"_GatherFromSequenceParallelRegionBackward", T * E * e},      // the probs' gather: new [T, E]
      {"ScatterBackward0", T * K * e},                                // the router (as [megatron-moe])
      {"ToCopyBackward0", T * K * 4}, {"SoftmaxBackward0", T * K * 4}, {"SoftmaxBackward0", T * K * 4},
      {"ToCopyBackward0", T * K * e}, {"TopkBackward0", T * E * e},
      {lin, T * h * e}, {lin, E * h * e},                             // router gating: dgrad, wgrad
      // InputBuffer: the router's dense grad meets the buffered view of the global buffer,
      // which it cannot add into in place (the buffer dict shares its storage): a new [T, h].
      {"AddBackward0", T * h * e},
  };
  CHECK(got == want);
  // The hidden-state gather's backward frees the index_select grad [N, h] and allocates
  // nothing; the buffer is never regrown in backward.
  size_t gather_frees = 0, buffers = 0;
  for (const MemoryEvent& ev : p.events) {
    if (ev.type == EventType::free && ev.phase == Phase::backward && ev.layer == 0 &&
        p.str(ev.op) == "_GatherFromSequenceParallelRegionBackward" && p.tensors[ev.tensor].bytes == N * h * e)
      ++gather_frees;
    if (ev.type == EventType::alloc && p.tensors[ev.tensor].name != 0 &&
        p.str(p.tensors[ev.tensor].name) == "mpu global memory buffer")
      ++buffers;
  }
  CHECK(gather_frees == 1);
  CHECK(buffers == 1);
  CHECK(runs(tiny({{"step.warmup_steps", "1"}})));
}
