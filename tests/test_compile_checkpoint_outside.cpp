// Activation checkpointing *around* compiled layers: torchtune's order (a6290a5b recipes
// full_finetune_*.py and lora_finetune_*.py _setup_model: training.compile_model, then
// training.set_activation_checkpointing), graph/compile.h 4c, docs/compile.md
// "torchtune: checkpointing around the compiled layers". checkpoint_wrapper's eager
// non-reentrant checkpoint calls the compiled layer; AOTAutograd's CompiledFunction saves
// the min-cut set with ctx.save_for_backward, which the checkpoint's pack hook turns into
// holders; the re-run in backward is the whole compiled forward again.
//  - Against torch 1.13 on CPU (tests/data/compile/checkpoint_outside_hf_llama.json,
//    tools/fixtures/gen_compile_checkpoint_fixture.py): the forward graph runs twice (the
//    forward, then the re-run inside backward); what it returns for the backward is the
//    partition's saved set both times (127,232 B in 13 storages beside the block's
//    inputs), none of it alive once the checkpointed call returned, and the backward graph
//    receives the re-run's. memsim runs the same block (the 1.13 rules) and matches.
//  - On torchtune's code (the scenario path): the forward's end is eager full AC's; a
//    well-formed stream; FSDP2's buffers untouched by compile; what stays refused. (LoRA
//    inside the compiled layers: tests/test_compile_lora.cpp.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "compile_test_support.h"
#include "graph/checkpoint.h"
#include "graph/compile.h"
#include "graph/models/decoder.h"
#include "json_test_support.h"
#include "scenario/hf_family.h"
#include "scenario/scenario.h"
#include "scenario_error_test_support.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// The fixture's block: one hf-llama layer (D 64, 4 heads / 2 KV, F 160), 2 x 16 tokens,
// fp32, eager attention (gen_compile_fixtures.py CONFIGS["hf_llama"]).
Scenario fixture_scenario(const nlohmann::json& c) {
  std::string y = "model:\n  family: hf-llama\n  layers: 1\n";
  for (const char* k : {"d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += "  attention: eager\nbatch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  return load_scenario_text(y, "fixture.yaml");
}

struct BlockRun {
  Program program;
  std::vector<graph::CompiledRegionStats> regions;
  size_t forward_end = 0;  // event index
  uint32_t recomputed = 0;
};

// One forward and backward of the block: eager checkpoint (full, non-reentrant) around it
// when `ckpt`, the layer compiled alone (1.13 rules, checkpoint outside) when `compile`.
void run_block(BlockRun& r, const Scenario& s, bool compile, bool ckpt) {
  graph::Runtime rt(r.program);
  std::unique_ptr<graph::CheckpointEngine> checkpoint;
  if (ckpt) {
    graph::CheckpointPlan plan;
    plan.layers.assign(s.model.layers, graph::LayerCheckpoint::layer);
    plan.early_stop = false;  // what the schedule sets for torchtune's compiled layers
    checkpoint = std::make_unique<graph::CheckpointEngine>(rt, plan);
  }
  std::unique_ptr<graph::CompileEngine> engine;
  if (compile) {
    graph::CompileOptions o;
    o.scope = graph::CompileScope::block;
    o.partitioner = graph::PartitionerVersion::torch113_inductor;
    o.checkpoint_outside = true;
    engine = std::make_unique<graph::CompileEngine>(rt, o);
  }
  graph::DecoderModel model(rt, hf_shape(s));
  model.construct();
  graph::Tensor ids = rt.alloc(s.batch.micro_batch * s.batch.seq_len * 8, TensorKind::input,
                               graph::OpKind::other);
  rt.ctx.phase = Phase::forward;
  rt.begin_graph();
  graph::Tensor logits = model.forward(ids);
  r.forward_end = r.program.events.size();
  rt.ctx.phase = Phase::backward;
  rt.backward(logits);
  if (checkpoint) r.recomputed = checkpoint->regions_recomputed();
  if (engine) r.regions = engine->regions();
  rt.freeze();
}

// Live bytes after event `upto` (exclusive), and whether every free follows its alloc.
uint64_t live_at(const Program& p, size_t upto, bool* ok = nullptr) {
  std::vector<uint8_t> live(p.tensors.size(), 0);
  uint64_t cur = 0;
  for (size_t i = 0; i < upto && i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type != EventType::alloc && e.type != EventType::free) continue;
    const bool a = e.type == EventType::alloc;
    if (live[e.tensor] == a && ok != nullptr) *ok = false;
    live[e.tensor] = a;
    cur = a ? cur + p.tensors[e.tensor].bytes : cur - p.tensors[e.tensor].bytes;
  }
  return cur;
}

// The activations of a region's saved set that are not its inputs (the fixture leaves the
// block's inputs, weights and buffers apart).
uint64_t computed_saved_bytes(const graph::CompiledRegionStats& r, uint32_t* count) {
  uint64_t b = 0;
  *count = 0;
  for (const auto& v : r.saved_values)
    if (!v.input) {
      b += v.bytes;
      ++*count;
    }
  return b;
}

std::string tune_yaml(bool compile, const std::string& params, const std::string& rest) {
  std::string y =
      "model:\n  family: hf-llama\n  implementation: torchtune\n  attention: " +
      std::string(params == "fp32" ? "mem-efficient" : "flash") +
      "\n  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 160\n  vocab: 128\n"
      "  context_length: 16\n"
      "batch:\n  micro_batch: 2\n  seq_len: 16\n"
      "precision:\n  params: " + params + "\n  autocast: none\n"
      "optimizer:\n  type: adamw\n  impl: fused\n"
      "step:\n  kind: train\n  warmup_steps: 1\n";
  if (compile) y += "  compile: true\n  compile_scope: block\n";
  y += rest;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return y;
}

Program build(const std::string& y) { return build_program(load_scenario_text(y, "tc.yaml")); }

std::string error_of(const std::string& y) { return memsim_test::refusal_of([&] { build(y); }); }

}  // namespace

TEST_CASE("checkpoint around a compiled block: torch 1.13's CPU run (fixture)",
          "[compile][checkpoint][fixtures]") {
  const nlohmann::json fx = memsim_test::load_json(std::filesystem::path(
      MEMSIM_SOURCE_DIR + "/tests/data/compile/checkpoint_outside_hf_llama.json"));
  const Scenario s = fixture_scenario(fx["config"]);
  // What the fixture recorded: the compiled forward ran twice, its saved set was the same
  // both times, not kept after the checkpointed call, and handed to the backward graph.
  REQUIRE(fx["forward_graph_calls_in_forward"] == 1);
  REQUIRE(fx["forward_graph_calls_total"] == 2);
  REQUIRE(fx["forward_saved_alive_after_checkpoint_returned"] == 0);
  REQUIRE(fx["rerun_saved_bytes"] == fx["forward_saved_bytes"]);
  REQUIRE(fx["backward_graph_received_rerun_saved"] == true);
  REQUIRE(fx["rerun_output_alive_when_backward_graph_runs"] == false);
  const uint64_t want = fx["forward_saved_bytes"];
  const uint32_t want_storages = fx["forward_saved_storages"];

  BlockRun both, eager_ac;
  run_block(both, s, true, true);
  run_block(eager_ac, s, false, true);
  // Two compiled regions: the forward, then the re-run in backward (the whole compiled
  // forward again), each with the 1.13 partition's saved set.
  REQUIRE(both.regions.size() == 2);
  CHECK(both.recomputed == 1);
  CHECK(!both.regions[0].recompute);
  CHECK(both.regions[1].recompute);
  for (const auto& r : both.regions) {
    uint32_t n = 0;
    CHECK(computed_saved_bytes(r, &n) == want);
    CHECK(n == want_storages);
  }
  // None of it is alive at the forward's end: the checkpoint's frame (the block's inputs)
  // is all that is kept, as in eager full AC.
  bool ok = true;
  CHECK(live_at(both.program, both.forward_end, &ok) ==
        live_at(eager_ac.program, eager_ac.forward_end));
  // The saved set is the compiled graph's output: alive together at the region's end,
  // then freed (ctx.to_save dies after the pack hooks ran). After the block's last
  // allocation (its output, the second residual sum) the forward frees exactly the saved
  // set, plus down_proj's output, which that sum read last (2 x 16 x 64 x 4 B; the first
  // residual sum, the sum's other operand, is inside fused kernels: never allocated).
  const Program& p = both.program;
  size_t last_alloc = 0;
  for (size_t i = 0; i < both.forward_end; ++i)
    if (p.events[i].type == EventType::alloc && p.events[i].layer == 0) last_alloc = i;
  uint64_t freed_after = 0;
  for (size_t i = last_alloc + 1; i < both.forward_end; ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc) break;
    if (e.type == EventType::free) freed_after += p.tensors[e.tensor].bytes;
  }
  CHECK(freed_after == want + 8192);
  // The re-run in backward (the compiled forward again): when the backward's own kernels
  // start (its first allocation that is not the re-run's), what the re-run left alive is
  // exactly its saved set, which the fixture's backward graph receives; its output and
  // every other buffer are gone.
  {
    std::vector<uint8_t> live(p.tensors.size(), 0);
    uint64_t recomputed = 0;
    bool started = false, found = false;
    for (size_t i = both.forward_end; i < p.events.size() && !found; ++i) {
      const MemoryEvent& e = p.events[i];
      if (e.type != EventType::alloc && e.type != EventType::free) continue;
      const bool rec = (p.tensors[e.tensor].flags & kTensorRecomputed) != 0;
      if (e.type == EventType::alloc && !rec && started) {
        found = true;
        break;
      }
      if (!rec) continue;
      started = true;
      const bool a = e.type == EventType::alloc;
      live[e.tensor] = a;
      recomputed = a ? recomputed + p.tensors[e.tensor].bytes : recomputed - p.tensors[e.tensor].bytes;
    }
    CHECK(found);
    CHECK(recomputed == fx["backward_graph_rerun_saved_bytes"].get<uint64_t>());
  }
  // The whole step is well formed and leaves nothing behind but what eager AC leaves.
  live_at(p, p.events.size(), &ok);
  CHECK(ok);
  CHECK(live_at(p, p.events.size()) == live_at(eager_ac.program, eager_ac.program.events.size()));
}

TEST_CASE("checkpoint around torchtune's compiled layers: the step", "[compile][checkpoint][torchtune]") {
  const std::string ac = "checkpoint:\n  policy: full\n";
  for (const std::string params : {"bf16", "fp32"}) {
    INFO(params);
    const memsim_test::Trace eager = memsim_test::trace(build(tune_yaml(false, params, ac)));
    const memsim_test::Trace comp = memsim_test::trace(build(tune_yaml(true, params, ac)));
    const memsim_test::Trace comp_noac = memsim_test::trace(build(tune_yaml(true, params, "")));
    CHECK(eager.ok);
    CHECK(comp.ok);
    CHECK(comp.end == eager.end);
    // Each layer keeps only its input, compiled or not.
    CHECK(comp.forward_end == eager.forward_end);
    CHECK(comp.forward_end < comp_noac.forward_end);
  }
}

TEST_CASE("checkpoint around torchtune's compiled layers under FSDP2", "[compile][checkpoint][torchtune][fsdp2]") {
  const std::string rest = "checkpoint:\n  policy: full\nparallel:\n  data: 4\n  sharding: fsdp2\n";
  const memsim_test::Trace eager = memsim_test::trace(build(tune_yaml(false, "bf16", rest)));
  const memsim_test::Trace comp = memsim_test::trace(build(tune_yaml(true, "bf16", rest)));
  CHECK(eager.ok);
  CHECK(comp.ok);
  CHECK(comp.end == eager.end);
  CHECK(comp.forward_end == eager.forward_end);
  REQUIRE(!comp.fsdp2.empty());
  CHECK(comp.fsdp2 == eager.fsdp2);  // the unshards of the re-runs included
}

TEST_CASE("checkpoint around torchtune's compiled layers: refusals", "[compile][checkpoint][torchtune]") {
  // torchtune checkpoints whole layers only; its OffloadActivations with compile is not
  // modelled; LoRA dropout inside the compiled layers neither.
  std::string err = error_of(tune_yaml(true, "bf16", "checkpoint:\n  policy: selective\n"));
  CHECK(err.find("checkpoint.policy") != std::string::npos);
  err = error_of(tune_yaml(true, "bf16",
                           "checkpoint:\n  policy: full\n  offload_activations: true\n"));
  CHECK(err.find("step.compile") != std::string::npos);
  err = error_of(tune_yaml(true, "bf16",
                           "checkpoint:\n  policy: full\nlora:\n  rank: 8\n  dropout: 0.1\n"
                           "  targets: [q_proj, v_proj]\n"));
  CHECK(err.find("lora.dropout") != std::string::npos);
}
