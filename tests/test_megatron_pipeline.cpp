// Pipeline parallelism in the megatron family (sim/megatron/pipeline_schedule.h,
// sim/megatron/megatron_pipeline.h): the schedules' order, the micro-batches each stage holds at
// its peak, the per-stage parameters, the stage reported, and what is refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "megatron_pipeline_test_support.h"
#include "allocator/caching_allocator.h"
#include "tests/cli_test_support.h"
#include "graph/models/megatron.h"
#include "sim/step/execute.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/megatron/megatron_checks.h"
#include "sim/megatron/megatron_pipeline.h"
#include "sim/megatron/megatron_pipeline_checks.h"
#include "sim/megatron/megatron_step.h"
#include "sim/megatron/pipeline_schedule.h"
#include "sim/search/optimize.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

Scenario tiny(int64_t pipeline, int64_t micro_batches,
              PipelineSchedule schedule = PipelineSchedule::one_f_one_b, int64_t v = 1) {
  return memsim_test::tiny_pipeline(8, pipeline, micro_batches, schedule, v);
}

// Tensors named `name` live right after the measured step's peak-allocated event.
int64_t live_named_at_peak(const Program& program, const std::string& name) {
  SimulatedDevice device(1ull << 60, 0);
  const Timeline t = execute(program, AllocatorConfig{}, device);
  size_t begin = 0;
  for (size_t i = 0; i < program.events.size(); ++i)
    if (program.events[i].type == EventType::mark &&
        program.str(static_cast<uint32_t>(program.events[i].bytes)) == "measured_step_begin")
      begin = i;
  size_t peak = begin;
  for (size_t i = begin; i < t.size(); ++i)
    if (t.allocated[i] > t.allocated[peak]) peak = i;
  std::set<uint32_t> live;
  for (size_t i = 0; i <= peak; ++i) {
    const MemoryEvent& e = program.events[i];
    if (e.type == EventType::alloc && program.str(program.tensors[e.tensor].name) == name)
      live.insert(e.tensor);
    if (e.type == EventType::free) live.erase(e.tensor);
  }
  return static_cast<int64_t>(live.size());
}

// Tensors named `name` live at the measured step's mark `mark`.
int64_t live_named_at_mark(const Program& program, const std::string& name, const std::string& mark) {
  std::set<uint32_t> live;
  bool measured = false;
  for (const MemoryEvent& e : program.events) {
    if (e.type == EventType::mark) {
      const std::string& m = program.str(static_cast<uint32_t>(e.bytes));
      if (m == "measured_step_begin") measured = true;
      if (measured && m == mark) return static_cast<int64_t>(live.size());
    }
    if (e.type == EventType::alloc && program.str(program.tensors[e.tensor].name) == name)
      live.insert(e.tensor);
    if (e.type == EventType::free) live.erase(e.tensor);
  }
  return -1;
}

uint64_t bytes_of_kind(const Program& program, TensorKind kind) {
  uint64_t sum = 0;
  for (const TensorInfo& t : program.tensors)
    if (t.kind == kind) sum += t.bytes;
  return sum;
}

const char* kHeld = "pipeline output (deallocated to 1 element)";

}  // namespace

TEST_CASE("pipeline schedules: Megatron's order and the micro-batches in flight",
          "[pipeline]") {
  for (int64_t p : {2, 4, 8})
    for (int64_t m : {1, 3, 4, 8, 16})
      for (int64_t k = 0; k < p; ++k) {
        const auto f1b1 = pipeline_actions(PipelineSchedule::one_f_one_b, p, 1, m, k, false);
        CHECK(max_in_flight(f1b1) == std::min(p - k, m));
        const auto gpipe = pipeline_actions(PipelineSchedule::gpipe, p, 1, m, k, false);
        CHECK(max_in_flight(gpipe) == m);
        for (const auto* actions : {&f1b1, &gpipe}) {
          // Each micro-batch once forward, then once backward, both in order.
          std::vector<int> state(static_cast<size_t>(m), 0);
          int32_t next_f = 0, next_b = 0;
          for (const PipelineAction& a : *actions) {
            CHECK(a.chunk == 0);
            if (a.forward) {
              CHECK(a.micro_batch == next_f++);
              CHECK(state[static_cast<size_t>(a.micro_batch)]++ == 0);
            } else {
              CHECK(a.micro_batch == next_b++);
              CHECK(state[static_cast<size_t>(a.micro_batch)]++ == 1);
            }
          }
          CHECK(next_f == m);
          CHECK(next_b == m);
        }
      }
  // 1F1B on stage 1 of 4 with 6 micro-batches: 2 warm-up forwards, 4 pairs, 2 cool-down.
  const auto a = pipeline_actions(PipelineSchedule::one_f_one_b, 4, 1, 6, 1, false);
  std::string order;
  for (const PipelineAction& x : a) order += (x.forward ? "F" : "B") + std::to_string(x.micro_batch) + " ";
  CHECK(order == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5 ");
  // Forward only: the forwards in order.
  CHECK(max_in_flight(pipeline_actions(PipelineSchedule::one_f_one_b, 4, 1, 6, 0, true)) == 6);
}

TEST_CASE("interleaved schedule: get_model_chunk_id order, warm-up, Megatron's penalty",
          "[pipeline]") {
  for (int64_t p : {2, 4})
    for (int64_t v : {2, 3})
      for (int64_t m : {p, 2 * p, 4 * p})
        for (int64_t k = 0; k < p; ++k) {
          const auto a = pipeline_actions(PipelineSchedule::interleaved, p, v, m, k, false);
          REQUIRE(a.size() == static_cast<size_t>(2 * m * v));
          const int64_t warmup = std::min((p - k - 1) * 2 + (v - 1) * p, m * v);
          for (int64_t j = 0; j < warmup; ++j) CHECK(a[static_cast<size_t>(j)].forward);
          // Virtual micro-batch j: chunk (j mod pv) / p forward, v-1 minus that backward.
          int64_t f = 0, b = 0;
          std::map<std::pair<int, int>, int> seen;
          for (const PipelineAction& x : a) {
            const int64_t j = x.forward ? f++ : b++;
            const int64_t chunk = (j % (p * v)) / p;
            CHECK(x.chunk == (x.forward ? chunk : v - 1 - chunk));
            CHECK(seen[{x.chunk, x.micro_batch}]++ == (x.forward ? 0 : 1));
          }
          CHECK(max_in_flight(a) == std::min(warmup + 1, m * v));
          if (k == 0 && warmup < m * v) {
            // Megatron's theoretical memory: stage 0 holds the activations of
            // (1 + (p-1)/(p*v)) * p micro-batches of L/p layers, i.e. of pv + p - 1 chunk
            // passes of L/(pv) layers.
            CHECK(max_in_flight(a) == p * v + p - 1);
          }
        }
}

TEST_CASE("pipeline stages hold min(p - k, m) micro-batches at their peak (1F1B), m (GPipe)",
          "[pipeline]") {
  // A micro-batch is in flight on stage k > 0 while its received input activation lives;
  // stage 0 (no input) peaks in its first backward, when every micro-batch it has run
  // forward still holds its deallocated output's 1-element stand-in.
  auto in_flight_at_peak = [](const Program& program, int64_t k) {
    return live_named_at_peak(program, k == 0 ? kHeld : "pipeline recv: input activation");
  };
  for (int64_t m : {2, 6}) {
    const Scenario s = tiny(4, m);
    const Scenario g = tiny(4, m, PipelineSchedule::gpipe);
    for (int64_t k = 0; k < 4; ++k) {
      Program program;
      build_megatron_stage_program(s, {}, k, program);
      CHECK(program.rank.pipeline_stage == k);
      CHECK(program.rank.pipeline == 4);
      CHECK(in_flight_at_peak(program, k) == std::min<int64_t>(4 - k, m));
      // After the step, only set_input_tensor's attribute holds a received input.
      CHECK(live_named_at_mark(program, "pipeline recv: input activation", "optimizer_end") ==
            (k == 0 ? 0 : 1));
      CHECK(live_named_at_mark(program, kHeld, "optimizer_end") == 0);
      Program gp;
      build_megatron_stage_program(g, {}, k, gp);
      CHECK(in_flight_at_peak(gp, k) == m);
    }
  }
}

TEST_CASE("pipeline stages: parameters add up to the model's plus the last stage's "
          "shared word embedding",
          "[pipeline]") {
  for (int64_t p : {2, 4, 8}) {
    for (int64_t t : {1, 2}) {
      Scenario s = tiny(p, 8);
      s.parallel.tensor = t;
      graph::MegatronShape whole_shape = megatron_shape(s);
      const uint64_t whole = static_cast<uint64_t>(graph::megatron_parameter_count(whole_shape));
      uint64_t sum = 0;
      for (int64_t k = 0; k < p; ++k) {
        Program program;
        build_megatron_stage_program(s, {}, k, program);
        const uint64_t params = bytes_of_kind(program, TensorKind::parameter) / 2;  // bf16
        // The stage's own count (graph/models/megatron.h) agrees with what it allocates.
        graph::MegatronShape stage = whole_shape;
        stage.layers = s.model.layers / p;
        stage.pre_process = k == 0;
        stage.post_process = k == p - 1;
        CHECK(params == static_cast<uint64_t>(graph::megatron_parameter_count(stage)));
        sum += params;
      }
      const uint64_t word = static_cast<uint64_t>(whole_shape.padded_vocab() / t * 256);
      CHECK(sum == whole + word);
    }
  }
  // Interleaved: v chunks per rank, the first chunk of rank 0 embeds, the last of the last
  // rank has the output layer.
  Scenario s = tiny(2, 4, PipelineSchedule::interleaved, 2);
  const uint64_t whole = static_cast<uint64_t>(graph::megatron_parameter_count(megatron_shape(s)));
  uint64_t sum = 0;
  for (int64_t k = 0; k < 2; ++k) {
    Program program;
    build_megatron_stage_program(s, {}, k, program);
    sum += bytes_of_kind(program, TensorKind::parameter) / 2;
  }
  CHECK(sum == whole + 1000 * 256);
}

TEST_CASE("interleaved pipeline: the model chunks share Megatron's one global memory buffer",
          "[pipeline]") {
  // parallel_state.get_global_memory_buffer() is a process singleton (keyed by name and
  // dtype), so the v chunks of a rank take the baddbmm input (eager attention) and the
  // sequence-parallel gathers from the same buffer: as many allocations as one chunk makes
  // (a use that needs more replaces it), not that many per chunk.
  const auto buffers = [](const Scenario& s) {
    Program program;
    build_megatron_stage_program(s, {}, 0, program);
    int64_t n = 0;
    for (const MemoryEvent& e : program.events)
      if (e.type == EventType::alloc &&
          program.str(program.tensors[e.tensor].name) == "mpu global memory buffer")
        ++n;
    return n;
  };
  for (const bool sp : {false, true}) {
    Scenario one = tiny(2, 4);
    if (sp) {
      one.parallel.tensor = 2;
      one.parallel.sequence = true;
    }
    Scenario inter = one;
    inter.parallel.pipeline_schedule = PipelineSchedule::interleaved;
    inter.parallel.virtual_stages = 2;
    CHECK(buffers(one) >= 1);
    CHECK(buffers(inter) == buffers(one));
  }
}

TEST_CASE("pipeline: build_program reports the stage with the largest peak reserved",
          "[pipeline]") {
  const Scenario s = tiny(4, 8);
  const Program program = build_program(s);
  CHECK(program.rank.pipeline == 4);
  CHECK(program.rank.world_size == 4);
  Program check;
  const PipelineStagePeaks peaks = build_megatron_pipeline_program(s, {}, check);
  REQUIRE(peaks.peak_reserved.size() == 4);
  const auto worst = std::max_element(peaks.peak_reserved.begin(), peaks.peak_reserved.end());
  CHECK(peaks.worst == worst - peaks.peak_reserved.begin());
  CHECK(program.rank.pipeline_stage == peaks.worst);
  CHECK(program.rank.why.find("pipeline stage " + std::to_string(peaks.worst) + " of 4") == 0);
  CHECK(program.events.size() == check.events.size());
  // Stage 0 holds 4 micro-batches of activations and the embedding: the worst here.
  CHECK(peaks.worst == 0);
}

TEST_CASE("pipeline: forward-only steps and selective recompute run on every stage",
          "[pipeline]") {
  for (StepKind kind : {StepKind::forward, StepKind::forward_no_grad, StepKind::forward_backward}) {
    Scenario s = tiny(2, 4);
    s.step.kind = kind;
    s.checkpoint.policy = CheckpointPolicy::selective;
    const Program program = build_program(s);
    CHECK(program.rank.pipeline == 2);
    CHECK_FALSE(program.events.empty());
  }
}

TEST_CASE("pipeline: refusals by key", "[pipeline]") {
  Scenario interleaved = tiny(4, 6, PipelineSchedule::interleaved, 2);
  CHECK_THROWS_WITH(build_program(interleaved), Catch::Contains("tiny.yaml: batch.grad_accum:") &&
                                                    Catch::Contains("multiple of parallel.pipeline"));
  interleaved.batch.grad_accum = 8;
  CHECK_NOTHROW(build_program(interleaved));
  Scenario other = load_scenario(std::string(MEMSIM_SOURCE_DIR) +
                                 "/scenarios/cs336-small-train-ctx512.yaml");
  other.parallel.pipeline = 2;
  CHECK_THROWS_WITH(build_program(other), Catch::Contains("parallel.pipeline:") &&
                                              Catch::Contains("'megatron' only"));
}

TEST_CASE("pipeline scenario keys: values read, bad ones refused with FILE:LINE: KEY",
          "[pipeline]") {
  const std::string base =
      "model:\n  preset: gpt3-175b\n  layers: 16\nbatch:\n  grad_accum: 8\nparallel:\n"
      "  pipeline: 4\n";
  auto error_of = [](const std::string& text) -> std::string {
    try {
      load_scenario_text(text, "p.yaml");
    } catch (const ScenarioError& e) {
      return e.what();
    }
    return "";
  };
  const Scenario d = load_scenario_text(base, "p.yaml");
  CHECK(d.parallel.pipeline_schedule == PipelineSchedule::one_f_one_b);
  CHECK(d.parallel.virtual_stages == 1);
  const Scenario i =
      load_scenario_text(base + "  pipeline_schedule: interleaved\n  virtual_stages: 2\n", "p.yaml");
  CHECK(i.parallel.pipeline_schedule == PipelineSchedule::interleaved);
  CHECK(i.parallel.virtual_stages == 2);
  CHECK(load_scenario_text(base + "  pipeline_schedule: gpipe\n", "p.yaml").parallel.pipeline_schedule ==
        PipelineSchedule::gpipe);
  CHECK(error_of(base + "  pipeline_schedule: zb\n") ==
        "p.yaml:8: parallel.pipeline_schedule: expected one of 1f1b, gpipe, interleaved, got 'zb'");
  CHECK(error_of(base + "  virtual_stages: 2\n") ==
        "p.yaml:8: parallel.virtual_stages: model chunks per rank (> 1) need "
        "parallel.pipeline_schedule: interleaved");
  CHECK(error_of(base + "  virtual_stages: 0\n") ==
        "p.yaml:8: parallel.virtual_stages: expected a positive integer, got '0'");
  CHECK(error_of(base + "  pipeline_schedule: interleaved\n") ==
        "p.yaml:8: parallel.pipeline_schedule: interleaved needs parallel.virtual_stages >= 2 "
        "(model chunks per rank)");
  CHECK(error_of(base + "  pipeline_schedule: interleaved\n  virtual_stages: 3\n") ==
        "p.yaml:9: parallel.virtual_stages: 4 stages x 3 chunks do not divide 16 layers");
  CHECK(error_of("model:\n  preset: gpt3-175b\nparallel:\n  pipeline_schedule: gpipe\n") ==
        "p.yaml:4: parallel.pipeline_schedule: gpipe needs parallel.pipeline > 1 (one stage "
        "runs the plain loop)");
  // --set goes through the same checks.
  CHECK_THROWS_WITH(load_scenario_text(base, "p.yaml", {{"parallel.pipeline_schedule", "1F1B"}}),
                    Catch::Contains("parallel.pipeline_schedule: expected one of"));
}

TEST_CASE("pipeline: stage 0 against Megatron-LM's theoretical memory, term by term",
          "[pipeline][megatron-theory]") {
  // The shipped scenario: GPT-3 175B, tensor 8 + SP, pipeline 8 (1F1B), selective, m = 16.
  Scenario s = load_scenario(std::string(MEMSIM_SOURCE_DIR) +
                             "/scenarios/gpt3-175b-tp8-pp8-64xh100.yaml");
  REQUIRE(s.batch.grad_accum == 16);
  const std::vector<FormulaCheck> rows = megatron_theoretical_first_stage_checks(s);
  REQUIRE(rows.size() == 6);
  for (const FormulaCheck& c : rows)
    std::printf("  %-70s %-48s formula %16.1f memsim %16.1f (%+.3f%%) %s\n", c.name.c_str(),
                c.formula.c_str(), c.expected, c.simulated, 100 * c.extra / c.expected,
                c.note.c_str());
  const double sb = 2048.0, h = 12288, t = 8, p = 8, sbh = sb * h, L = 96;
  // Layers: the formula's 34sbh/t per layer and micro-batch (96 layer-passes in flight),
  // plus LayerNorm stats, minus each in-flight micro-batch's deallocated last output.
  CHECK(rows[0].expected == Approx(34 * sbh * L / t).epsilon(1e-12));
  CHECK(rows[0].simulated == 34 * sbh * L / t + 16 * sb * L / t - p * 2 * sbh / t);
  // Embedding: the dropout mask, plus its output and the stand-ins.
  CHECK(rows[1].expected == Approx(sbh * p / t).epsilon(1e-12));
  CHECK(rows[1].simulated == p * (sbh / t + 2 * sbh / t + 2));
  // Batch tensors: token and position ids and the attention mask of 8 micro-batches.
  CHECK(rows[2].simulated == p * (8 * sb + 8 * sb + sb * sb));
  // Activations in all: within 0.5% of the formula.
  CHECK(std::abs(rows[3].extra) / rows[3].expected < 5e-3);
  // Weights + optimizer: 18 B/param of stage 0's parameters by hand (word embedding
  // 51200/8 rows, the full position embedding, 12 layers with replicated LayerNorms and
  // row-parallel biases), +0.93% over the formula, nearly all of it the position embedding.
  const double f = 49152;
  const double stage0 = 51200 / t * h + 2048 * h + 12 * ((12 * h * h + 3 * h + f) / t + 6 * h);
  CHECK(rows[4].simulated == 18 * stage0);
  CHECK(std::abs(rows[4].extra - 18 * 2048 * h) / rows[4].expected < 1e-3);
  CHECK(rows[5].simulated > rows[5].expected);

  // Fewer micro-batches than stages: min(1, m/p) of the activations.
  s.batch.grad_accum = 4;
  const auto few = megatron_theoretical_first_stage_checks(s);
  CHECK(few[0].expected == Approx(rows[0].expected / 2).epsilon(1e-12));
  CHECK(few[0].simulated == 4 * (34 * sbh * 12 / t + 16 * sb * 12 / t - 2 * sbh / t));

  // Interleaved, v = 2: the formula's penalty (1 + (p-1)/(p*v)) is exactly the layer
  // passes stage 0 holds (pv + p - 1 chunks of L/(pv) layers).
  s.batch.grad_accum = 16;
  s.parallel.pipeline_schedule = PipelineSchedule::interleaved;
  s.parallel.virtual_stages = 2;
  const auto inter = megatron_theoretical_first_stage_checks(s);
  const double passes = p * 2 + p - 1;
  CHECK(inter[0].expected == Approx(34 * sbh * L / t * (1 + 7.0 / 16)).epsilon(1e-12));
  // Every chunk pass ends in a deallocated output, except on the chunk that is not the
  // pipeline's last (all are, here: stage 0 is never last).
  CHECK(inter[0].simulated == passes * (34 * sbh * 6 / t + 16 * sb * 6 / t - 2 * sbh / t));
}

TEST_CASE("memsim run on the shipped pipeline scenario reports stage 0 of 8, JSON and text",
          "[pipeline][cli]") {
  using memsim_test::memsim_command;
  using memsim_test::run_shell;
  const std::string scenario =
      std::string(MEMSIM_SOURCE_DIR) + "/scenarios/gpt3-175b-tp8-pp8-64xh100.yaml";
  const memsim_test::CommandResult json_run =
      run_shell(memsim_command() + "run '" + scenario + "' --json - 2>/dev/null");
  REQUIRE(json_run.status == 0);  // fits
  const nlohmann::json j = nlohmann::json::parse(json_run.out);
  CHECK(j["fits"] == true);
  CHECK(j["rank"]["world_size"] == 64);
  CHECK(j["rank"]["pipeline_parallel"] == 8);
  CHECK(j["rank"]["tensor_parallel"] == 8);
  CHECK(j["rank"]["pipeline_stage"] == 0);
  CHECK(j["rank"]["index"] == 0);
  const std::string why = j["rank"]["why"];
  CHECK(why.rfind("pipeline stage 0 of 8 has the largest peak reserved", 0) == 0);
  CHECK(why.find("1f1b schedule, 16 micro-batches") != std::string::npos);
  // Stage 0 holds 8 micro-batches of 12 layers: 57.38 GiB at its first backward.
  const double gib = j["peak_allocated_bytes"].get<double>() / (1024.0 * 1024 * 1024);
  CHECK(gib == Approx(57.38).margin(0.005));
  const memsim_test::CommandResult text =
      run_shell(memsim_command() + "run '" + scenario + "' 2>/dev/null");
  CHECK(text.status == 0);
  CHECK(text.out.find("rank      global rank 0 of 64: pipeline stage 0 of 8") != std::string::npos);
  // GPipe holds all 16 micro-batches: the last stage (its cross-entropy's fp32 softmax
  // per micro-batch) is the worst, 67.44 GiB, still under the H100's 78.62 usable.
  const memsim_test::CommandResult gpipe = run_shell(
      memsim_command() + "run '" + scenario +
      "' --set parallel.pipeline_schedule=gpipe --json - 2>/dev/null");
  REQUIRE(gpipe.status == 0);
  const nlohmann::json g = nlohmann::json::parse(gpipe.out);
  CHECK(g["rank"]["pipeline_stage"] == 7);
  CHECK(g["rank"]["index"] == 56);
  // A bad value through --set: exit 2 with the key named.
  const memsim_test::CommandResult bad = run_shell(
      memsim_command() + "run '" + scenario + "' --set parallel.virtual_stages=2 2>&1");
  CHECK(bad.status != 0);
  CHECK(bad.out.find("parallel.virtual_stages: model chunks per rank") != std::string::npos);
}

TEST_CASE("3D parallelism: tensor x data (x pipeline), the distributed optimizer over the "
          "data-parallel group of a tensor-parallel rank",
          "[pipeline][3d]") {
  Scenario s = load_scenario(std::string(MEMSIM_SOURCE_DIR) + "/scenarios/gpt3-175b.yaml");
  s.model.layers = 4;
  s.parallel.tensor = 8;
  const graph::MegatronShape shape = megatron_shape(s);
  const double P = static_cast<double>(graph::megatron_parameter_count(shape));
  auto states_per_param = [&](const Scenario& sc) {
    Scenario one = sc;
    one.step.warmup_steps = 1;
    const Program program = build_megatron_program(one);
    const LiveBytes live = live_bytes_at_mark(program, "optimizer_end");
    REQUIRE(live.found_mark);
    return static_cast<double>(live.by_kind[int(TensorKind::parameter)] +
                               live.by_kind[int(TensorKind::gradient)] +
                               live.by_kind[int(TensorKind::optimizer_state)]) /
           P;
  };
  for (int64_t d : {2, 8}) {
    s.parallel.data = d;
    s.parallel.zero = 0;
    CHECK(states_per_param(s) == Approx(18.0).epsilon(1e-9));  // DDP: all-reduce in place
    const Program plain = build_program(s);
    CHECK(plain.rank.world_size == 8 * d);
    CHECK(plain.rank.why.find("tensor-parallel ranks hold equal shards") == 0);
    CHECK(plain.rank.why.find("data-parallel group") != std::string::npos);
    s.parallel.zero = 1;
    // Megatron's 6 + 12/d bytes per parameter of the tensor-parallel shard (the buffer is
    // padded to a multiple of d: at most d - 1 elements more).
    CHECK(states_per_param(s) == Approx(6.0 + 12.0 / static_cast<double>(d)).epsilon(1e-6));
    // And Megatron-LM's theoretical formula with the distributed optimizer, on all 96
    // layers (biases and the position embedding outside the formula).
    Scenario full = s;
    full.model.layers = 96;
    const FormulaCheck c = megatron_theoretical_weight_optimizer_check(full);
    std::printf("  %s: %s formula %.1f memsim %.1f (%+.3f%%)\n", c.name.c_str(), c.formula.c_str(),
                c.expected, c.simulated, 100 * c.extra / c.expected);
    CHECK(c.formula.rfind("(6 + 12/d)", 0) == 0);
    CHECK(std::abs(c.extra) / c.expected < 5e-3);
  }
  // With a pipeline too: each stage's DDP buffer sharded over the data-parallel group.
  Scenario pp = tiny(2, 4);
  pp.parallel.tensor = 2;
  pp.parallel.data = 4;
  pp.parallel.zero = 1;
  for (int64_t k = 0; k < 2; ++k) {
    Program program;
    build_megatron_stage_program(pp, {}, k, program);
    const LiveBytes live = live_bytes_at_mark(program, "optimizer_end");
    REQUIRE(live.found_mark);
    const double params = static_cast<double>(live.by_kind[int(TensorKind::parameter)]) / 2;
    const double states = static_cast<double>(live.by_kind[int(TensorKind::parameter)] +
                                              live.by_kind[int(TensorKind::gradient)] +
                                              live.by_kind[int(TensorKind::optimizer_state)]);
    CHECK(states / params == Approx(6.0 + 12.0 / 4).epsilon(1e-4));
    CHECK(program.rank.index == static_cast<int>(k * 2 * 4));
    CHECK(program.rank.world_size == 16);
  }
}

TEST_CASE("pipeline: checkpointing applies per stage, optimize plans each stage's layers",
          "[pipeline]") {
  // checkpoint.custom numbers each stage's layers from 0 (the tiny model: 2 per stage).
  Scenario s = tiny(4, 4);
  s.checkpoint.policy = CheckpointPolicy::custom;
  s.checkpoint.custom = {"1"};
  CHECK_NOTHROW(build_program(s));
  s.checkpoint.custom = {"5"};
  CHECK_THROWS_WITH(build_program(s), Catch::Contains("layer 5 does not exist") &&
                                          Catch::Contains("each stage's chunk (0-1)"));
  // Full recompute per stage keeps less than selective, which keeps less than none.
  auto peak = [](Scenario sc, CheckpointPolicy policy) {
    sc.checkpoint.policy = policy;
    sc.checkpoint.custom.clear();
    Program program;
    return build_megatron_pipeline_program(sc, {}, program).peak_reserved[0];
  };
  CHECK(peak(s, CheckpointPolicy::full) < peak(s, CheckpointPolicy::selective));
  CHECK(peak(s, CheckpointPolicy::selective) < peak(s, CheckpointPolicy::none));
  // memsim optimize no longer refuses: its plan covers one stage's layers (2 here) and the
  // budget holds on both stages (tests/test_optimize_pipeline.cpp).
  Scenario o = tiny(2, 2);
  const OptimizeResult r = optimize_checkpointing(o, default_script(o), 1ull << 30, {});
  CHECK(r.fits);
  CHECK(r.plan.layers.size() == 4);
  CHECK(r.stages.size() == 2);
}

TEST_CASE("untied output layer: its own weight (one GPU), on a pipeline the same bytes as "
          "the tied last stage's shared copy",
          "[pipeline][megatron]") {
  Scenario s = tiny(1, 1);
  Program tied_one;
  build_megatron_program(s, {}, tied_one, nullptr);
  s.model.tied_embeddings = false;
  Program untied_one;
  build_megatron_program(s, {}, untied_one, nullptr);
  CHECK(bytes_of_kind(untied_one, TensorKind::parameter) ==
        bytes_of_kind(tied_one, TensorKind::parameter) + 2 * 1000 * 256);
  CHECK(static_cast<uint64_t>(graph::megatron_parameter_count(megatron_shape(s))) * 2 ==
        bytes_of_kind(untied_one, TensorKind::parameter));
  // Theoretical formula, untied and pipeline 1: a second V_pad*h matrix.
  Scenario g = load_scenario(std::string(MEMSIM_SOURCE_DIR) + "/scenarios/gpt3-175b.yaml");
  g.parallel.tensor = 8;
  g.model.tied_embeddings = false;
  g.model.layers = 96;
  const FormulaCheck c = megatron_theoretical_weight_optimizer_check(g);
  CHECK(std::abs(c.extra) / c.expected < 5e-3);
  for (int64_t k : {0, 3}) {
    Scenario tied = tiny(4, 4), untied = tiny(4, 4);
    untied.model.tied_embeddings = false;
    Program a, b;
    build_megatron_stage_program(tied, {}, k, a);
    build_megatron_stage_program(untied, {}, k, b);
    CHECK(bytes_of_kind(a, TensorKind::parameter) == bytes_of_kind(b, TensorKind::parameter));
  }
}
