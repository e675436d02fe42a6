// Activation checkpointing (graph/checkpoint.h, sim/step/checkpoint_policy.h): recomputation
// semantics on a small cs336 model, policy parsing, and the optimizer against brute force.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>

#include "graph/models/cs336.h"
#include "sim/analysis/analysis.h"
#include "sim/search/optimize.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"

using namespace memsim;
using graph::CheckpointPlan;
using graph::LayerCheckpoint;

namespace {

// Four layers of d_model 64 at sequence 64: activations dominate, runs in milliseconds.
Scenario small(int64_t layers = 4, int64_t seq = 64) {
  Scenario s;
  s.name = "checkpoint test";
  s.model.family = ModelFamily::cs336;
  s.model.layers = layers;
  s.model.d_model = 64;
  s.model.heads = 4;
  s.model.kv_heads = 4;
  s.model.d_ff = 172;
  s.model.vocab = 96;
  s.model.context_length = seq;
  s.batch.micro_batch = 2;
  s.batch.seq_len = seq;
  s.optimizer.impl = OptimizerImpl::foreach;
  s.step.warmup_steps = 1;
  s.device.cublas_workspace = 0;
  s.device.kernel_scratch = false;
  return s;
}

Scenario with_policy(Scenario s, const std::string& spec) {
  s.checkpoint = parse_policy(spec);
  return s;
}

size_t mark_index(const Program& p, const std::string& name) {
  size_t found = SIZE_MAX;
  for (size_t i = 0; i < p.events.size(); ++i)
    if (p.events[i].type == EventType::mark && p.str(static_cast<uint32_t>(p.events[i].bytes)) == name)
      found = i;
  return found;
}

// Requested bytes live right after event `at`; with `layer_of` set, only tensors the
// measured step's forward allocated in that layer (-2: any layer, all phases).
uint64_t live_bytes(const Program& p, size_t at, int32_t layer = -2) {
  const size_t begin = mark_index(p, "measured_step_begin");
  std::vector<uint8_t> alive(p.tensors.size(), 0);
  std::vector<int32_t> where(p.tensors.size(), -3);
  for (size_t i = 0; i <= at && i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc) {
      alive[e.tensor] = 1;
      where[e.tensor] = (i > begin && e.phase == Phase::forward) ? e.layer : -3;
    } else if (e.type == EventType::free) {
      alive[e.tensor] = 0;
    }
  }
  uint64_t sum = 0;
  for (size_t t = 0; t < p.tensors.size(); ++t)
    if (alive[t] && (layer == -2 || where[t] == layer)) sum += p.tensors[t].bytes;
  return sum;
}

Analysis run(const Program& p) {
  SimulatedDevice device(1ull << 50, 0);
  return analyze(p, execute(p, AllocatorConfig{}, device));
}

uint64_t act_bytes(const Scenario& s) {
  return static_cast<uint64_t>(s.batch.micro_batch * s.batch.seq_len * s.model.d_model * 4);
}

}  // namespace

TEST_CASE("full checkpointing keeps only each layer's input at the end of forward", "[checkpoint]") {
  const Scenario s = small();
  const Program none = build_program(s);
  const Program full = build_program(with_policy(s, "full"));
  const size_t fe_none = mark_index(none, "forward_end"), fe_full = mark_index(full, "forward_end");
  for (int32_t l = 0; l < 4; ++l) {
    // Layer l leaves only its output alive: the next region's input (or the final norm's).
    CHECK(live_bytes(full, fe_full, l) == act_bytes(s));
    CHECK(live_bytes(none, fe_none, l) > 10 * act_bytes(s));
  }
  // Everything outside the layers is the same.
  const uint64_t layers_none = [&] {
    uint64_t sum = 0;
    for (int32_t l = 0; l < 4; ++l) sum += live_bytes(none, fe_none, l);
    return sum;
  }();
  CHECK(live_bytes(full, fe_full) == live_bytes(none, fe_none) - layers_none + 4 * act_bytes(s));
  // Nothing leaks: after the step the same bytes are live.
  CHECK(live_bytes(full, full.events.size() - 1) == live_bytes(none, none.events.size() - 1));
}

TEST_CASE("checkpointing orders peaks full < uniform:2 < none", "[checkpoint]") {
  const Scenario s = small(4, 128);
  const Analysis none = run(build_program(s));
  const Analysis full = run(build_program(with_policy(s, "full")));
  const Analysis uni2 = run(build_program(with_policy(s, "uniform:2")));
  CHECK(full.peak_allocated < uni2.peak_allocated);
  CHECK(uni2.peak_allocated < none.peak_allocated);
  CHECK(full.breakdown_at_peak.activations < none.breakdown_at_peak.activations);
  CHECK(none.flops.recompute == 0);
  CHECK(full.flops.recompute > 0);
}

TEST_CASE("recompute FLOPs are the forward FLOPs of the checkpointed regions", "[checkpoint]") {
  const Scenario s = small();
  const Program none = build_program(s);
  const double B = 2, S = 64, D = 64, V = 96, H = 4, hd = 16, F = 172;
  const double steps = 2;  // one warm-up + the measured step
  const double head = 2 * B * S * D * V;
  const double attention_core = 2 * (2 * B * H * S * S * hd);
  const double mlp = 3 * 2 * B * S * D * F;
  const double layer = none.flops.forward / steps / 4 - head / 4;
  REQUIRE(layer > mlp + attention_core);
  auto recompute = [&](const std::string& spec, bool early_stop) {
    const Scenario c = with_policy(s, spec);
    TrainingScript t = default_script(c);
    t.checkpoint_early_stop = early_stop;
    const Program p = build_program(c, t);
    CHECK(p.flops.forward == Approx(none.flops.forward));  // forward unchanged
    return p.flops.recompute / steps;
  };
  CHECK(recompute("full", false) == Approx(4 * layer));
  CHECK(recompute("uniform:2", false) == Approx(4 * layer));
  CHECK(recompute("block:1", false) == Approx(layer));
  CHECK(recompute("modules", false) == Approx(4 * layer));
  CHECK(recompute("modules:mlp", false) == Approx(4 * mlp));
  CHECK(recompute("selective", false) == Approx(4 * attention_core));
  CHECK(recompute("custom:1,3.mlp", false) == Approx(layer + mlp));
  // Early stop skips the trailing ops after the last saved tensor (never more work).
  CHECK(recompute("full", true) <= recompute("full", false));
  CHECK(recompute("selective", true) <= recompute("selective", false));
}

TEST_CASE("recomputation happens once per region, in backward, with forward op names", "[checkpoint]") {
  const Scenario s = with_policy(small(), "full");
  const Program p = build_program(s);
  size_t recomputed_bmm = 0;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && e.phase == Phase::backward && p.str(e.op) == "bmm") ++recomputed_bmm;
  // Two steps x four layers x (QK^T, attn·V) score-sized bmm outputs.
  CHECK(recomputed_bmm == 2 * 4 * 2);
  // Every policy frees what it allocates by the end of the step.
  for (const char* spec : {"uniform:2", "block:2", "modules", "modules:attention", "selective", "sqrt",
                           "custom:0,2.attention,3.mlp"}) {
    INFO(spec);
    const Program q = build_program(with_policy(small(), spec));
    const Program n = build_program(small());
    CHECK(live_bytes(q, q.events.size() - 1) == live_bytes(n, n.events.size() - 1));
  }
}

TEST_CASE("policy specs", "[checkpoint]") {
  CHECK(split_policies("none,full,uniform:2,modules:attention,mlp,selective,custom:0,3.mlp,sqrt") ==
        std::vector<std::string>{"none", "full", "uniform:2", "modules:attention,mlp", "selective",
                                 "custom:0,3.mlp", "sqrt"});
  CHECK(policy_label(parse_policy("uniform:3")) == "uniform:3");
  CHECK(policy_label(parse_policy("custom:0,3.mlp")) == "custom:0,3.mlp");
  CHECK_THROWS_AS(parse_policy("uniform"), PolicyError);
  CHECK_THROWS_AS(parse_policy("everything"), PolicyError);
  CHECK_THROWS_AS(parse_policy("full:2"), PolicyError);
  CHECK_THROWS_AS(make_plan(parse_policy("custom:9"), 4), PolicyError);
  CHECK_THROWS_AS(make_plan(parse_policy("custom:1.selective,1.mlp"), 4), PolicyError);

  const CheckpointPlan u = make_plan(parse_policy("uniform:2"), 5);
  CHECK(u.layers == std::vector<LayerCheckpoint>(5, LayerCheckpoint::layer));
  CHECK(u.segment == std::vector<int32_t>{0, 0, 1, 1, 2});
  CHECK(make_plan(parse_policy("sqrt"), 16).segment[4] == 1);
  const CheckpointPlan b = make_plan(parse_policy("block:2"), 4);
  CHECK(b.layers == std::vector<LayerCheckpoint>{LayerCheckpoint::layer, LayerCheckpoint::layer,
                                                  LayerCheckpoint::keep, LayerCheckpoint::keep});
  const CheckpointPlan m = make_plan(parse_policy("custom:attention,2.mlp,3"), 4);
  CHECK(m.layers == std::vector<LayerCheckpoint>{LayerCheckpoint::attention, LayerCheckpoint::attention,
                                                  LayerCheckpoint::modules, LayerCheckpoint::layer});
  // A plan survives the round trip through a scenario's checkpoint section.
  CHECK(make_plan(config_for_plan(m), 4).layers == m.layers);
}

namespace {

// All plans over `choices`, simulated on a device of `budget`: the least recompute that fits.
struct Brute {
  bool fits = false;
  double recompute = 0;
};
Brute brute_force(const Scenario& s, const std::vector<LayerCheckpoint>& choices, uint64_t budget) {
  Brute best;
  const int32_t L = static_cast<int32_t>(s.model.layers);
  CheckpointPlan plan;
  plan.layers.assign(L, LayerCheckpoint::keep);
  std::function<void(int32_t)> rec = [&](int32_t l) {
    if (l == L) {
      const PlanRun r = simulate_plan(s, default_script(s), plan, budget);
      if (r.analysis.fits() && (!best.fits || r.analysis.flops.recompute < best.recompute)) {
        best.fits = true;
        best.recompute = r.analysis.flops.recompute;
      }
      return;
    }
    for (LayerCheckpoint c : choices) {
      plan.layers[l] = c;
      rec(l + 1);
    }
  };
  rec(0);
  return best;
}

void check_against_brute_force(const Scenario& s, const std::vector<LayerCheckpoint>& choices,
                               const std::vector<double>& fractions) {
  const TrainingScript script = default_script(s);
  CheckpointPlan all_keep, all_layer;
  all_keep.layers.assign(s.model.layers, LayerCheckpoint::keep);
  all_layer.layers.assign(s.model.layers, LayerCheckpoint::layer);
  const uint64_t hi = simulate_plan(s, script, all_keep, 0).analysis.peak_reserved;
  const uint64_t lo = simulate_plan(s, script, all_layer, 0).analysis.peak_reserved;
  OptimizeOptions options;
  options.choices = choices;
  options.exact_steps = 1000;  // walk the whole front: exact against brute force
  options.max_verifications = 1000;
  for (double f : fractions) {
    const uint64_t budget = lo + static_cast<uint64_t>(f * static_cast<double>(hi - lo));
    INFO("budget " << budget << " (" << f << " between " << lo << " and " << hi << ")");
    const Brute brute = brute_force(s, choices, budget);
    const OptimizeResult opt = optimize_checkpointing(s, script, budget, options);
    REQUIRE(opt.fits == brute.fits);
    if (!brute.fits) continue;
    CHECK(opt.run.analysis.peak_reserved <= budget);
    CHECK(opt.run.analysis.flops.recompute == Approx(brute.recompute).epsilon(1e-9));
  }
}

}  // namespace

TEST_CASE("the cost model is exact for requested bytes of mixed plans", "[optimize]") {
  const Scenario s = small(5);
  const TrainingScript script = default_script(s);
  const OptimizeOptions o;
  const LayerCosts costs = calibrate(s, script, o.choices);
  CheckpointPlan plan;
  plan.layers = {LayerCheckpoint::layer, LayerCheckpoint::keep, LayerCheckpoint::attention,
                 LayerCheckpoint::core_attention, LayerCheckpoint::mlp};
  const Program p = build_program(
      [&] { Scenario c = s; c.checkpoint = config_for_plan(plan); return c; }(), script);
  // The measured step's highest live bytes, rounded as the model rounds.
  const size_t begin = mark_index(p, "measured_step_begin");
  int64_t live = 0, peak = 0;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    auto r = [](uint64_t b) { return b == 0 ? 0 : static_cast<int64_t>((std::max<uint64_t>(b, 1) + 511) / 512 * 512); };
    if (e.type == EventType::alloc) live += r(e.bytes);
    if (e.type == EventType::free) live -= r(p.tensors[e.tensor].bytes);
    if (i > begin) peak = std::max(peak, live);
  }
  CHECK(model_peak(costs, plan) == peak);
}

TEST_CASE("optimize matches brute force over all plans (4 layers, 6 choices)", "[optimize]") {
  check_against_brute_force(small(4), OptimizeOptions{}.choices, {0.05, 0.3, 0.6, 0.9});
}

TEST_CASE("optimize matches brute force (6 layers, keep/attention/mlp/layer)", "[optimize]") {
  check_against_brute_force(small(6, 96),
                            {LayerCheckpoint::keep, LayerCheckpoint::attention, LayerCheckpoint::mlp,
                             LayerCheckpoint::layer},
                            {0.2, 0.5, 0.8});
}

TEST_CASE("optimize reports the smallest peak when nothing fits", "[optimize]") {
  const Scenario s = small(4);
  const OptimizeResult r = optimize_checkpointing(s, default_script(s), 1 << 20);
  CHECK_FALSE(r.fits);
  CHECK(r.run.analysis.fits());  // simulated without a limit
  CHECK(r.run.analysis.peak_reserved > (1u << 20));
  CHECK(r.plan.layers.size() == 4);
}
