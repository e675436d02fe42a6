// Uneven Megatron pipeline splits (issue #15; scenario/pipeline_split.h, sim/megatron/
// megatron_pipeline.h): which global layers each chunk of each rank builds, against closed
// forms written here from Megatron-LM d98e8a64's get_transformer_layer_offset and
// get_num_layers_to_build (megatron/core/transformer/transformer_layer.py,
// transformer_block.py) and its TransformerConfig checks, over a grid of configurations;
// the per-stage model state, activations and in-flight micro-batches that follow; the
// keys, their refusals, and memsim run on a shipped scenario with an uneven split.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron_pipeline_test_support.h"
#include "graph/models/megatron.h"
#include "scenario/pipeline_split.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/analysis/parameter_count.h"
#include "sim/megatron/megatron_pipeline.h"
#include "sim/megatron/megatron_step.h"
#include "sim/search/optimize.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "tests/cli_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// --- Megatron's closed forms (d98e8a64), written independently of pipeline_split.cpp ------
// first / last: 0 = None. Valid only where megatron_accepts says so.
int64_t megatron_num_layers_to_build(const PipelineSplit& s, int64_t k, int64_t c) {
  const int64_t p = s.stages, v = s.chunks;
  int64_t per_rank = 0;
  if (s.first > 0 || s.last > 0) {
    int64_t left = s.layers, stages_left = p;
    if (s.first > 0) left -= s.first, stages_left -= 1;
    if (s.last > 0) left -= s.last, stages_left -= 1;
    per_rank = stages_left > 0 ? left / stages_left : 0;
    if (k == 0 && s.first > 0) per_rank = s.first;
    if (k == p - 1 && s.last > 0) per_rank = s.last;
  } else {
    per_rank = (s.layers + s.embedding + s.loss) / p;
  }
  int64_t n = v > 1 ? per_rank / v : per_rank;
  if (s.embedding && c == 0 && k == 0) n -= 1;        // is_vp_first_stage and first pp stage
  if (s.loss && c == v - 1 && k == p - 1) n -= 1;     // is_vp_last_stage and last pp stage
  return n;
}

int64_t megatron_offset(const PipelineSplit& s, int64_t k, int64_t c) {
  const int64_t p = s.stages, v = s.chunks;
  if (s.first > 0 || s.last > 0) {
    const int64_t middle_stages = p - (s.first > 0) - (s.last > 0);
    const int64_t f = s.first, l = s.last;
    const int64_t middle_layers = s.layers - f - l;
    const int64_t middle_rank = s.first > 0 ? k - 1 : k;
    if (v > 1) {
      const int64_t fv = f / v, lv = l / v, mv = middle_layers / v;
      const int64_t total = fv + mv + lv;
      if (k == 0) return c * total;
      return c * total + fv + middle_rank * (mv / middle_stages);
    }
    const int64_t per = middle_stages > 0 ? middle_layers / middle_stages : 0;
    return k == 0 ? 0 : middle_rank * per + f;
  }
  const int64_t n = s.layers + s.embedding + s.loss;
  const int64_t per = n / p;
  int64_t offset = 0;
  if (v > 1) offset = c * (n / v) + k * (per / v);
  else offset = k * per;
  if (s.embedding && !(c == 0 && k == 0)) offset -= 1;
  return offset;
}

// TransformerConfig.__post_init__ ("Uneven PP" and the embedding/loss branch) and
// get_num_layers_to_build's asserts.
bool megatron_accepts(const PipelineSplit& s) {
  const int64_t p = s.stages, v = s.chunks;
  if (s.first > 0 || s.last > 0) {
    if (s.embedding || s.loss) return false;
    int64_t layers = s.layers, stages = p;
    if (s.first > 0) {
      if (v > 1 && s.first % v != 0) return false;
      layers -= s.first, stages -= 1;
    }
    if (s.last > 0) {
      if (v > 1 && s.last % v != 0) return false;
      layers -= s.last, stages -= 1;
    }
    if ((layers != 0) != (stages != 0)) return false;
    if (layers < 0) return false;
    if (stages > 0 && layers % stages != 0) return false;
    if (stages > 0 && v > 1 && (layers / stages) % v != 0) return false;
    return true;
  }
  const int64_t n = s.layers + s.embedding + s.loss;
  if (n % p != 0) return false;
  if (v > 1 && (n / p) % v != 0) return false;
  return true;
}

Scenario tiny(int64_t layers, int64_t p, int64_t m, int64_t first, int64_t last,
              PipelineSchedule schedule = PipelineSchedule::one_f_one_b, int64_t v = 1) {
  Scenario s = memsim_test::tiny_pipeline(layers, p, m, schedule, v);
  s.parallel.pipeline_first_layers = first;
  s.parallel.pipeline_last_layers = last;
  return s;
}

uint64_t bytes_of_kind(const Program& program, TensorKind kind) {
  uint64_t sum = 0;
  for (const TensorInfo& t : program.tensors)
    if (t.kind == kind) sum += t.bytes;
  return sum;
}

LiveBytes stage_live(const Scenario& s, int64_t stage, const char* mark) {
  Program program;
  build_megatron_stage_program(s, {}, stage, program);
  LiveBytes l = live_bytes_at_mark(program, mark);
  REQUIRE(l.found_mark);
  return l;
}

std::string error_of(const std::string& text) {
  try {
    load_scenario_text(text, "u.yaml");
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("pipeline split: chunk layers equal Megatron's offset and count over a grid",
          "[pipeline-split]") {
  int64_t accepted = 0, uneven = 0, interleaved_uneven = 0;
  for (int64_t L = 1; L <= 20; ++L)
    for (int64_t p = 2; p <= 6; ++p)
      for (int64_t v = 1; v <= 3; ++v)
        for (int64_t first = 0; first <= L; ++first)
          for (int64_t last = 0; last <= L; ++last)
            for (int eo = 0; eo < 4; ++eo) {
              PipelineSplit s;
              s.layers = L, s.stages = p, s.chunks = v, s.first = first, s.last = last;
              s.embedding = (eo & 1) != 0, s.loss = (eo & 2) != 0;
              std::string key;
              const std::string why = pipeline_split_error(s, key);
              INFO("L " << L << " p " << p << " v " << v << " first " << first << " last " << last
                        << " emb " << s.embedding << " loss " << s.loss << ": " << why);
              if (!why.empty()) {
                CHECK_FALSE(key.empty());
                // memsim refuses only what Megatron refuses, or what it documents as not
                // modelled: stages without layers, embedding/loss with chunks, p = 2 with both
                // counts and chunks (Megatron divides by zero there).
                if (megatron_accepts(s)) {
                  bool empty = false;
                  for (int64_t k = 0; k < p; ++k)
                    for (int64_t c = 0; c < v; ++c) empty |= megatron_num_layers_to_build(s, k, c) < 1;
                  const bool documented = empty || ((s.embedding || s.loss) && v > 1) ||
                                          (p == 2 && first > 0 && last > 0 && v > 1);
                  CHECK(documented);
                }
                continue;
              }
              REQUIRE(megatron_accepts(s));
              ++accepted;
              uneven += s.uneven() ? 1 : 0;
              interleaved_uneven += s.uneven() && v > 1 ? 1 : 0;
              // Every global layer once, in virtual-stage order.
              int64_t next = 0, most = 0;
              for (int64_t c = 0; c < v; ++c)
                for (int64_t k = 0; k < p; ++k) {
                  const ChunkLayers got = chunk_layers(s, k, c);
                  CHECK(got.offset == megatron_offset(s, k, c));
                  CHECK(got.count == megatron_num_layers_to_build(s, k, c));
                  CHECK(got.offset == next);
                  CHECK(got.count >= 1);
                  next += got.count;
                }
              CHECK(next == L);
              for (int64_t k = 0; k < p; ++k) {
                int64_t n = 0;
                for (int64_t c = 0; c < v; ++c) n += chunk_layers(s, k, c).count;
                most = std::max(most, n);
              }
              CHECK(max_stage_layers(s) == most);
            }
  // The grid exercises each kind of split.
  CHECK(accepted > 1000);
  CHECK(uneven > 500);
  CHECK(interleaved_uneven > 50);
}

TEST_CASE("pipeline split: worked examples", "[pipeline-split]") {
  auto table = [](const PipelineSplit& s) {
    std::vector<std::vector<std::pair<int64_t, int64_t>>> t(static_cast<size_t>(s.stages));
    for (int64_t k = 0; k < s.stages; ++k)
      for (int64_t c = 0; c < s.chunks; ++c) {
        const ChunkLayers l = chunk_layers(s, k, c);
        t[static_cast<size_t>(k)].emplace_back(l.offset, l.count);
      }
    return t;
  };
  using T = std::vector<std::vector<std::pair<int64_t, int64_t>>>;
  PipelineSplit s;
  // get_num_layers_to_build's docstring: 8 layers, 2 stages, 4 chunks: [0] [2] [4] [6] | [1] [3] [5] [7].
  s.layers = 8, s.stages = 2, s.chunks = 4;
  CHECK(table(s) == T{{{0, 1}, {2, 1}, {4, 1}, {6, 1}}, {{1, 1}, {3, 1}, {5, 1}, {7, 1}}});
  // 10 layers on 4 stages, 1 on the first and the last: 1 | 4 | 4 | 1.
  s = PipelineSplit{};
  s.layers = 10, s.stages = 4, s.first = 1, s.last = 1;
  CHECK(table(s) == T{{{0, 1}}, {{1, 4}}, {{5, 4}}, {{9, 1}}});
  // Only the last given: the first rank is a middle one. 9 layers, 4 stages, last 3: 2 2 2 3.
  s = PipelineSplit{};
  s.layers = 9, s.stages = 4, s.last = 3;
  CHECK(table(s) == T{{{0, 2}}, {{2, 2}}, {{4, 2}}, {{6, 3}}});
  // Interleaved, 16 layers, 4 stages x 2 chunks, first 2 and last 2: a round of virtual stages
  // holds 1 + 3 + 3 + 1 layers.
  s = PipelineSplit{};
  s.layers = 16, s.stages = 4, s.chunks = 2, s.first = 2, s.last = 2;
  CHECK(table(s) == T{{{0, 1}, {8, 1}}, {{1, 3}, {9, 3}}, {{4, 3}, {12, 3}}, {{7, 1}, {15, 1}}});
  // --account-for-embedding / loss: 6 layers + 2 on 4 stages: 1 | 2 | 2 | 1.
  s = PipelineSplit{};
  s.layers = 6, s.stages = 4, s.embedding = true, s.loss = true;
  CHECK(table(s) == T{{{0, 1}}, {{1, 2}}, {{3, 2}}, {{5, 1}}});
}

TEST_CASE("pipeline split: per-stage parameters, grad buffers and optimizer state follow the split",
          "[pipeline-split]") {
  // 10 layers on 4 stages, 1 + 4 + 4 + 1 (1f1b), and interleaved 16 on 4 x 2 with 2 + 6 + 6 + 2.
  struct Case {
    int64_t layers, p, first, last, v;
  };
  for (const Case& c : {Case{10, 4, 1, 1, 1}, Case{9, 4, 0, 3, 1}, Case{11, 4, 2, 0, 1}, Case{16, 4, 2, 2, 2}}) {
    const Scenario s = tiny(c.layers, c.p, 8, c.first, c.last,
                            c.v > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b, c.v);
    const PipelineSplit split = pipeline_split(s);
    const graph::MegatronShape whole = megatron_shape(s);
    uint64_t sum = 0;
    for (int64_t k = 0; k < c.p; ++k) {
      Program program;
      build_megatron_stage_program(s, {}, k, program);
      uint64_t want = 0;
      for (int64_t ch = 0; ch < c.v; ++ch) {
        graph::MegatronShape shape = whole;
        const ChunkLayers l = chunk_layers(split, k, ch);
        shape.layers = l.count;
        shape.pre_process = ch * c.p + k == 0;
        shape.post_process = ch * c.p + k == c.p * c.v - 1;
        want += static_cast<uint64_t>(graph::megatron_parameter_count(shape));
      }
      INFO("L " << c.layers << " first " << c.first << " last " << c.last << " v " << c.v << " stage " << k);
      const uint64_t params = bytes_of_kind(program, TensorKind::parameter) / 2;  // bf16
      CHECK(params == want);
      CHECK(static_cast<uint64_t>(parameter_count_per_rank(s, static_cast<int>(k))) == want);
      // Megatron DDP's fp32 main_grad buffers (one per chunk) and Adam's fp32 master, exp_avg,
      // exp_avg_sq (no distributed optimizer).
      CHECK(stage_live(s, k, "forward_end").by_kind[int(TensorKind::gradient)] == 4 * want);
      CHECK(stage_live(s, k, "optimizer_end").by_kind[int(TensorKind::optimizer_state)] == 12 * want);
      sum += params;
    }
    // The stages add up to the model plus the last stage's copy of the tied word embedding.
    CHECK(sum == static_cast<uint64_t>(graph::megatron_parameter_count(whole)) + 1000 * 256);
  }
}

TEST_CASE("pipeline split: each layer keeps its activations once per in-flight micro-batch",
          "[pipeline-split]") {
  // 10 layers, 1 + 4 + 4 + 1, 8 micro-batches, 1F1B: stage k holds min(p - k, m) micro-batches
  // at forward_end. Its layers but the last keep what a middle layer of the even split
  // (8 layers, 2 per stage) keeps on the same stage; its last layer what the even split's last
  // keeps (its output is sent, then deallocated).
  const Scenario uneven = tiny(10, 4, 8, 1, 1);
  const Scenario even = tiny(8, 4, 8, 0, 0);
  const std::vector<int64_t> counts = {1, 4, 4, 1};
  for (int64_t k = 0; k < 4; ++k) {
    const LiveBytes u = stage_live(uneven, k, "forward_end");
    const LiveBytes e = stage_live(even, k, "forward_end");
    constexpr int kAct = static_cast<int>(TensorKind::activation);
    INFO("stage " << k);
    REQUIRE(u.by_layer.size() >= static_cast<size_t>(counts[k]));
    REQUIRE(e.by_layer.size() >= 2);
    for (int64_t l = 0; l + 1 < counts[k]; ++l) CHECK(u.by_layer[l][kAct] == e.by_layer[0][kAct]);
    CHECK(u.by_layer[counts[k] - 1][kAct] == e.by_layer[1][kAct]);
    CHECK(u.by_layer[0][kAct] > 0);
    // Outside the layers (embedding, received input, loss) as in the even split.
    CHECK(u.outside[kAct] == e.outside[kAct]);
  }
}

TEST_CASE("pipeline split: the stage reported and every stage's peak", "[pipeline-split]") {
  // 1 + 4 + 4 + 1: stage 1 (3 micro-batches of 4 layers) outweighs stage 0 (4 micro-batches
  // of 1 layer + the embedding), which is the worst of the even split.
  const Scenario s = tiny(10, 4, 8, 1, 1);
  Program program;
  const PipelineStagePeaks peaks = build_megatron_pipeline_program(s, {}, program);
  REQUIRE(peaks.peak_reserved.size() == 4);
  for (int64_t k = 0; k < 4; ++k) {
    INFO("stage " << k);
    CHECK(peaks.peak_reserved[static_cast<size_t>(k)] > 0);
    // The stage key holds each chunk's layer count: no stage of the split shares its
    // Program with the even split's.
    CHECK(megatron_stage_key(s, k) != megatron_stage_key(tiny(8, 4, 8, 0, 0), k));
  }
  CHECK(peaks.worst == 1);
  CHECK(program.rank.pipeline_stage == 1);
  CHECK(program.rank.why.find("layers by stage: 1, 4, 4, 1") != std::string::npos);
  Program even;
  CHECK(build_megatron_pipeline_program(tiny(8, 4, 8, 0, 0), {}, even).worst == 0);
}

TEST_CASE("pipeline split keys: read from a file, bad ones refused with FILE:LINE: KEY",
          "[pipeline-split]") {
  const std::string base =
      "model:\n  preset: gpt3-175b\n  layers: 18\nbatch:\n  grad_accum: 8\nparallel:\n"
      "  pipeline: 4\n";
  const Scenario s = load_scenario_text(base + "  pipeline_first_layers: 3\n  pipeline_last_layers: 3\n", "u.yaml");
  CHECK(s.parallel.pipeline_first_layers == 3);
  CHECK(s.parallel.pipeline_last_layers == 3);
  CHECK(chunk_layers(pipeline_split(s), 1, 0).offset == 3);
  CHECK(chunk_layers(pipeline_split(s), 1, 0).count == 6);
  // Without the keys 18 layers on 4 stages are refused, as before.
  CHECK(error_of(base) == "u.yaml:7: parallel.pipeline: 4 stages do not divide 18 layers");
  // The middle stages' layers must divide evenly.
  CHECK(error_of(base + "  pipeline_first_layers: 2\n  pipeline_last_layers: 3\n") ==
        "u.yaml:9: parallel.pipeline_last_layers: 2 + 3 layers leave 13 layers, not divisible by the 2 "
        "middle stages");
  CHECK(error_of(base + "  pipeline_first_layers: 1\n") ==
        "u.yaml:8: parallel.pipeline_first_layers: 1 layers leave 17 layers, not divisible by the 3 "
        "middle stages");
  // More than the model has; all of it with middle stages left.
  CHECK(error_of(base + "  pipeline_first_layers: 10\n  pipeline_last_layers: 10\n") ==
        "u.yaml:9: parallel.pipeline_last_layers: 10 + 10 layers on the first/last stage are more than "
        "the model's 18 layers");
  CHECK_THAT(error_of(base + "  pipeline_first_layers: 9\n  pipeline_last_layers: 9\n"),
             Catch::StartsWith("u.yaml:9: parallel.pipeline_last_layers: 9 + 9 layers leave no layer"));
  CHECK_THAT(error_of(base + "  pipeline_first_layers: 0\n"),
             Catch::StartsWith("u.yaml:8: parallel.pipeline_first_layers: expected"));
  CHECK_THAT(error_of(base + "  pipeline_first_layers: x\n"),
             Catch::StartsWith("u.yaml:8: parallel.pipeline_first_layers: expected"));
  // Interleaved: each count divides into the chunks; p = 2 with both counts is refused.
  const std::string inter = base + "  pipeline_schedule: interleaved\n  virtual_stages: 2\n";
  CHECK(error_of(inter + "  pipeline_first_layers: 3\n  pipeline_last_layers: 3\n") ==
        "u.yaml:10: parallel.pipeline_first_layers: 3 layers do not divide into the 2 model chunks "
        "of the stage (parallel.virtual_stages)");
  CHECK(error_of(inter + "  pipeline_first_layers: 2\n  pipeline_last_layers: 2\n") ==
        "u.yaml:9: parallel.virtual_stages: 7 layers of each middle stage do not divide into 2 model chunks");
  const Scenario i = load_scenario_text(inter + "  pipeline_first_layers: 2\n  pipeline_last_layers: 8\n", "u.yaml");
  CHECK(chunk_layers(pipeline_split(i), 3, 1).offset == 14);
  CHECK_THAT(error_of("model:\n  preset: gpt3-175b\n  layers: 8\nbatch:\n  grad_accum: 8\nparallel:\n"
                      "  pipeline: 2\n  pipeline_schedule: interleaved\n  virtual_stages: 2\n"
                      "  pipeline_first_layers: 2\n  pipeline_last_layers: 6\n"),
             Catch::StartsWith("u.yaml:9: parallel.virtual_stages:") && Catch::Contains("ZeroDivisionError"));
  // One stage; the embedding / loss accounting.
  CHECK(error_of("model:\n  preset: gpt3-175b\nparallel:\n  pipeline_first_layers: 4\n") ==
        "u.yaml:4: parallel.pipeline_first_layers: an uneven pipeline split needs parallel.pipeline > 1");
  CHECK_THAT(error_of(base + "  pipeline_first_layers: 3\n  pipeline_last_layers: 3\n"
                             "  pipeline_account_for_loss: true\n"),
             Catch::StartsWith("u.yaml:10: parallel.pipeline_account_for_loss: cannot be combined"));
  const Scenario e = load_scenario_text(base + "  pipeline_account_for_embedding: true\n  "
                                               "pipeline_account_for_loss: true\n", "u.yaml");
  CHECK(chunk_layers(pipeline_split(e), 0, 0).count == 4);
  CHECK(chunk_layers(pipeline_split(e), 3, 0).count == 4);
  CHECK(chunk_layers(pipeline_split(e), 1, 0).count == 5);
  CHECK(error_of(base + "  pipeline_account_for_embedding: true\n") ==
        "u.yaml:7: parallel.pipeline: 4 stages do not divide 18 layers + the embedding (19)");
  CHECK_THAT(error_of("model:\n  preset: gpt3-175b\n  layers: 3\nparallel:\n  pipeline: 4\n"
                      "  pipeline_account_for_embedding: true\n"),
             Catch::StartsWith("u.yaml:6: parallel.pipeline_account_for_embedding: stage 0 would hold "
                               "the embedding and no transformer layer"));
  CHECK_THAT(error_of(base + "  pipeline_schedule: interleaved\n  virtual_stages: 5\n"
                             "  pipeline_account_for_embedding: true\n  pipeline_account_for_loss: true\n"),
             Catch::StartsWith("u.yaml:10: parallel.pipeline_account_for_embedding: with interleaved chunks"));
  // memsim optimize plans equal stages only: refused by key, not approximated.
  const Scenario o = tiny(10, 4, 8, 1, 1);
  CHECK_THROWS_WITH(optimize_checkpointing(o, default_script(o), 1ull << 40, {}),
                    Catch::Contains("parallel.pipeline_first_layers"));
}

TEST_CASE("memsim run with an uneven split on the shipped GPT-3 175B TP8 PP8 scenario",
          "[pipeline-split][cli]") {
  using memsim_test::memsim_command;
  using memsim_test::run_shell;
  const std::string scenario =
      std::string(MEMSIM_SOURCE_DIR) + "/scenarios/gpt3-175b-tp8-pp8-64xh100.yaml";
  // 96 layers: 10 on the first stage, 8 on the last, 13 on each of the 6 others.
  const memsim_test::CommandResult run = run_shell(
      memsim_command() + "run '" + scenario +
      "' --set parallel.pipeline_first_layers=10 --set parallel.pipeline_last_layers=8 --json - 2>/dev/null");
  REQUIRE(run.status == 0);
  const nlohmann::json j = nlohmann::json::parse(run.out);
  const std::string why = j["rank"]["why"];
  CHECK(why.find("layers by stage: 10, 13, 13, 13, 13, 13, 13, 8") != std::string::npos);
  // Stage 0 keeps 8 micro-batches in flight, now of 10 layers (48.38 GiB reserved); stage 1
  // keeps 7 of 13 and is the worst: 58.89 GiB allocated (the even split's worst, stage 0,
  // 57.38 GiB).
  CHECK(j["rank"]["pipeline_stage"] == 1);
  CHECK(j["rank"]["index"] == 8);
  CHECK(j["peak_allocated_bytes"].get<double>() / (1024.0 * 1024 * 1024) == Approx(58.89).margin(0.005));
  const memsim_test::CommandResult bad = run_shell(
      memsim_command() + "run '" + scenario + "' --set parallel.pipeline_first_layers=7 2>&1");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("parallel.pipeline_first_layers: 7 layers leave 89 layers, not divisible by the 7 "
                     "middle stages") != std::string::npos);
}
