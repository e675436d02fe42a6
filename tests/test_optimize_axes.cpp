// memsim optimize --objective over all its axes (issue #18 item 2; sim/search/config_search.h):
// micro-batch x accumulation, optimizer implementation and 8-bit, loss chunking, expandable
// segments, activation offload. Property, over random small scenarios and budgets: the
// answer is never "nothing fits" while a configuration the search covers fits, and it is
// at least as good as each single-axis variant of the scenario run as `compare` runs a
// policy (parse_policy into the scenario, build_program, execute on an allocator that may
// use exactly the budget): for objective time no slower than any fitting variant under
// checkpoint policy none or full, for objective memory no larger than any fitting variant
// under policy none. The oracle shares nothing with the search but the simulator.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "scenario/loss_impl.h"
#include "scenario/scenario_checkpoint.h"
#include "scenario/scenario_family.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/step_time.h"
#include "sim/search/config_search.h"
#include "sim/search/offload_search.h"
#include "sim/step/execute.h"
#include "sim/step/modelled_features.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

Scenario random_scenario(std::mt19937& rng) {
  auto pick = [&rng](std::initializer_list<int64_t> v) {
    return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng));
  };
  Scenario s;
  s.name = "config search property";
  const int64_t family = pick({0, 1, 2});
  s.model.family = family == 0 ? ModelFamily::cs336 : family == 1 ? ModelFamily::hf_gpt2 : ModelFamily::hf_llama;
  s.model.layers = pick({2, 3, 4});
  s.model.d_model = pick({32, 64});
  s.model.heads = pick({2, 4});
  s.model.kv_heads = s.model.family == ModelFamily::hf_llama ? pick({1, 2}) : s.model.heads;
  s.model.d_ff = pick({64, 172});
  s.model.vocab = pick({64, 200});
  s.batch.seq_len = pick({32, 64});
  s.model.context_length = s.batch.seq_len;
  s.model.tied_embeddings = s.model.family == ModelFamily::hf_gpt2;
  s.batch.micro_batch = 2;
  s.batch.grad_accum = 2;
  s.step.warmup_steps = 1;
  s.device = *find_device_preset("h100-80gb");
  s.device.cublas_workspace = 0;
  return s;
}

struct Oracle {
  bool fits = false;
  uint64_t reserved = 0;
  StepTime time;
};

// compare's path: the scenario with one policy, on an allocator limited to the budget.
Oracle run(Scenario s, const std::string& policy, uint64_t budget) {
  s.checkpoint = parse_policy(policy);
  const Program p = build_program(s);
  SimulatedDevice device(budget, 0);
  const Timeline t = execute(p, s.allocator, device);
  Oracle o;
  o.fits = !t.oom.has_value();
  o.reserved = analyze(p, t).peak_reserved;
  o.time = estimate_step_time(p.cost, s.device);
  return o;
}

// The scenario's single-axis variants that memsim models (the oracle's configurations).
std::vector<Scenario> variants(const Scenario& base, int64_t global) {
  std::vector<Scenario> out;
  for (int64_t m : {1, 2, 4}) {
    Scenario s = base;
    s.batch.micro_batch = m;
    s.batch.grad_accum = global / m;
    out.push_back(s);
  }
  for (OptimizerImpl impl : {OptimizerImpl::for_loop, OptimizerImpl::fused}) {
    Scenario s = base;
    s.optimizer.impl = impl;
    out.push_back(s);
  }
  if (family_row(base.model.family).adam8bit) {
    Scenario s = base;
    s.optimizer.type = OptimizerType::adamw8bit;
    out.push_back(s);
  }
  if (loss_impl_refusal(base.model.family, LossFunction::chunked).empty()) {
    Scenario s = base;
    s.loss.impl = LossFunction::chunked;
    s.loss.chunks = 8;
    out.push_back(s);
  }
  Scenario e = base;
  e.allocator.expandable_segments = true;
  out.push_back(e);
  return out;
}

}  // namespace

TEST_CASE("optimize --objective covers every axis and beats each single-axis variant",
          "[optimize][time][axes]") {
  std::mt19937 rng(20261127);
  int fitting_cases = 0, offload_won = 0;
  for (int round = 0; round < 12; ++round) {
    const Scenario base = random_scenario(rng);
    INFO("round " << round << " family " << to_string(base.model.family) << " layers "
                  << base.model.layers);
    // A budget between offloading every layer (the least memory) and running plainly.
    const Oracle plain = run(base, "none", uint64_t{1} << 40);
    const Oracle off = run(base, "offload", uint64_t{1} << 40);
    REQUIRE(off.reserved <= plain.reserved);
    std::uniform_real_distribution<double> where(0.0, 1.05);
    const uint64_t budget =
        off.reserved + static_cast<uint64_t>(where(rng) * static_cast<double>(plain.reserved - off.reserved));
    INFO("budget " << budget);
    const ConfigSearch t = search_configurations(base, budget, Objective::time, 4);
    const ConfigSearch m = search_configurations(base, budget, Objective::memory, 4);
    // Every axis was tried where modelled.
    bool has_offload = false, has_expandable = false, has_8bit = false, has_chunked = false;
    for (const ConfigCandidate& c : t.candidates) {
      has_offload = has_offload || c.axis.rfind("offload", 0) == 0;
      has_expandable = has_expandable || c.axis == "expandable segments";
      has_8bit = has_8bit || c.axis == "8-bit";
      has_chunked = has_chunked || c.axis == "loss chunked:8";
    }
    CHECK(has_offload);
    CHECK(has_expandable);
    CHECK(has_8bit == family_row(base.model.family).adam8bit);
    CHECK(has_chunked == family_row(base.model.family).hf);
    // The offload axis is the least N that fits: one layer fewer does not.
    for (const ConfigCandidate& c : t.candidates) {
      if (c.axis.rfind("offload:", 0) != 0 || !c.result.fits) continue;
      const int64_t n = std::stoll(c.axis.substr(8));
      if (n > 1) {
        Scenario s = candidate_scenario(base, c);
        CHECK_FALSE(run(s, "offload:" + std::to_string(n - 1), budget).fits);
      }
    }
    bool any_fits = false;
    std::vector<Scenario> configs = variants(base, 4);
    for (const Scenario& v : configs) {
      for (const char* policy : {"none", "full"}) {
        const Oracle o = run(v, policy, budget);
        if (!o.fits) continue;
        any_fits = true;
        REQUIRE(t.chosen >= 0);
        REQUIRE(m.chosen >= 0);
        const ConfigCandidate& ct = t.candidates[static_cast<size_t>(t.chosen)];
        const ConfigCandidate& cm = m.candidates[static_cast<size_t>(m.chosen)];
        if (o.time.estimated && ct.time.estimated) CHECK(ct.time.seconds <= o.time.seconds * 1.0001);
        if (std::string(policy) == "none") CHECK(cm.result.run.analysis.peak_reserved <= o.reserved);
      }
    }
    const Oracle off_budget = run(base, "offload", budget);
    if (off_budget.fits) {
      any_fits = true;
      REQUIRE(t.chosen >= 0);
      const ConfigCandidate& ct = t.candidates[static_cast<size_t>(t.chosen)];
      CHECK(ct.time.seconds <= off_budget.time.seconds * 1.0001);
    }
    if (any_fits) {
      ++fitting_cases;
      const ConfigCandidate& ct = t.candidates[static_cast<size_t>(t.chosen)];
      CHECK(ct.result.run.analysis.peak_reserved <= budget);
      offload_won += ct.axis.rfind("offload", 0) == 0 ? 1 : 0;
    }
  }
  CHECK(fitting_cases >= 6);
  WARN("cases with a fitting configuration: " << fitting_cases << " of 12; offload chosen in "
                                             << offload_won);
}
