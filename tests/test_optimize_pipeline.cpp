// memsim optimize on pipeline-parallel megatron scenarios (sim/search/optimize_pipeline.h): the
// cost model against simulated stages, the dynamic program against enumeration of the
// model, the whole optimisation against brute force through the allocator on every stage,
// the shipped GPT-3 t8 x p8 scenario and the CLI.
#include <catch2/catch.hpp>

#include <algorithm>
#include <climits>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron_pipeline_test_support.h"
#include "allocator/caching_allocator.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/execute.h"
#include "sim/megatron/megatron_pipeline.h"
#include "sim/megatron/megatron_recompute_flags.h"
#include "sim/search/optimize.h"
#include "sim/search/optimize_pipeline.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "tests/cli_test_support.h"
#include "test_paths.h"

using namespace memsim;
using graph::CheckpointPlan;
using graph::LayerCheckpoint;

namespace {

Scenario tiny(int64_t layers, int64_t pipeline, int64_t micro_batches,
              PipelineSchedule schedule = PipelineSchedule::one_f_one_b, int64_t v = 1) {
  return memsim_test::tiny_pipeline(layers, pipeline, micro_batches, schedule, v);
}

Scenario planned(const Scenario& s, const CheckpointPlan& plan) {
  Scenario out = s;
  out.checkpoint = config_for_plan(plan);
  return out;
}

// The measured step's highest live bytes of one stage, rounded as the model rounds.
int64_t rounded_peak(const Program& p) {
  auto r = [](uint64_t b) {
    return b == 0 ? int64_t{0} : static_cast<int64_t>(std::max<uint64_t>((b + 511) / 512 * 512, 512));
  };
  int64_t live = 0, peak = 0;
  bool measured = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measured = true;
    if (e.type == EventType::alloc) live += r(e.bytes);
    if (e.type == EventType::free) live -= r(p.tensors[e.tensor].bytes);
    if (measured) peak = std::max(peak, live);
  }
  return peak;
}

int64_t stages_rounded_peak(const Scenario& s, const CheckpointPlan& plan) {
  int64_t peak = 0;
  Program p;
  for (int64_t k = 0; k < s.parallel.pipeline; ++k) {
    build_megatron_stage_program(planned(s, plan), {}, k, p);
    peak = std::max(peak, rounded_peak(p));
  }
  return peak;
}

// A plan on every stage, run through the allocator with `capacity` (0 = unlimited).
struct StagesRun {
  bool fits = true;
  double recompute = 0;
  uint64_t peak_reserved = 0;
};
StagesRun run_stages(const Scenario& s, const CheckpointPlan& plan, uint64_t capacity) {
  StagesRun out;
  Program p;
  for (int64_t k = 0; k < s.parallel.pipeline; ++k) {
    build_megatron_stage_program(planned(s, plan), {}, k, p);
    SimulatedDevice device(capacity == 0 ? (1ull << 60) : capacity, 0);
    ExecuteOptions o;
    o.record_by_kind = false;
    const Timeline t = execute(p, s.allocator, device, o);
    out.fits = out.fits && !t.oom.has_value();
    out.recompute += p.flops.recompute;
    out.peak_reserved =
        std::max(out.peak_reserved, static_cast<uint64_t>(t.final_stats.reserved_bytes.all.peak));
  }
  return out;
}

CheckpointPlan uniform(int64_t layers, LayerCheckpoint c) {
  CheckpointPlan plan;
  plan.layers.assign(static_cast<size_t>(layers), c);
  return plan;
}

// Every plan over `choices` for `layers` local layers.
void for_each_plan(int64_t layers, const std::vector<LayerCheckpoint>& choices,
                   const std::function<void(const CheckpointPlan&)>& fn) {
  CheckpointPlan plan = uniform(layers, LayerCheckpoint::keep);
  std::function<void(int64_t)> rec = [&](int64_t l) {
    if (l == layers) return fn(plan);
    for (LayerCheckpoint c : choices) {
      plan.layers[static_cast<size_t>(l)] = c;
      rec(l + 1);
    }
  };
  rec(0);
}

int64_t local_layers(const Scenario& s) {
  const int64_t v =
      s.parallel.pipeline_schedule == PipelineSchedule::interleaved ? s.parallel.virtual_stages : 1;
  return s.model.layers / (s.parallel.pipeline * v);
}

}  // namespace

TEST_CASE("pipeline cost model: a lower bound of requested bytes, exact but for the held attention mask, on every schedule",
          "[optimize][pipeline]") {
  const std::vector<Scenario> cases = {
      tiny(12, 4, 6),                                      // 1F1B, stage k holds 4 - k
      tiny(12, 4, 3),                                      // fewer micro-batches than stages
      tiny(12, 3, 4, PipelineSchedule::gpipe),             // all 4 held
      tiny(16, 2, 4, PipelineSchedule::interleaved, 2),    // 2 chunks per rank
      tiny(4, 4, 6),                                       // one layer per stage
      tiny(8, 2, 4, PipelineSchedule::interleaved, 4),     // one layer per chunk
      [] {  // measured from the first step: the mpu buffer is allocated inside layer 0
        Scenario s = tiny(4, 4, 6);
        s.step.warmup_steps = 0;
        return s;
      }(),
  };
  const OptimizeOptions o;
  for (const Scenario& s : cases) {
    INFO(to_string(s.parallel.pipeline_schedule) << " p" << s.parallel.pipeline << " m"
                                                 << s.batch.grad_accum);
    const PipelineCosts costs = calibrate_pipeline(s, o.choices);
    REQUIRE(costs.layers == local_layers(s));
    CHECK(costs.depth > 1);
    CHECK(calibrate_pipeline(s, o.choices).window == costs.window);  // deterministic
    // Uniform plans (the calibration's own) and mixed ones.
    std::vector<CheckpointPlan> plans;
    for (LayerCheckpoint c : o.choices) plans.push_back(uniform(costs.layers, c));
    CheckpointPlan keep_mlp = uniform(costs.layers, LayerCheckpoint::keep);
    keep_mlp.layers.back() = LayerCheckpoint::mlp;
    plans.push_back(keep_mlp);
    const LayerCheckpoint mix[] = {LayerCheckpoint::layer, LayerCheckpoint::keep,
                                   LayerCheckpoint::attention, LayerCheckpoint::core_attention,
                                   LayerCheckpoint::mlp, LayerCheckpoint::modules};
    for (int shift = 0; shift < 3; ++shift) {
      CheckpointPlan p = uniform(costs.layers, LayerCheckpoint::keep);
      for (int32_t l = 0; l < costs.layers; ++l) p.layers[l] = mix[(l + shift) % 6];
      plans.push_back(p);
    }
    // A region that takes the attention mask as input (core attention, the attention
    // half, the whole layer) keeps it while its micro-batch is in flight: one b*s^2 bool
    // tensor per micro-batch on the first and last stages, held once however many layers
    // keep it, and not a layer's tensor. The model charges it only inside the layers that
    // hold it, so it stays a lower bound, within that tensor per micro-batch held.
    const int64_t mask = s.batch.micro_batch * s.batch.seq_len * s.batch.seq_len;
    for (const CheckpointPlan& p : plans) {
      INFO(describe_plan(p));
      const int64_t model = pipeline_model_peak(costs, p);
      const int64_t simulated = stages_rounded_peak(s, p);
      CHECK(model <= simulated);
      CHECK(simulated - model <= costs.depth * mask);
      const bool holds_mask = std::any_of(p.layers.begin(), p.layers.end(), [](LayerCheckpoint c) {
        return c != LayerCheckpoint::keep && c != LayerCheckpoint::mlp;
      });
      if (!holds_mask) CHECK(model == simulated);
    }
  }
}

TEST_CASE("pipeline search: the dynamic program finds the model's optimum (enumeration)",
          "[optimize][pipeline]") {
  const Scenario s = tiny(16, 4, 6);  // 4 local layers: 6^4 plans
  const OptimizeOptions o;
  const PipelineCosts costs = calibrate_pipeline(s, o.choices);
  const int64_t lo = pipeline_model_peak(costs, uniform(4, LayerCheckpoint::layer));
  const int64_t hi = pipeline_model_peak(costs, uniform(4, LayerCheckpoint::keep));
  REQUIRE(lo < hi);
  for (int i = -1; i <= 20; ++i) {
    const int64_t bound = lo + (hi - lo) * i / 20;
    INFO("bound " << bound);
    bool any = false;
    int64_t best_r = INT64_MAX, best_peak = INT64_MAX;
    for_each_plan(4, o.choices, [&](const CheckpointPlan& p) {
      const int64_t peak = pipeline_model_peak(costs, p);
      if (peak > bound) return;
      int64_t r = 0;
      for (LayerCheckpoint c : p.layers)
        r += costs.flops[std::find(o.choices.begin(), o.choices.end(), c) - o.choices.begin()];
      if (!any || r < best_r || (r == best_r && peak < best_peak)) {
        any = true;
        best_r = r;
        best_peak = peak;
      }
    });
    const SearchResult r = search_pipeline_plan(costs, bound);
    REQUIRE(r.feasible == any);
    if (!any) continue;
    CHECK(r.recompute == best_r);
    CHECK(r.peak == best_peak);
    CHECK(pipeline_model_peak(costs, r.plan) == r.peak);
  }
  CHECK(smallest_pipeline_peak_plan(costs).peak == lo);
}

namespace {

// All plans simulated on every stage with the budget: the least recompute that fits.
void check_against_brute_force(const Scenario& s, const std::vector<LayerCheckpoint>& choices,
                               const std::vector<double>& fractions, int64_t exact_max_plans) {
  const int64_t L = local_layers(s);
  const uint64_t hi = run_stages(s, uniform(L, LayerCheckpoint::keep), 0).peak_reserved;
  const uint64_t lo = run_stages(s, uniform(L, LayerCheckpoint::layer), 0).peak_reserved;
  REQUIRE(lo < hi);
  OptimizeOptions options;
  options.choices = choices;
  options.exact_steps = 1000;  // walk the whole front
  options.max_verifications = 1000;
  options.exact_max_plans = exact_max_plans;
  for (double f : fractions) {
    const uint64_t budget = lo + static_cast<uint64_t>(f * static_cast<double>(hi - lo));
    INFO("budget " << budget << " (" << f << " between " << lo << " and " << hi << ")");
    bool fits = false;
    double best = 0;
    for_each_plan(L, choices, [&](const CheckpointPlan& p) {
      const StagesRun r = run_stages(s, p, budget);
      if (r.fits && (!fits || r.recompute < best)) {
        fits = true;
        best = r.recompute;
      }
    });
    const OptimizeResult opt = optimize_checkpointing(s, default_script(s), budget, options);
    REQUIRE(opt.fits == fits);
    REQUIRE(opt.stages.size() == static_cast<size_t>(s.parallel.pipeline));
    if (!fits) continue;
    CHECK(opt.flops.recompute == Approx(best).epsilon(1e-9));
    // The budget holds on every stage, and the reported peaks are the plan's.
    const StagesRun check = run_stages(s, opt.plan, budget);
    CHECK(check.fits);
    for (const StagePeak& st : opt.stages) {
      CHECK(st.fits);
      CHECK(st.peak_reserved <= budget);
    }
    CHECK(opt.run.analysis.peak_reserved == check.peak_reserved);
    CHECK(opt.run.analysis.peak_reserved ==
          opt.stages[static_cast<size_t>(opt.worst_stage)].peak_reserved);
  }
}

}  // namespace

TEST_CASE("pipeline optimize matches brute force through the allocator on every stage "
          "(1F1B, 3 local layers, 6 choices)",
          "[optimize][pipeline]") {
  check_against_brute_force(tiny(12, 4, 6), OptimizeOptions{}.choices, {0.05, 0.3, 0.6, 0.9},
                            OptimizeOptions{}.exact_max_plans);
}

TEST_CASE("pipeline optimize matches brute force with the front walk (no enumeration, "
          "4 local layers, keep/attention/mlp/layer)",
          "[optimize][pipeline]") {
  check_against_brute_force(tiny(16, 4, 5),
                            {LayerCheckpoint::keep, LayerCheckpoint::attention,
                             LayerCheckpoint::mlp, LayerCheckpoint::layer},
                            {0.1, 0.4, 0.7}, 0);
}

TEST_CASE("pipeline optimize matches brute force on the gpipe and interleaved schedules",
          "[optimize][pipeline]") {
  check_against_brute_force(tiny(9, 3, 4, PipelineSchedule::gpipe), OptimizeOptions{}.choices,
                            {0.2, 0.6}, OptimizeOptions{}.exact_max_plans);
  check_against_brute_force(tiny(12, 2, 4, PipelineSchedule::interleaved, 2),
                            OptimizeOptions{}.choices, {0.2, 0.6}, 0);
}

TEST_CASE("pipeline optimize: nothing fits reports the smallest peak on every stage",
          "[optimize][pipeline]") {
  const Scenario s = tiny(12, 4, 6);
  const OptimizeResult r = optimize_checkpointing(s, default_script(s), 1 << 20);
  CHECK_FALSE(r.fits);
  CHECK(r.run.analysis.fits());  // simulated without a limit
  CHECK(r.run.analysis.peak_reserved > (1u << 20));
  CHECK(r.plan.layers.size() == 3);
  REQUIRE(r.stages.size() == 4);
  for (const StagePeak& st : r.stages) CHECK(st.peak_reserved <= r.run.analysis.peak_reserved);
}

TEST_CASE("pipeline optimize on GPT-3 175B t8 x p8 (1F1B, 16 micro-batches): the budget "
          "holds on every stage, stage 0 needs the most",
          "[optimize][pipeline]") {
  const Scenario s =
      load_scenario(std::string(MEMSIM_SOURCE_DIR) + "/scenarios/gpt3-175b-tp8-pp8-64xh100.yaml");
  const uint64_t GiB = 1ull << 30;
  double last_recompute = -1;
  for (uint64_t budget : {60 * GiB, 52 * GiB}) {
    INFO("budget " << budget / GiB << " GiB");
    const OptimizeResult r = optimize_checkpointing(s, default_script(s), budget);
    REQUIRE(r.fits);
    REQUIRE(r.plan.layers.size() == 12);  // 96 layers / 8 stages
    REQUIRE(r.stages.size() == 8);
    CHECK(r.worst_stage == 0);
    for (const StagePeak& st : r.stages) {
      CHECK(st.fits);
      CHECK(st.peak_reserved <= budget);
      // Stage 0 holds 8 micro-batches, stage k 8 - k (the last adds its loss).
      if (st.stage > 0) CHECK(st.peak_reserved < r.stages[0].peak_reserved);
    }
    // Written into the scenario and run the ordinary way (the worst stage is reported),
    // the plan gives the same peak.
    Scenario p = s;
    p.checkpoint = config_for_plan(r.plan);
    p.checkpoint.reentrant = s.checkpoint.reentrant;
    Program program;
    const PipelineStagePeaks peaks = build_megatron_pipeline_program(p, {}, program);
    for (size_t k = 0; k < 8; ++k) CHECK(peaks.peak_reserved[k] <= budget);
    // A tighter budget costs more recomputation.
    CHECK(r.flops.recompute > last_recompute);
    last_recompute = r.flops.recompute;
  }
}

TEST_CASE("memsim optimize on a pipeline scenario: per-stage peaks in the text and JSON",
          "[optimize][pipeline][cli]") {
  const std::string file = std::string(MEMSIM_SOURCE_DIR) + "/scenarios/gpt3-175b-tp8-pp8-64xh100.yaml";
  const auto ok = memsim_test::run_shell(memsim_test::memsim_command() + "optimize '" + file +
                                         "' --budget 56GiB --json - 2>/dev/null");
  REQUIRE(ok.status == 0);
  const nlohmann::json j = nlohmann::json::parse(ok.out);
  CHECK(j["found"] == true);
  CHECK(j["plan"]["layers"].size() == 12);
  REQUIRE(j["pipeline"]["stages"].size() == 8);
  CHECK(j["pipeline"]["worst_stage"] == 0);
  for (const auto& st : j["pipeline"]["stages"]) {
    CHECK(st["fits"] == true);
    CHECK(st["peak_reserved_bytes"].get<uint64_t>() <= 56ull << 30);
  }
  CHECK(j["peak_reserved_bytes"] == j["pipeline"]["stages"][0]["peak_reserved_bytes"]);
  CHECK(j["recompute_share"].get<double>() > 0);

  const auto text = memsim_test::run_shell(memsim_test::memsim_command() + "optimize '" + file +
                                           "' --budget 56GiB 2>/dev/null");
  CHECK(text.status == 0);
  CHECK(text.out.find("plan applies to each stage's 12 local layers") != std::string::npos);
  CHECK(text.out.find("stage 7") != std::string::npos);
  CHECK(text.out.find("megatron: ") != std::string::npos);
  // Nothing fits: the existing verdict (exit 3), the smallest peak reported.
  const auto none = memsim_test::run_shell(memsim_test::memsim_command() + "optimize '" + file +
                                           "' --budget 40GiB 2>/dev/null");
  CHECK(none.status == 3);
  CHECK(none.out.find("nothing fits") != std::string::npos);
}

TEST_CASE("Megatron's stock recompute flags for a plan, when they exist", "[optimize][pipeline]") {
  auto plan = [](std::vector<LayerCheckpoint> l) {
    CheckpointPlan p;
    p.layers = std::move(l);
    return p;
  };
  using C = LayerCheckpoint;
  CHECK(megatron_recompute_flags(plan({C::keep, C::keep})) == std::string());
  CHECK(megatron_recompute_flags(plan({C::core_attention, C::core_attention})) ==
        std::string("--recompute-granularity selective"));
  CHECK(megatron_recompute_flags(plan({C::layer, C::layer, C::keep})) ==
        std::string("--recompute-granularity full --recompute-method block --recompute-num-layers 2"));
  CHECK(megatron_recompute_flags(plan({C::layer, C::layer})) ==
        std::string("--recompute-granularity full --recompute-method block --recompute-num-layers 2"));
  CHECK_FALSE(megatron_recompute_flags(plan({C::layer, C::core_attention})).has_value());
  CHECK_FALSE(megatron_recompute_flags(plan({C::keep, C::layer})).has_value());
  CHECK_FALSE(megatron_recompute_flags(plan({C::attention, C::attention})).has_value());
}
