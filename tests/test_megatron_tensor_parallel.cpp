// Tensor parallelism in the megatron family (graph/models/megatron.h, sim/megatron/megatron_parallel.h):
// per-layer activations against Korthikanti et al. 2022 Table 2, the rank's parameter
// share, vocabulary padding, the RankInfo, and what is refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <string>

#include "graph/models/megatron.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/megatron/megatron_checks.h"
#include "sim/megatron/megatron_step.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

Scenario gpt3() {
  return load_scenario(std::string(MEMSIM_SOURCE_DIR) + "/scenarios/gpt3-175b.yaml");
}

uint64_t parameter_bytes_at_forward_end(const Scenario& s) {
  Scenario f = s;
  f.step.kind = StepKind::forward;
  f.step.warmup_steps = 0;
  const Program program = build_megatron_program(f);
  const LiveBytes live = live_bytes_at_mark(program, "forward_end");
  REQUIRE(live.found_mark);
  return live.by_kind[static_cast<int>(TensorKind::parameter)];
}

}  // namespace

TEST_CASE("Korthikanti Table 2: tensor parallel keeps s*b*h*(10 + 24/t + 5as/(ht)) per layer",
          "[megatron][tensor-parallel]") {
  const Scenario s = gpt3();
  const double sbh = 2048.0 * 1 * 12288;
  for (int64_t t : {2, 8}) {
    const auto checks = korthikanti_tensor_parallel_checks(s, t);
    REQUIRE(checks.size() == 2);
    const double td = static_cast<double>(t);
    // eager: 5*a*s/(h*t) = 80/t
    CHECK(checks[0].expected == sbh * (10 + 24 / td + 80 / td));
    CHECK(checks[1].expected == sbh * (10 + 24 / td));
    for (const FormulaCheck& c : checks) {
      std::printf("  %-70s %-32s formula %14.1f memsim %14.1f extra %8.1f %s\n", c.name.c_str(),
                  c.formula.c_str(), c.expected, c.simulated, c.extra, c.note.c_str());
      // Exactly the formula plus the O(sb) terms the paper leaves out (LayerNorm fp32
      // mean/invvar, 16sb, not split by t; flash: logsumexp 4asb/t and RNG state).
      CHECK(c.simulated == c.expected + c.extra);
      CHECK(c.extra / c.expected < 1e-3);
    }
  }
}

TEST_CASE("tensor parallel: a rank holds its share of the weights, vocabulary padded to 128*t",
          "[megatron][tensor-parallel]") {
  Scenario s = gpt3();
  s.model.layers = 2;  // keeps the test fast; the split is per layer
  graph::MegatronShape one = megatron_shape(s);
  CHECK(one.padded_vocab() == 50257);  // t == 1: the vocabulary as given
  const uint64_t p1 = parameter_bytes_at_forward_end(s);
  CHECK(p1 == 2 * static_cast<uint64_t>(graph::megatron_parameter_count(one)));
  s.parallel.tensor = 8;
  graph::MegatronShape eight = megatron_shape(s);
  CHECK(eight.padded_vocab() == 51200);  // 50257 up to a multiple of 1024
  const uint64_t p8 = parameter_bytes_at_forward_end(s);
  const uint64_t h = 12288, f = 49152;
  // Hand count: word embedding 51200/8 rows, positions 2048 full; per layer the matrices
  // and column-parallel biases / 8, row-parallel biases and LayerNorms full; final norm.
  const uint64_t per_layer = (12 * h * h + 3 * h + f) / 8 + h + h + 4 * h;
  const uint64_t expect = 51200 / 8 * h + 2048 * h + 2 * per_layer + 2 * h;
  CHECK(p8 == 2 * expect);
  CHECK(static_cast<uint64_t>(graph::megatron_parameter_count(eight)) == expect);
}

TEST_CASE("tensor parallel: end to end train step, RankInfo, and refusals",
          "[megatron][tensor-parallel]") {
  Scenario s = gpt3();
  s.model.layers = 2;
  s.parallel.tensor = 4;
  const Program program = build_program(s);
  CHECK(program.rank.tensor == 4);
  CHECK(program.rank.world_size == 4);
  CHECK(program.rank.index == 0);
  CHECK(program.rank.why.find("tensor-parallel") != std::string::npos);

  // Pipeline parallelism is modelled for megatron (tests/test_megatron_pipeline.cpp) only.
  Scenario pp = load_scenario(std::string(MEMSIM_SOURCE_DIR) +
                              "/scenarios/cs336-small-train-ctx512.yaml");
  pp.parallel.pipeline = 2;
  CHECK_THROWS_WITH(build_program(pp), Catch::Contains("parallel.pipeline"));
  // Tensor x data parallelism (tests/test_megatron_pipeline.cpp [3d]) is modelled.
  Scenario odd = gpt3();
  odd.parallel.tensor = 5;  // 96 heads
  CHECK_THROWS_WITH(build_program(odd), Catch::Contains("model.heads"));
  Scenario other = load_scenario(std::string(MEMSIM_SOURCE_DIR) +
                                 "/scenarios/cs336-small-train-ctx512.yaml");
  other.parallel.tensor = 2;
  CHECK_THROWS_WITH(build_program(other), Catch::Contains("parallel.tensor"));
}

TEST_CASE("tensor parallel: weights + optimizer vs Megatron-LM's theoretical memory formula",
          "[megatron][tensor-parallel]") {
  Scenario s = gpt3();
  s.parallel.tensor = 8;
  const FormulaCheck c = megatron_theoretical_weight_optimizer_check(s);
  std::printf("  %s: formula %.1f memsim %.1f (%+.3f%%) %s\n", c.name.c_str(), c.expected,
              c.simulated, 100 * c.extra / c.expected, c.note.c_str());
  // By hand: per layer 12h^2/8 + (3h + f)/8 + 2h biases and 4h LayerNorm (full),
  // position embedding 2048*h, word embedding 51200/8*h, final norm 2h; 18 B/param
  // (bf16 weight 2, fp32 main_grad 4, fp32 master + Adam m, v 12).
  const double h = 12288, f = 49152;
  const double rank_params = 96 * (12 * h * h / 8 + (3 * h + f) / 8 + 6 * h) + 2048 * h +
                             51200 / 8 * h + 2 * h;
  const double formula_params = (2 * 96 * h * h * (2 + 4 + 2 / h + 1 / (96 * h)) + 51200 * h) / 8;
  CHECK(c.expected == Approx(18 * formula_params).epsilon(1e-12));
  CHECK(c.extra == Approx(18 * (rank_params - formula_params)).epsilon(1e-9));
  CHECK(std::abs(c.extra) / c.expected < 5e-3);
}

TEST_CASE("Korthikanti Table 2: sequence parallel keeps s*b*h*(34/t + 5as/(ht)) per layer",
          "[megatron][tensor-parallel][sequence-parallel]") {
  const Scenario s = gpt3();
  const double sbh = 2048.0 * 1 * 12288;
  for (int64_t t : {2, 8}) {
    const auto checks = korthikanti_tensor_parallel_checks(s, t, true);
    REQUIRE(checks.size() == 2);
    const double td = static_cast<double>(t);
    CHECK(checks[0].expected == sbh * (34 / td + 80 / td));
    CHECK(checks[1].expected == sbh * (34 / td));
    for (const FormulaCheck& c : checks) {
      std::printf("  %-70s %-32s formula %14.1f memsim %14.1f extra %8.1f %s\n", c.name.c_str(),
                  c.formula.c_str(), c.expected, c.simulated, c.extra, c.note.c_str());
      // LayerNorm fp32 mean/invvar (16sb/t: the norms see the sequence shard only).
      CHECK(c.simulated == c.expected + c.extra);
      CHECK(c.extra / c.expected < 1e-3);
    }
  }
}

TEST_CASE("sequence parallel with selective recompute keeps 34*s*b*h/t per layer",
          "[megatron][tensor-parallel][sequence-parallel]") {
  Scenario s = gpt3();
  s.parallel.tensor = 8;
  s.parallel.sequence = true;
  s.checkpoint.policy = CheckpointPolicy::selective;
  s.step.kind = StepKind::forward;
  s.step.warmup_steps = 0;
  s.model.layers = 4;
  const Program program = build_megatron_program(s);
  const LiveBytes live = live_bytes_at_mark(program, "forward_end");
  REQUIRE(live.found_mark);
  const double sbh = 2048.0 * 12288;
  const double sb = 2048.0;
  for (const auto& l : live.by_layer) {
    const double act = static_cast<double>(l[static_cast<int>(TensorKind::activation)]);
    // 34sbh/t plus the LayerNorm statistics 16sb/t.
    CHECK(act == 34 * sbh / 8 + 16 * sb / 8);
  }
}

TEST_CASE("sequence parallel: end to end train step and refusals",
          "[megatron][tensor-parallel][sequence-parallel]") {
  Scenario s = gpt3();
  s.model.layers = 2;
  s.parallel.tensor = 4;
  s.parallel.sequence = true;
  const Program sp = build_program(s);
  s.parallel.sequence = false;
  const Program tp = build_program(s);
  // The activations shrink; the parameters do not change.
  const LiveBytes a = live_bytes_at_mark(sp, "forward_end");
  const LiveBytes b = live_bytes_at_mark(tp, "forward_end");
  CHECK(a.by_kind[static_cast<int>(TensorKind::activation)] <
        b.by_kind[static_cast<int>(TensorKind::activation)]);
  CHECK(a.by_kind[static_cast<int>(TensorKind::parameter)] ==
        b.by_kind[static_cast<int>(TensorKind::parameter)]);
  Scenario one = gpt3();
  one.parallel.sequence = true;
  CHECK_THROWS_WITH(build_program(one), Catch::Contains("parallel.sequence"));
  Scenario other = load_scenario(std::string(MEMSIM_SOURCE_DIR) +
                                 "/scenarios/cs336-small-train-ctx512.yaml");
  other.parallel.sequence = true;
  CHECK_THROWS_WITH(build_program(other), Catch::Contains("parallel.sequence"));
}
