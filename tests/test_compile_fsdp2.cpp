// torch.compile composed with FSDP2 (step.compile_scope: block with parallel.sharding:
// fsdp2; docs/compile.md "With FSDP2"). torchtitan compiles each transformer block and then
// applies fully_shard to the compiled block (torchtitan/models/llama3/infra/parallelize.py
// at 018740b7: apply_ac, apply_compile, apply_fsdp), so FSDP2's hooks run eagerly around
// each block's graph and the two are independent. What follows from that, checked here
// structurally (no torch.compile on the CPU torch 1.13 of the fixtures, no GPU run yet):
//  - FSDP2's own buffers (all-gathers, copy-outs, reshards, reduce-scatters) are allocated
//    and freed in the same order, with the same bytes and streams, compiled or not;
//  - the forward's other allocations (activations) are the compiled single-GPU run's;
//  - what compile saves at the forward's end is the same with and without FSDP2:
//    compiled FSDP2 - eager FSDP2 == compiled single - eager single, to the byte;
//  - each block's all-gathered parameters exist before the block's first activation;
//  - the contract underneath (graph::compile_region): a block's module hooks run before
//    its region is recorded, so what they allocate is no vertex of the partition.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "compile_test_support.h"
#include "graph/compile.h"
#include "graph/models/decoder.h"
#include "scenario/hf_family.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

std::string yaml(const std::string& family, bool compile, const std::string& parallel,
                 const std::string& params = "bf16") {
  const std::string on = compile ? "  compile: true\n  compile_scope: block\n" : "";
  return memsim_test::tiny_compile_yaml(family, params, "foreach", on, parallel);
}

Program build(const std::string& y) { return build_program(load_scenario_text(y, "c.yaml")); }

using memsim_test::Trace;
using memsim_test::trace;

// A module pre-forward hook that allocates, as FSDP2's unshard does: one buffer per block
// entered in the forward, kept until the end.
class GatherHooks : public graph::RuntimeHooks {
 public:
  void grad_ready(graph::Runtime&, int32_t) override {}
  void layer_entered(graph::Runtime& rt, int32_t layer) override {
    if (layer < 0 || rt.ctx.phase != Phase::forward || seen_.count(layer) != 0) return;
    seen_.insert(layer);
    gathered.push_back(rt.alloc(1 << 20, TensorKind::parameter, graph::OpKind::other));
    first_event.push_back(rt.program().events.size() - 1);
  }
  std::vector<graph::Tensor> gathered;
  std::vector<size_t> first_event;

 private:
  std::set<int32_t> seen_;
};

// The forward of a 2-layer hf-llama compiled per block, with or without the hooks.
std::vector<graph::CompiledRegionStats> compiled_forward(bool hooks, std::vector<size_t>* at = nullptr) {
  GatherHooks h;
  const auto regions = memsim_test::compiled_block_forward(
      load_scenario_text(yaml("hf-llama", false, ""), "h.yaml"), hooks ? &h : nullptr);
  if (at != nullptr) *at = h.first_event;
  return regions;
}

}  // namespace

TEST_CASE("compile_region: a block's module hooks run before its region is recorded",
          "[compile][fsdp2]") {
  std::vector<size_t> at;
  const auto plain = compiled_forward(false);
  const auto hooked = compiled_forward(true, &at);
  REQUIRE(plain.size() == 2);
  REQUIRE(hooked.size() == 2);
  REQUIRE(at.size() == 2);  // one pre-forward per block
  for (size_t i = 0; i < 2; ++i) {
    INFO(i);
    // The hook's buffer is not a vertex of the block's graph: the partition is the same.
    CHECK(hooked[i].vertices == plain[i].vertices);
    CHECK(hooked[i].saved == plain[i].saved);
    CHECK(hooked[i].saved_bytes == plain[i].saved_bytes);
    CHECK(hooked[i].fused_away_bytes == plain[i].fused_away_bytes);
  }
}

TEST_CASE("compile + FSDP2: the hooks run around each compiled block, independent of it",
          "[compile][fsdp2]") {
  const std::vector<std::string> variants = {
      "  reshard_after_forward: true\n", "  reshard_after_forward: false\n",
      "  reshard_after_forward: 2\n"};
  for (const char* family : {"hf-llama", "hf-gpt2"}) {
    INFO(family);
    const Trace eager1 = trace(build(yaml(family, false, "")));
    const Trace comp1 = trace(build(yaml(family, true, "")));
    REQUIRE(comp1.forward_end < eager1.forward_end);
    for (const std::string& v : variants) {
      INFO(v);
      const std::string par = "parallel:\n  data: 4\n  sharding: fsdp2\n" + v;
      const Trace eager = trace(build(yaml(family, false, par)));
      const Trace comp = trace(build(yaml(family, true, par)));
      CHECK(eager.ok);
      CHECK(comp.ok);
      CHECK(comp.end == eager.end);  // nothing a compiled block held outlives the step
      // FSDP2's schedule is untouched by compile.
      REQUIRE(!comp.fsdp2.empty());
      CHECK(comp.fsdp2 == eager.fsdp2);
      // The forward's activations are the compiled single-GPU forward's.
      CHECK(comp.forward == comp1.forward);
      CHECK(eager.forward == eager1.forward);
      // Compile's saving at the forward's end does not depend on FSDP2.
      CHECK(eager.forward_end - comp.forward_end == eager1.forward_end - comp1.forward_end);
      CHECK(comp.peak <= eager.peak);
      // Each block's parameters are gathered before its compiled forward allocates.
      CHECK(comp.gathered_first[0] == 1);
      CHECK(comp.gathered_first[1] == 1);
    }
  }
}

TEST_CASE("compile + FSDP2 with mixed precision and HSDP", "[compile][fsdp2]") {
  // fp32 shards, bf16 param_dtype / fp32 reduce_dtype (torchtitan's default), and HSDP.
  for (const std::string& extra :
       {std::string("  fsdp_mixed_precision: bf16\n  reduce_dtype: fp32\n"),
        std::string("  replicate: 2\n")}) {
    INFO(extra);
    const std::string par = "parallel:\n  data: 4\n  sharding: fsdp2\n" + extra;
    const Trace eager = trace(build(yaml("hf-llama", false, par, "fp32")));
    const Trace comp = trace(build(yaml("hf-llama", true, par, "fp32")));
    CHECK(comp.ok);
    CHECK(comp.end == eager.end);
    CHECK(comp.fsdp2 == eager.fsdp2);
    CHECK(comp.forward_end < eager.forward_end);
  }
  // The same activations as a single GPU whose parameters are in the param_dtype.
  const Trace mp = trace(build(yaml(
      "hf-llama", true, "parallel:\n  data: 4\n  sharding: fsdp2\n  fsdp_mixed_precision: bf16\n",
      "fp32")));
  const Trace single = trace(build(yaml("hf-llama", true, "", "bf16")));
  CHECK(mp.forward == single.forward);
}

TEST_CASE("compile + FSDP2: what is not modelled is refused by key", "[compile][fsdp2]") {
  auto refused = [](const std::string& y, const std::string& key) {
    INFO(key);
    try {
      build(y);
      FAIL("not refused");
    } catch (const ScenarioError& e) {
      CHECK(std::string(e.what()).find(key) != std::string::npos);
      CHECK(std::string(e.what()).find("c.yaml:") != std::string::npos);
    }
  };
  const std::string model_scope =
      yaml("hf-llama", false, "parallel:\n  data: 4\n  sharding: fsdp2\n");
  const std::string at = "  warmup_steps: 1\n";
  std::string y = model_scope;
  y.replace(y.find(at), at.size(), at + "  compile: true\n");
  refused(y, "step.compile_scope");  // torch.compile(model) over fully_shard'ed blocks
  refused(yaml("hf-llama", true, "parallel:\n  data: 4\n  sharding: fsdp\n"), "parallel.sharding");
  refused(yaml("hf-llama", true, "parallel:\n  data: 4\n"), "parallel.data");  // DDP
}
