// torch.compile (graph/compile.h, graph/compile_partition.h, docs/compile.md):
//  - the min-cut partitioner on small graphs whose answer follows from torch's rules;
//  - memsim's compiled blocks against AOTAutograd's real partition of the same blocks
//    (tests/data/compile/partition_*.json, tools/fixtures/gen_compile_fixtures.py, torch
//    1.13 functorch on CPU): the activation bytes a compiled block saves for backward;
//  - whole scenarios with step.compile: a well-formed event stream (every free after its
//    alloc, once), what fusion and the partition change, the memory budget, refusals.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "compile_test_support.h"
#include "graph/compile.h"
#include "graph/compile_partition.h"
#include "graph/models/decoder.h"
#include "json_test_support.h"
#include "scenario/hf_family.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;
using graph::PartClass;
using graph::PartVertex;

namespace {

PartVertex vtx(uint64_t bytes, PartClass c, std::vector<uint32_t> in, bool needed = false,
               bool bw_fusible = true) {
  PartVertex v;
  v.bytes = bytes;
  v.cls = c;
  v.inputs = std::move(in);
  v.needed_by_backward = needed;
  v.backward_fusible = bw_fusible;
  return v;
}

std::string compile_yaml(const std::string& family, const std::string& extra_step) {
  return memsim_test::tiny_compile_yaml(family, "fp32", "for-loop", extra_step);
}

// Requested bytes live at each event; fails on a free without a live alloc.
struct Walk {
  uint64_t peak = 0, forward_end = 0, end = 0;
  bool ok = true;
};
Walk walk(const Program& p) {
  Walk w;
  std::vector<uint8_t> live(p.tensors.size(), 0);
  uint64_t cur = 0;
  bool measured = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc) {
      if (live[e.tensor]) w.ok = false;
      live[e.tensor] = 1;
      cur += e.bytes;
      if (measured) w.peak = std::max(w.peak, cur);
    } else if (e.type == EventType::free) {
      if (!live[e.tensor]) w.ok = false;
      live[e.tensor] = 0;
      cur -= p.tensors[e.tensor].bytes;
    } else if (e.type == EventType::mark) {
      const std::string& name = p.str(static_cast<uint32_t>(e.bytes));
      if (name == "measured_step_begin") {
        measured = true;
        w.peak = cur;
      }
      if (name == "forward_end") w.forward_end = cur;
    }
  }
  w.end = cur;
  return w;
}

// One block of the fixture's config, compiled alone (block scope), forward only.
graph::CompiledRegionStats compiled_block(const nlohmann::json& c, graph::PartitionerVersion v) {
  std::string y = "model:\n  family: " + c["family"].get<std::string>() + "\n  layers: 1\n";
  for (const char* k : {"d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += std::string("  tied_embeddings: ") + (c["family"] == "hf-gpt2" ? "true" : "false") + "\n";
  y += "  attention: eager\nbatch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  const auto regions =
      memsim_test::compiled_block_forward(load_scenario_text(y, "compile-fixture.yaml"), nullptr, v);
  REQUIRE(regions.size() == 1);
  return regions[0];
}

}  // namespace

TEST_CASE("min-cut partition: matmul outputs saved, pointwise chains recomputed", "[compile]") {
  // x (primal) -> mm -> silu-like pointwise p1 -> pointwise p2; the backward reads p1 and
  // p2 (pointwise backward formulas). Saving the mm output alone lets both be recomputed.
  std::vector<PartVertex> g = {
      vtx(1000, PartClass::primal, {}),
      vtx(4000, PartClass::compute, {0}),
      vtx(4000, PartClass::recomputable, {1}, true),
      vtx(4000, PartClass::recomputable, {2}, true),
  };
  g[3].output = true;
  const auto r = graph::partition(g, 1.0);
  CHECK(r.saved[1] == 1);
  CHECK(r.saved[2] == 0);
  // the output is banned from recomputation (its user is the graph's output) and read by
  // the backward: it is saved as it is (no extra bytes: it is alive anyway)
  CHECK(r.saved[3] == 1);
  CHECK(r.saved[0] == 0);
}

TEST_CASE("min-cut partition: a value a matmul's backward reads is saved, not recomputed",
          "[compile]") {
  // primal x -> norm-like pointwise y (read by the backward of a matmul: not fusible).
  std::vector<PartVertex> g = {
      vtx(1000, PartClass::primal, {}),
      vtx(1000, PartClass::recomputable, {0}, true, /*bw_fusible=*/false),
      vtx(3000, PartClass::compute, {1}),
  };
  g[2].output = true;
  auto r = graph::partition(g, 1.0);
  CHECK(r.saved[1] == 1);  // ban_recompute_materialized_backward
  CHECK(r.saved[0] == 0);
  // torch 1.13 has no such rule, but its matmul backward reads y through aten.t, which
  // its allowlist lacks: y is saved there too.
  r = graph::partition(g, 1.0, graph::PartitionerVersion::torch113_inductor);
  CHECK(r.saved[1] == 1);
  CHECK(r.saved[0] == 0);
}

TEST_CASE("min-cut partition: reductions are saved, budget 0 keeps the inputs only",
          "[compile]") {
  // x -> sq (pointwise) -> mean (reduction, 1/64 of its input) -> r (pointwise, read by
  // the backward) ; x read by the backward too.
  std::vector<PartVertex> g = {
      vtx(6400, PartClass::primal, {}, true),
      vtx(6400, PartClass::recomputable, {0}),
      vtx(100, PartClass::recomputable, {1}),
      vtx(100, PartClass::recomputable, {2}, true),
  };
  auto r = graph::partition(g, 1.0);
  CHECK(r.banned[2] == 1);  // output * 4 < input
  CHECK(r.saved[0] == 1);
  CHECK(r.saved[2] + r.saved[3] == 1);
  r = graph::partition(g, 0.0);
  CHECK(r.saved[0] == 1);
  CHECK(r.saved[1] + r.saved[2] + r.saved[3] == 0);
}

TEST_CASE("compiled blocks save what AOTAutograd's min-cut saves (torch 1.13 CPU fixtures)",
          "[compile][fixtures]") {
  const std::filesystem::path dir = MEMSIM_SOURCE_DIR + "/tests/data/compile";
  for (const char* name : {"partition_hf_llama.json", "partition_hf_gpt2.json"}) {
    INFO(name);
    const nlohmann::json fx = memsim_test::load_json(dir / name);
    const auto st = compiled_block(fx["config"], graph::PartitionerVersion::torch113_inductor);
    // What eager autograd saves in the block, counted the same way (storages once,
    // parameters out): the graph memsim partitions is the one torch partitions.
    CHECK(st.eager_saved_bytes == fx["eager_saved_bytes"].get<uint64_t>());
    std::string listing;
    for (const auto& v : st.saved_values)
      listing += std::string(v.input ? "input" : graph::forward_name(v.op)) + " " +
                 std::to_string(v.bytes) + "; ";
    INFO("memsim saves: " << listing);
    CHECK(st.saved_bytes == fx["saved_bytes"].get<uint64_t>());
    CHECK(st.saved == fx["saved_storages"].get<uint32_t>());
    CHECK(st.saved_bytes < st.eager_saved_bytes);
  }
}

TEST_CASE("step.compile: fewer activation bytes, a well-formed event stream", "[compile]") {
  for (const char* family : {"hf-llama", "hf-gpt2"}) {
    INFO(family);
    const Program eager = build_program(load_scenario_text(compile_yaml(family, ""), "e.yaml"));
    const Walk we = walk(eager);
    REQUIRE(we.ok);
    for (const char* scope : {"model", "block"}) {
      INFO(scope);
      const std::string step = std::string("  compile: true\n  compile_scope: ") + scope + "\n";
      const Program compiled = build_program(load_scenario_text(compile_yaml(family, step), "c.yaml"));
      const Walk wc = walk(compiled);
      CHECK(wc.ok);  // every free follows its alloc, once
      CHECK(wc.end == we.end);  // nothing a compiled region held outlives its backward
      // The saved set of the partition is smaller than eager's, and fused intermediates
      // never exist: less is alive when the forward ends, and the step peaks lower.
      CHECK(wc.forward_end < we.forward_end);
      CHECK(wc.peak <= we.peak);
      // The budget trades memory for recomputation: never more saved at a lower budget.
      uint64_t last = wc.forward_end;
      for (const char* b : {"0.5", "0.1", "0"}) {
        INFO(b);
        const Program p = build_program(load_scenario_text(
            compile_yaml(family, step + "  compile_memory_budget: " + b + "\n"), "b.yaml"));
        const Walk wb = walk(p);
        CHECK(wb.ok);
        CHECK(wb.end == we.end);  // recomputed buffers of the backward are freed too
        CHECK(wb.forward_end <= last);
        last = wb.forward_end;
      }
      CHECK(last < wc.forward_end);
    }
  }
}

TEST_CASE("step.compile off reproduces the eager program exactly", "[compile]") {
  const Program a = build_program(load_scenario_text(compile_yaml("hf-llama", ""), "a.yaml"));
  const Program b = build_program(
      load_scenario_text(compile_yaml("hf-llama", "  compile: false\n"), "b.yaml"));
  REQUIRE(a.events.size() == b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    CHECK(a.events[i].type == b.events[i].type);
    CHECK(a.events[i].tensor == b.events[i].tensor);
    CHECK(a.events[i].bytes == b.events[i].bytes);
  }
}

TEST_CASE("step.compile: unmodelled combinations are refused by key", "[compile]") {
  const std::string on = "  compile: true\n";
  auto refused = [](const std::string& yaml, const std::string& key) {
    INFO(key);
    try {
      build_program(load_scenario_text(yaml, "r.yaml"));
      FAIL("not refused");
    } catch (const ScenarioError& e) {
      CHECK(std::string(e.what()).find(key) != std::string::npos);
      CHECK(std::string(e.what()).find("r.yaml:") != std::string::npos);
    }
  };
  const std::string y = compile_yaml("hf-llama", on);
  refused(y + "lora:\n  rank: 8\n  targets: [q_proj, v_proj]\n", "lora.rank");
  refused(y + "parallel:\n  data: 2\n", "parallel.data");
  // Checkpointing composes with per-block compile only (tests/test_compile_checkpoint.cpp).
  refused(y + "checkpoint:\n  policy: full\n", "step.compile_scope");
  refused(y + "checkpoint:\n  policy: selective\n", "checkpoint.policy");
  refused(y + "parallel:\n  data: 4\n  sharding: fsdp\n", "parallel.sharding");
  refused(y + "parallel:\n  data: 4\n  sharding: fsdp2\n", "step.compile_scope");
  refused(compile_yaml("hf-llama", "  compile_scope: block\n"), "step.compile_scope");
  refused(compile_yaml("hf-llama", on + "  compile_memory_budget: 1.5\n"),
          "step.compile_memory_budget");
  refused(compile_yaml("hf-llama", on + "  compile_scope: layer\n"), "step.compile_scope");
  // A mixture-of-experts row: its experts loop and routing are not modelled compiled.
  refused("model:\n  preset: qwen3-30b-a3b\n  layers: 2\n  attention: flash\n  moe:\n    experts_implementation: eager\n"
          "precision:\n  params: bf16\nbatch:\n  micro_batch: 1\n  seq_len: 64\n"
          "step:\n" + on + "device:\n  capacity: 1TiB\n", "step.compile: step.compile on a mixture-of-experts row");
}

TEST_CASE("Inductor fusion: RMSNorm and SwiGLU leave no intermediate buffers", "[compile]") {
  // bf16 Llama layers: eager RMSNorm allocates the fp32 upcast, pow, mean, +eps, rsqrt,
  // the fp32 product and its bf16 cast; SwiGLU allocates silu(gate) and the product.
  // Compiled, RMSNorm's kernel writes its output (and the saved rsqrt), and
  // silu(gate) * up is one kernel whose output is down_proj's input.
  std::string y = compile_yaml("hf-llama", "  compile: true\n");
  y.replace(y.find("params: fp32"), 12, "params: bf16");
  y.replace(y.find("attention: eager"), 16, "attention: flash");  // (eager's softmax casts)
  const Program p = build_program(load_scenario_text(y, "fusion.yaml"));
  std::map<std::string, int> forward_allocs;
  bool measured = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measured = true;
    if (measured && e.type == EventType::alloc && e.phase == Phase::forward && e.layer == 0)
      ++forward_allocs[p.str(e.op)];
  }
  INFO([&] {
    std::string s;
    for (const auto& [op, n] : forward_allocs) s += op + " x" + std::to_string(n) + "; ";
    return s;
  }());
  CHECK(forward_allocs.count("pow") == 0);
  CHECK(forward_allocs.count("mean.dim") == 0);
  CHECK(forward_allocs.count("add.Scalar") == 0);
  CHECK(forward_allocs.count("silu") == 0);
  CHECK(forward_allocs.count("_to_copy") == 0);  // the fp32 upcast and the bf16 cast
  CHECK(forward_allocs["rsqrt"] == 2);            // saved: one per norm
  CHECK(forward_allocs["mm"] == 7);               // q, k, v, o, gate, up, down
  CHECK(forward_allocs["mul"] == 3);              // the two norms' outputs, silu(gate) * up
}

TEST_CASE("the torch 2.x rules on the fixture blocks", "[compile][fixtures]") {
  // torch 2.x bans recomputing a value a matmul's backward reads (materialised in the
  // backward anyway) and decomposes native_layer_norm: on these blocks it keeps the same
  // bytes as torch 1.13 does for other reasons (docs/compile.md, Evidence).
  const std::filesystem::path dir = MEMSIM_SOURCE_DIR + "/tests/data/compile";
  for (const char* name : {"partition_hf_llama.json", "partition_hf_gpt2.json"}) {
    INFO(name);
    const nlohmann::json fx = memsim_test::load_json(dir / name);
    const auto st = compiled_block(fx["config"], graph::PartitionerVersion::torch25);
    std::string listing;
    for (const auto& v : st.saved_values)
      listing += std::string(v.input ? "input" : graph::forward_name(v.op)) + " " +
                 std::to_string(v.bytes) + "; ";
    INFO("memsim saves: " << listing);
    CHECK(st.saved_bytes < st.eager_saved_bytes);
    CHECK(st.saved_bytes == fx["saved_bytes"].get<uint64_t>());
  }
}

TEST_CASE("step.compile with dropout: the mask is saved, the output recomputed", "[compile]") {
  // CUDA's dropout kernel order (mask first): kernel_scratch on.
  auto yaml = [](const std::string& step) {
    std::string y = compile_yaml("hf-gpt2", step);
    y.replace(y.find("kernel_scratch: false"), 21, "kernel_scratch: true");
    y.replace(y.find("attention: eager"), 16, "attention: eager\n  dropout: 0.1");
    return y;
  };
  const Walk we = walk(build_program(load_scenario_text(yaml(""), "d.yaml")));
  const Walk wc = walk(build_program(load_scenario_text(yaml("  compile: true\n"), "d.yaml")));
  CHECK(we.ok);
  CHECK(wc.ok);
  CHECK(wc.end == we.end);
  CHECK(wc.forward_end < we.forward_end);
}
