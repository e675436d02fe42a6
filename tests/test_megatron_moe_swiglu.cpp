// Megatron-Core MoE, part 2 (issue #15; graph/ops/ops_megatron_arch.h,
// graph/ops/ops_megatron_loss.h, graph/models/megatron_moe_loss.cpp,
// scenario/megatron_arch_keys.h, docs/moe-megatron.md): --swiglu experts and MLPs,
// grouped-query attention, --disable-bias-linear, and the router's aux / z losses, checked
// to the byte against hand counts from Megatron-LM d98e8a64's code, plus the refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/models/megatron.h"
#include "json_test_support.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/analysis/parameter_count.h"
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

// h 64, 4 heads (head_dim 16) in 2 query groups, 4 SwiGLU experts of F 128, top-2, no
// biases, T = 16 tokens, flash, no dropout, 1 layer.
const char* kTiny = R"(
model:
  family: megatron
  layers: 1
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
  moe: {experts: 4, top_k: 2, expert_d_ff: 128}
batch: {micro_batch: 1, seq_len: 16}
precision: {params: bf16, autocast: none, master_weights: true}
optimizer: {type: adam}
step: {kind: train, warmup_steps: 0}
parallel: {data: 2}
device: {preset: h100-80gb}
)";

using Overrides = std::vector<std::pair<std::string, std::string>>;

Scenario tiny(const Overrides& o = {}) { return load_scenario_text(kTiny, "tiny.yaml", o); }

// The same model without MoE (a dense SwiGLU MLP of d_ff 256).
Scenario dense(const Overrides& o = {}) {
  std::string text = kTiny;
  const std::string moe = "  moe: {experts: 4, top_k: 2, expert_d_ff: 128}\n";
  text.erase(text.find(moe), moe.size());
  return load_scenario_text(text, "dense.yaml", o);
}

std::string expect_error(const Overrides& o) {
  try {
    tiny(o);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

constexpr uint64_t kH = 64, kF = 128, kT = 16, kE = 4;
// What one routed row keeps after forward (allgather): its permuted hidden state (saved by
// linear_fc1), fc1's [gate, up] output (2F, saved by WeightedSwiGLUFunction), the weighted
// SwiGLU output (F, saved by linear_fc2), its probability (masked_select; saved by the
// weighted SwiGLU) and its int64 index. e = 2.
constexpr uint64_t kPerRow = kH * 2 + 2 * kF * 2 + kF * 2 + 2 + 8;

}  // namespace

TEST_CASE("megatron SwiGLU / GQA: parameters as Megatron builds them", "[megatron-moe2]") {
  const Scenario s = tiny();
  CHECK(s.megatron_arch.swiglu);
  CHECK_FALSE(s.megatron_arch.bias_linear);
  const graph::MegatronShape shape = megatron_shape(s);
  CHECK(shape.qkv_width() == 64 + 2 * 2 * 16);
  const uint64_t h = kH, F = kF, V = 512, P = 16, E = kE;
  // QKV [h + 2 * groups * head_dim, h], proj [h, h], no biases; 2 LayerNorms; router E x h
  // (no bias); 4 experts of fc1 [2F, h] + fc2 [h, F]; word + position embeddings; final norm.
  const uint64_t attention = 128 * h + h * h;
  const uint64_t experts = E * (2 * F * h + h * F);
  const uint64_t total = V * h + P * h + attention + 4 * h + E * h + experts + 2 * h;
  CHECK(static_cast<uint64_t>(graph::megatron_parameter_count(shape)) == total);
  CHECK(live_at(s, "forward_end").by_kind[int(TensorKind::parameter)] == 2 * total);
  // Dense: fc1 [2 d_ff, h] and fc2 [h, d_ff] (+ biases when on: 2 d_ff and h).
  const Scenario d = dense({{"model.o_bias", "true"}, {"model.mlp_bias", "true"}, {"model.qkv_bias", "true"}});
  const uint64_t f = 256;
  const uint64_t dense_total = V * h + P * h + (128 * h + 128) + (h * h + h) + 4 * h +
                               (2 * f * h + 2 * f) + (h * f + h) + 2 * h;
  CHECK(static_cast<uint64_t>(graph::megatron_parameter_count(megatron_shape(d))) == dense_total);
  CHECK(live_at(d, "forward_end").by_kind[int(TensorKind::parameter)] == 2 * dense_total);
  // --add-qkv-bias alone: the QKV bias only.
  const Scenario q = dense({{"model.qkv_bias", "true"}});
  CHECK(q.megatron_arch.qkv_bias);
  CHECK(static_cast<uint64_t>(graph::megatron_parameter_count(megatron_shape(q))) ==
        dense_total - h - 2 * f - h);  // minus the proj, fc1, fc2 biases (QKV's kept)
}

TEST_CASE("megatron SwiGLU experts: activations grow by the hand-counted bytes per routed row",
          "[megatron-moe2]") {
  // Allgather, EP 2: worst case 64 rows on rank 0's experts, balanced 32 (as in [megatron-moe]).
  const uint64_t worst = activations_at_forward_end(
      tiny({{"parallel.expert", "2"}, {"model.moe.routing", "worst-case"}}));
  const uint64_t balanced = activations_at_forward_end(tiny({{"parallel.expert", "2"}}));
  std::printf("  SwiGLU MoE activations at forward end: balanced %llu, worst-case %llu bytes\n",
              static_cast<unsigned long long>(balanced), static_cast<unsigned long long>(worst));
  CHECK(worst - balanced == (64 - 32) * kPerRow);
  // alltoall: the same rows through the experts.
  const uint64_t a_worst = activations_at_forward_end(tiny(
      {{"parallel.expert", "2"}, {"model.moe.routing", "worst-case"}, {"model.moe.dispatcher", "alltoall"}}));
  const uint64_t a_bal =
      activations_at_forward_end(tiny({{"parallel.expert", "2"}, {"model.moe.dispatcher", "alltoall"}}));
  CHECK(a_worst > a_bal);
  CHECK(runs(tiny({{"parallel.expert", "2"}, {"model.moe.dispatcher", "alltoall"}, {"step.warmup_steps", "1"}})));
  CHECK(runs(tiny({{"model.moe.shared_experts", "1"}, {"model.moe.recompute", "[moe, shared_experts]"},
                   {"checkpoint.policy", "selective"}})));
}

TEST_CASE("megatron SwiGLU dense MLP and GQA: the per-layer bytes Megatron's code keeps",
          "[megatron-moe2]") {
  // A dense layer: SwiGLU keeps fc1's [s, b, 2f] and the [s, b, f] output; GeLU keeps fc1's
  // [s, b, f] and gelu's [s, b, f] (bias_gelu saves its input, fc2 the output): one more
  // [s, b, f] with SwiGLU at the same d_ff.
  const Overrides mha = {{"model.kv_heads", "4"}};
  Overrides gelu = mha;
  gelu.push_back({"model.mlp", "plain"});
  gelu.push_back({"model.activation", "gelu"});
  const uint64_t swiglu_act = activations_at_forward_end(dense(mha));
  const uint64_t gelu_act = activations_at_forward_end(dense(gelu));
  CHECK(swiglu_act - gelu_act == kT * 256 * 2);
  // GQA against the torch CPU fixture (tools/fixtures/gen_megatron_gqa_fixtures.py): the
  // layer keeps the whole QKV output (key and value are views of it) plus the query when
  // its reshape is a copy (more than one query group), nothing else changes.
  const nlohmann::json fixture =
      memsim_test::load_json(std::string(MEMSIM_SOURCE_DIR) + "/tests/data/megatron_gqa/split.json");
  uint64_t mha_kept = 0;
  int checked = 0;
  for (const nlohmann::json& c : fixture["cases"]) {
    if (c["sq"].get<uint64_t>() != kT || c["heads"].get<int>() != 4) continue;
    CHECK(c["key_is_view"].get<bool>());
    CHECK(c["value_is_view"].get<bool>());
    const uint64_t kept = c["mixed_bytes"].get<uint64_t>() + c["query_new_bytes"].get<uint64_t>();
    const int groups = c["groups"].get<int>();
    if (groups == 4) mha_kept = kept;
    REQUIRE(mha_kept != 0);  // MHA first in the fixture
    const uint64_t act = activations_at_forward_end(dense({{"model.kv_heads", std::to_string(groups)}}));
    CHECK(swiglu_act + kept - mha_kept == act);
    ++checked;
  }
  CHECK(checked == 3);
  // The backward of the GQA attention (dq, dk + dv, then the split's cat) runs end to end,
  // with and without selective recompute.
  CHECK(runs(dense({{"step.warmup_steps", "1"}})));
  CHECK(runs(dense({{"checkpoint.policy", "selective"}})));
  CHECK(runs(tiny({{"parallel.data", "2"}, {"parallel.tensor", "2"}, {"parallel.sequence", "true"},
                   {"parallel.zero", "1"}})));
}

TEST_CASE("megatron MoE router losses: the aux and z losses' saved tensors", "[megatron-moe2]") {
  const uint64_t base = activations_at_forward_end(tiny());
  // aux_loss (softmax router): the fp32 [T, E] scores (SoftmaxBackward0's result), the int64
  // [E] tokens per expert (MulBackward0), the fp32 scalar loss (MoEAuxLossAutoScaler).
  const uint64_t aux = activations_at_forward_end(tiny({{"model.moe.aux_loss_coeff", "0.01"}}));
  CHECK(aux - base == kT * kE * 4 + kE * 8 + 4);
  // z-loss: the bf16 [T, E] logits and the [T] logsumexp (LogsumexpBackward0 saves both,
  // PowBackward0 the logsumexp), the bf16 scalar z_loss (MoEAuxLossAutoScaler).
  const uint64_t z = activations_at_forward_end(tiny({{"model.moe.z_loss_coeff", "0.001"}}));
  CHECK(z - base == kT * kE * 2 + kT * 2 + 2);
  const uint64_t both = activations_at_forward_end(
      tiny({{"model.moe.aux_loss_coeff", "0.01"}, {"model.moe.z_loss_coeff", "0.001"}}));
  CHECK(both - base == (aux - base) + (z - base));
  // The sigmoid router's scores: sigmoid keeps its fp32 [T, E] output, DivBackward0 the
  // [T] denominator and the sigmoid output; the quotient itself is saved by nobody.
  const uint64_t sig_base = activations_at_forward_end(tiny({{"model.moe.router", "sigmoid"}}));
  const uint64_t sig_aux = activations_at_forward_end(
      tiny({{"model.moe.router", "sigmoid"}, {"model.moe.aux_loss_coeff", "0.01"}}));
  CHECK(sig_aux - sig_base == kT * kE * 4 + kT * 4 + kE * 8 + 4);
  // Under --recompute-modules moe the first pass runs without grad: no loss tensors kept.
  CHECK(activations_at_forward_end(tiny({{"model.moe.recompute", "[moe]"}, {"model.moe.aux_loss_coeff", "0.01"},
                                         {"model.moe.z_loss_coeff", "0.001"}})) ==
        activations_at_forward_end(tiny({{"model.moe.recompute", "[moe]"}})));
  CHECK(runs(tiny({{"model.moe.aux_loss_coeff", "0.01"}, {"model.moe.z_loss_coeff", "0.001"},
                   {"step.warmup_steps", "1"}})));
  CHECK(runs(tiny({{"model.moe.aux_loss_coeff", "0.01"}, {"model.moe.z_loss_coeff", "0.001"},
                   {"model.moe.recompute", "[moe]"}, {"model.moe.dispatcher", "alltoall"},
                   {"parallel.expert", "2"}})));
}

TEST_CASE("megatron TEGroupedMLP: GroupedLinear experts and TE's process-lifetime buffers",
          "[megatron-moe2]") {
  // EP 1: 4 local experts. Same parameters; the same activations at forward end (one [M, h]
  // output either way: SequentialMLP's torch.cat replaces its per-expert outputs); TE's 4
  // grouped-GEMM cuBLAS workspaces (32 MiB + 1024 each on the sm_90 preset) and the two
  // cached dummy wgrads [2F, h], [h, F] in bf16 on top.
  const Scenario seq = tiny();
  const Scenario grouped = tiny({{"model.moe.grouped_gemm", "true"}});
  CHECK(megatron_shape(grouped).moe.grouped_gemm);
  CHECK(graph::megatron_parameter_count(megatron_shape(grouped)) ==
        graph::megatron_parameter_count(megatron_shape(seq)));
  const LiveBytes a = live_at(seq, "forward_end");
  const LiveBytes b = live_at(grouped, "forward_end");
  CHECK(b.by_kind[int(TensorKind::parameter)] == a.by_kind[int(TensorKind::parameter)]);
  CHECK(b.by_kind[int(TensorKind::activation)] == a.by_kind[int(TensorKind::activation)]);
  CHECK(b.by_kind[int(TensorKind::other)] - a.by_kind[int(TensorKind::other)] ==
        4 * (32ull * 1024 * 1024 + 1024) + (2 * kF * kH + kH * kF) * 2);
  // A100 preset (PyTorch's 8.1 MiB cuBLAS workspace, sm_80): TE's 4 MiB workspaces.
  const LiveBytes c = live_at(tiny({{"model.moe.grouped_gemm", "true"}, {"device.preset", "a100-80gb"}}), "forward_end");
  const LiveBytes d = live_at(tiny({{"device.preset", "a100-80gb"}}), "forward_end");
  CHECK(c.by_kind[int(TensorKind::other)] - d.by_kind[int(TensorKind::other)] ==
        4 * 4194304ull + (2 * kF * kH + kH * kF) * 2);
  CHECK(runs(tiny({{"model.moe.grouped_gemm", "true"}, {"parallel.expert", "2"},
                   {"model.moe.dispatcher", "alltoall"}, {"step.warmup_steps", "1"}})));
}

TEST_CASE("megatron SwiGLU / GQA / losses: refusals name the key", "[megatron-moe2]") {
  CHECK_THAT(expect_error({{"model.activation", "gelu"}}),
             Catch::Contains("model.activation") && Catch::Contains("swiglu"));
  CHECK_THAT(expect_error({{"model.mlp", "plain"}}), Catch::Contains("model.activation"));
  CHECK_THAT(expect_error({{"model.o_bias", "true"}}), Catch::Contains("model.mlp_bias"));
  CHECK_THAT(expect_error({{"model.o_bias", "true"}, {"model.mlp_bias", "true"}}),
             Catch::Contains("model.qkv_bias"));
  CHECK_THAT(expect_error({{"model.o_bias", "true"}, {"model.mlp_bias", "true"}, {"model.qkv_bias", "true"}}),
             Catch::Contains("model.mlp_bias") && Catch::Contains("weighted swiglu"));
  CHECK_THAT(expect_error({{"model.attention", "eager"}}), Catch::Contains("model.kv_heads"));
  CHECK_THAT(expect_error({{"model.moe.aux_loss_coeff", "-1"}}), Catch::Contains("model.moe.aux_loss_coeff"));
  CHECK_THAT(expect_error({{"model.moe.z_loss_coeff", "x"}}), Catch::Contains("model.moe.z_loss_coeff"));
  CHECK_THAT(expect_error({{"model.moe.grouped_gemm", "true"}, {"model.mlp", "plain"}, {"model.activation", "gelu"}}),
             Catch::Contains("model.moe.grouped_gemm"));
  // The knob keys stay refused for cs336, and the loss keys for the hf families.
  try {
    load_scenario_text(R"(
model: {family: hf-llama, layers: 1, d_model: 64, heads: 4, d_ff: 128, vocab: 128, moe: {experts: 4, top_k: 2, aux_loss_coeff: 0.01}}
batch: {micro_batch: 1, seq_len: 8}
)", "hf.yaml");
    FAIL("expected a ScenarioError");
  } catch (const ScenarioError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("model.moe.aux_loss_coeff"));
  }
  // Defaults: a megatron scenario without the keys is the GeLU, biased, MHA GPT.
  const Scenario d = load_scenario(std::string(MEMSIM_SOURCE_DIR) + "/scenarios/mixtral-8x7b-megatron-moe-ep8.yaml");
  CHECK_FALSE(d.megatron_arch.swiglu);
  CHECK(d.megatron_arch.bias_linear);
  CHECK(d.megatron_moe.aux_loss_coeff == 0);
  CHECK_FALSE(d.megatron_moe.z_loss_coeff.has_value());
}

TEST_CASE("megatron SwiGLU MoE: the shipped Mixtral scenario runs end to end", "[megatron-moe2]") {
  const Scenario s = load_scenario(std::string(MEMSIM_SOURCE_DIR) +
                                   "/scenarios/mixtral-8x7b-megatron-swiglu-gqa-ep8.yaml");
  CHECK(s.megatron_arch.swiglu);
  CHECK(s.model.kv_heads == 8);
  CHECK(s.megatron_moe.aux_loss_coeff == Approx(0.01));
  // Hugging Face's Mixtral-8x7B (46,702,792,704) plus this family's learned position
  // embedding (4096 x 4096) and LayerNorm biases (2 per layer and the final norm, 4096 each).
  CHECK(parameter_count(s.model) == 46702792704LL + 4096LL * 4096 + (2 * 32 + 1) * 4096LL);
  Scenario small = s;
  small.model.layers = 2;
  CHECK(runs(small));
}
