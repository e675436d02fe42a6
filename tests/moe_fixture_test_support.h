// Test support for the MoE CPU fixtures (tests/data/torch_cpu_moe*/, written by
// tools/fixtures/gen_moe_fixtures.py and gen_moe_compose_fixtures.py): the fixture's "moe"
// block as memsim's MoeSpec, a fixture's YAML loaded as a scenario with that block, the
// target_parameters LoRA keys, and the per-layer forward allocation check both suites run.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "decoder_arch_test_support.h"
#include "graph/models/decoder_spec.h"
#include "program/program.h"
#include "scenario/scenario.h"

namespace memsim_test {

// The fixture config's "moe" block: experts, top_k, expert_d_ff, shared_d_ff,
// first_dense_layers, norm_topk, router_style (mixtral | qwen), the forced counts per
// expert, output_router_logits and experts_implementation (eager | batched_mm; set either way).
inline void apply_moe_fixture_spec(const nlohmann::json& m, memsim::graph::MoeSpec& moe) {
  moe.experts = m["experts"];
  moe.top_k = m["top_k"];
  moe.expert_d_ff = m["expert_d_ff"];
  moe.shared_d_ff = m["shared_d_ff"];
  moe.first_dense_layers = m["first_dense_layers"];
  moe.norm_topk = m["norm_topk"];
  moe.output_router_logits = m.value("output_router_logits", false);
  moe.code = m["router_style"] == "mixtral" ? memsim::graph::MoeRouterCode::mixtral
                                            : memsim::graph::MoeRouterCode::qwen;
  moe.routing = memsim::graph::MoeRouting::counts;
  moe.counts = m["counts"].get<std::vector<int64_t>>();
  // The fixtures ran the implementation they name (eager when none): set it whatever the
  // reader defaulted to (transformers 5.x's grouped_mm when the key is absent).
  moe.impl = m.value("experts_implementation", std::string("eager")) == "batched_mm"
                 ? memsim::graph::ExpertsImpl::batched_mm
                 : memsim::graph::ExpertsImpl::eager;
}

// A fixture's YAML (`source` names it in errors) as a scenario with the fixture's
// architecture (arch_for) and MoE block (apply_moe_fixture_spec: the forced counts), both set
// after loading; the reader is given a MoE model (model.moe.experts / top_k / expert_d_ff
// overrides) so that it checks the MoE-only keys (lora.target_parameters) against one.
inline memsim::Scenario moe_fixture_scenario(const std::string& yaml, const std::string& source,
                                             const nlohmann::json& c) {
  const nlohmann::json& m = c["moe"];
  memsim::Scenario s = memsim::load_scenario_text(yaml, source,
                                                  {{"model.moe.experts", std::to_string(m["experts"].get<int>())},
                                                   {"model.moe.top_k", std::to_string(m["top_k"].get<int>())},
                                                   {"model.moe.expert_d_ff", std::to_string(m["expert_d_ff"].get<int>())},
                                                   // the implementation the fixture ran, so the reader's
                                                   // checks (grouped_mm's refusals) see it
                                                   {"model.moe.experts_implementation",
                                                    m.value("experts_implementation", std::string("eager"))}});
  s.model.arch = arch_for(c);
  apply_moe_fixture_spec(m, s.model.arch.moe);
  return s;
}

// The lora section of a fixture's PEFT target_parameters LoRA (its "lora" block): rank,
// alpha, target_parameters, and targets where it names attention adapters too.
inline std::string target_parameters_lora_yaml(const nlohmann::json& l) {
  std::string y = "lora:\n  rank: " + std::to_string(l["rank"].get<int>()) + "\n  alpha: " +
                  std::to_string(l["alpha"].get<int>()) + "\n  target_parameters: [";
  for (size_t i = 0; i < l["target_parameters"].size(); ++i)
    y += (i ? ", " : "") + l["target_parameters"][i].get<std::string>();
  y += "]\n";
  if (l.contains("targets")) {
    y += "  targets: [";
    for (size_t i = 0; i < l["targets"].size(); ++i) y += (i ? ", " : "") + l["targets"][i].get<std::string>();
    y += "]\n";
  }
  return y;
}

// Every layer's forward of the measured step (after the "measured_step_begin" mark)
// allocates the sizes the fixture recorded, in the same order, the MoE loop included.
inline void check_forward_allocs_by_layer(const nlohmann::json& fx, const memsim::Program& program) {
  std::map<int, std::vector<uint64_t>> real, sim;
  for (const auto& ev : fx["events"])
    if (ev[0] == "alloc" && ev[3] == "forward") real[ev[4].get<int>()].push_back(ev[2].get<uint64_t>());
  bool measuring = false;
  for (const memsim::MemoryEvent& e : program.events) {
    if (e.type == memsim::EventType::mark && program.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measuring = true;
    if (measuring && e.type == memsim::EventType::alloc && e.phase == memsim::Phase::forward)
      sim[e.layer].push_back(e.bytes);
  }
  for (const auto& [layer, sizes] : real) {
    INFO("forward allocations of layer " << layer);
    const auto it = sim.find(layer);
    REQUIRE(it != sim.end());
    CHECK(it->second == sizes);
  }
}

// Bytes (and, through `count`, the number) of the measured step's allocations (after the
// warm-up) that `keep(event)` accepts.
template <class F>
uint64_t measured_sum(const memsim::Program& p, F keep, uint64_t* count = nullptr) {
  uint64_t sum = 0, n = 0;
  bool measuring = false;
  for (const memsim::MemoryEvent& e : p.events) {
    if (e.type == memsim::EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measuring = true;
    if (measuring && e.type == memsim::EventType::alloc && keep(e)) {
      sum += e.bytes;
      ++n;
    }
  }
  if (count) *count = n;
  return sum;
}

}  // namespace memsim_test
