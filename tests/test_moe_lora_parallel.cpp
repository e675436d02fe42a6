// lora.target_parameters (PEFT's ParamWrapper on the routed experts) under data parallelism
// (docs/moe.md "With DDP and FSDP2"):
//  - torch DDP, against real torch 1.13 (CPU, gloo; tests/data/ddp_moe_lora/*.json from
//    tools/fixtures/gen_ddp_moe_lora_fixtures.py): the reducer buckets the adapters only (the
//    router and the 3-D experts are frozen), at construction and after the rebuild in the
//    order their gradients became ready, byte for byte;
//  - FSDP2 (fully_shard per decoder layer, then the root), by hand arithmetic from
//    sim/parallel/fsdp2.h's rules: the frozen 3-D experts sharded on dim 0 (whole experts)
//    and all-gathered with their layer each forward (and again for backward), the adapters
//    lora_A (r*E, in) / lora_B (out, r*E) sharded on their dim 0, reduce-scattered alone (the
//    frozen experts get no gradient), the merged weights W + delta built on the unsharded
//    parameter every forward as on one GPU;
//  - what stays refused, by key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "decoder_arch_test_support.h"
#include "json_test_support.h"
#include "moe_fixture_test_support.h"
#include "scenario_error_test_support.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/analysis/parameter_count.h"
#include "sim/parallel/data_parallel.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kDir = MEMSIM_SOURCE_DIR + "/tests/data/ddp_moe_lora";

// The fixture's model and loop as a scenario: SGD (no state), DDP over world + 1 ranks
// (DDP wraps the model for parallel.data > 1 only; world size 1 in torch is the same reducer).
Scenario ddp_scenario(const nlohmann::json& f) {
  const nlohmann::json& c = f["config"];
  std::string y = memsim_test::fixture_shape_yaml(c);
  const nlohmann::json& l = c["lora"];
  y += memsim_test::target_parameters_lora_yaml(l);
  y += "optimizer:\n  type: sgd\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 2\n";
  y += "parallel:\n  data: " + std::to_string(f["world_size"].get<int>() + 1) + "\n";
  if (f["gradient_as_bucket_view"].get<int>() != 0) y += "  gradient_as_bucket_view: true\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return memsim_test::moe_fixture_scenario(y, "ddp-moe-lora-fixture.yaml", c);
}

std::vector<uint64_t> named_allocs(const Program& p, const std::string& name) {
  std::vector<uint64_t> out;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && p.str(p.tensors[e.tensor].name) == name) out.push_back(e.bytes);
  return out;
}

// A small Qwen3-MoE-like run: 2 layers, 4 experts of d_ff 48, d_model 64, r 4 on both expert
// weights, fp32 (so every element is 4 B), AdamW; the parallel section is the test's.
std::string fsdp2_yaml(const std::string& parallel) {
  return "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 128\n"
         "  vocab: 256\n  context_length: 64\n  attention: eager\n"
         "  moe: {experts_implementation: eager, experts: 4, top_k: 2, expert_d_ff: 48}\n"
         "batch:\n  micro_batch: 2\n  seq_len: 32\nprecision:\n  params: fp32\n"
         "lora:\n  rank: 4\n  target_parameters: [gate_up_proj, down_proj]\n"
         "optimizer:\n  type: adamw\n  impl: foreach\n"
         "step:\n  kind: train\n  warmup_steps: 1\n"
         "device:\n  capacity: 80GiB\n  cublas_workspace: 0\n  kernel_scratch: false\n" +
         parallel;
}

}  // namespace

TEST_CASE("lora.target_parameters under DDP: the adapters' buckets match torch 1.13 exactly",
          "[moe-lora][dp]") {
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kDir)) {
    if (entry.path().extension() != ".json") continue;
    const nlohmann::json f = memsim_test::load_json(entry.path());
    INFO(entry.path().filename().string());
    REQUIRE(f["bucket_cap_bytes"].get<uint64_t>() == kDdpBucketCapBytes);
    REQUIRE(f["find_unused_parameters"].get<int>() == 0);
    const bool view = f["gradient_as_bucket_view"].get<int>() != 0;
    const Scenario s = ddp_scenario(f);
    const Program p = build_program(s);
    // The parameters: memsim builds the base model, then (get_peft_model) the adapters: torch's
    // frozen parameters (as a multiset: the stand-in registers a MoE block's experts before
    // its router, memsim the router first; frozen, they reach no bucket), then its trainable
    // ones in model.parameters() order (the reducer's order).
    std::vector<uint64_t> params, torch_frozen, trainable;
    for (const MemoryEvent& e : p.events)
      if (e.type == EventType::alloc && e.kind == TensorKind::parameter) params.push_back(e.bytes);
    for (const auto& q : f["parameters"])
      (q["requires_grad"].get<bool>() ? trainable : torch_frozen).push_back(q["bytes"].get<uint64_t>());
    REQUIRE(params.size() == torch_frozen.size() + trainable.size());
    std::vector<uint64_t> frozen(params.begin(), params.begin() + static_cast<std::ptrdiff_t>(torch_frozen.size()));
    std::sort(frozen.begin(), frozen.end());
    std::sort(torch_frozen.begin(), torch_frozen.end());
    CHECK(frozen == torch_frozen);
    CHECK(std::vector<uint64_t>(params.begin() + static_cast<std::ptrdiff_t>(torch_frozen.size()), params.end()) ==
          trainable);
    // Every trainable parameter is an adapter (lora_A / lora_B); the experts are frozen.
    for (const auto& q : f["parameters"])
      CHECK(q["requires_grad"].get<bool>() == (q["name"].get<std::string>().find(".lora_") != std::string::npos));
    CHECK(trainable_parameter_count(s) * 4 == static_cast<int64_t>(std::accumulate(
                                                  trainable.begin(), trainable.end(), uint64_t{0})));
    // The reducer's one bucket at construction, then the rebuilt ones, in the order the
    // adapters' gradients became ready in the first backward. Within a ParamWrapper torch
    // readies lora_B before lora_A (A's reshape has its own ViewBackward0, made before B's:
    // the engine pops B's chain first); in tp_qwen3_moe_l3_e16_k2_both_attn_r16 the first
    // MiB closes between layer 1's down_proj lora_B (131,072 B) and lora_A (98,304 B), so A
    // before B would give buckets of 1,171,456 and 671,744 B instead of torch's 1,073,152 and
    // 770,048 (graph/models/moe_param_lora.cpp delta()).
    std::vector<uint64_t> expect = f["construction_bucket_sizes"].get<std::vector<uint64_t>>();
    uint64_t rebuilt = 0;
    for (uint64_t b : f["rebuilt_bucket_sizes"].get<std::vector<uint64_t>>()) {
      expect.push_back(b);
      rebuilt += b;
    }
    CHECK(named_allocs(p, "ddp.reducer.bucket") == expect);
    // After the step: the adapters' .grad plus the buckets, or (gradient_as_bucket_view) the
    // buckets alone; the frozen experts never get a gradient.
    uint64_t own = 0;
    for (const auto& b : f["grad_storage_bytes"]) own += b.get<uint64_t>();
    const LiveBytes live = live_bytes_at_mark(p, "optimizer_end");
    REQUIRE(live.found_mark);
    CHECK(live.by_kind[int(TensorKind::gradient)] == (view ? rebuilt : own + rebuilt));
    ++seen;
  }
  CHECK(seen == 12);  // 4 configs (one over batched_mm experts) x (w1, w2, w2 view)
}

TEST_CASE("lora.target_parameters under FSDP2: shards, all-gathers and reduce-scatters by hand",
          "[moe-lora][fsdp2]") {
  constexpr uint64_t E = 4, D = 64, F = 48, r = 4, ws = 4;
  const Scenario s = load_scenario_text(fsdp2_yaml("parallel:\n  data: 4\n  sharding: fsdp2\n"), "moe.yaml");
  const Scenario one = load_scenario_text(fsdp2_yaml(""), "moe.yaml");
  const Program p = build_program(s);
  const Program q = build_program(one);
  // Trainable: per layer r*E*(D + 2F) (gate_up) + r*E*(F + D) (down), as on one GPU.
  const uint64_t per_layer = r * E * (D + 2 * F) + r * E * (F + D);
  CHECK(trainable_parameter_count(s) == static_cast<int64_t>(2 * per_layer));
  // Shards (torch.chunk on dim 0, chunk 0 padded): the 3-D experts by whole experts
  // (E / ws = 1 expert each), lora_A (r*E rows: 16 / 4 = 4), lora_B (out rows: 2F / 4 = 24,
  // D / 4 = 16).
  // (The optimizer's state is named after the shard too: the parameter kind alone.)
  auto shard = [&](const std::string& name) {
    const std::string full = "FSDP2 shard of " + name + " (padded chunk 0)";
    std::vector<uint64_t> v;
    for (const MemoryEvent& e : p.events)
      if (e.type == EventType::alloc && e.kind == TensorKind::parameter && p.str(p.tensors[e.tensor].name) == full)
        v.push_back(e.bytes);
    REQUIRE(v.size() == 1);
    return v[0];
  };
  const std::string pre = "model.layers.1.mlp.experts.";
  CHECK(shard(pre + "gate_up_proj") == (E / ws) * 2 * F * D * 4);
  CHECK(shard(pre + "down_proj") == (E / ws) * D * F * 4);
  CHECK(shard(pre + "base_layer.lora_A.default.weight") == (r * E / ws) * D * 4);
  CHECK(shard(pre + "base_layer.lora_B.default.weight") == (2 * F / ws) * r * E * 4);
  CHECK(shard(pre + "lora_A.default.weight") == (r * E / ws) * F * 4);
  CHECK(shard(pre + "lora_B.default.weight") == (D / ws) * r * E * 4);
  // Each layer's unsharded parameters each forward: the frozen experts and the adapters
  // (all_gather_outputs, full padded sizes), in the layer's pre-forward, before the
  // ParamWrapper reads them; again for backward (reshard_after_forward): twice a step, in the
  // warm-up and the measured step.
  CHECK(named_allocs(p, "FSDP2 unsharded " + pre + "gate_up_proj (all_gather_outputs)") ==
        std::vector<uint64_t>(4, E * 2 * F * D * 4));
  CHECK(named_allocs(p, "FSDP2 unsharded " + pre + "base_layer.lora_A.default.weight (all_gather_outputs)") ==
        std::vector<uint64_t>(4, r * E * D * 4));
  CHECK(named_allocs(p, "FSDP2 unsharded " + pre + "lora_B.default.weight (all_gather_outputs)").front() == D * r * E * 4);
  // The reduce-scatter input of a layer's group: the unsharded gradients of its trainable
  // parameters only (the adapters: per_layer elements, every row count divides by 4, no
  // padding), never the frozen experts'.
  const auto rs = named_allocs(p, "FSDP2 reduce-scatter input (chunk_cat) of block 1");
  REQUIRE_FALSE(rs.empty());
  CHECK(rs.front() == per_layer * 4);
  // After the step: the adapters' gradient shards (one reduce-scatter output per group) and
  // AdamW's two moments of them; no gradient for the experts or the router.
  const LiveBytes live = live_bytes_at_mark(p, "optimizer_end");
  REQUIRE(live.found_mark);
  CHECK(live.by_kind[int(TensorKind::gradient)] == 2 * per_layer * 4 / ws);
  CHECK(live.by_kind[int(TensorKind::optimizer_state)] == 2 * (2 * per_layer * 4 / ws));
  // The ParamWrappers run on the unsharded parameters as on one GPU: per layer and target
  // the registration's W + delta and the merged weight, whole (E, out, in) fp32 tensors.
  auto merged = [&](const Program& prog) {
    uint64_t n = 0;
    memsim_test::measured_sum(prog, [&](const MemoryEvent& e) {
      return e.phase == Phase::forward && prog.str(e.op) == "add" &&
             (e.bytes == E * 2 * F * D * 4 || e.bytes == E * D * F * 4);
    }, &n);
    return n;
  };
  CHECK(merged(p) == 2 * 2 * 2);
  CHECK(merged(p) == merged(q));
  // Each hit expert's SelectBackward0 zeros of the whole merged weight, as on one GPU.
  auto selects = [&](const Program& prog) {
    uint64_t n = 0;
    memsim_test::measured_sum(prog, [&](const MemoryEvent& e) { return prog.str(e.op) == "SelectBackward0"; }, &n);
    return n;
  };
  CHECK(selects(p) == selects(q));
  CHECK(selects(p) > 0);
}

TEST_CASE("lora.target_parameters composes with FSDP2's options, checkpointing, DDP under autocast", "[moe-lora][fsdp2]") {
  for (const std::string& extra :
       {std::string("parallel:\n  data: 8\n  sharding: fsdp2\n  reshard_after_forward: false\n"),
        std::string("parallel:\n  data: 8\n  sharding: fsdp2\n  replicate: 2\n"),
        std::string("parallel:\n  data: 4\n  sharding: fsdp2\ncheckpoint:\n  policy: full\n"),
        std::string("parallel:\n  data: 4\n  sharding: fsdp2\ncheckpoint:\n  policy: custom\n  custom: [mlp]\n"),
        std::string("parallel:\n  data: 4\ncheckpoint:\n  policy: full\n")}) {
    INFO(extra);
    const Scenario s = load_scenario_text(fsdp2_yaml(extra), "moe.yaml");
    CHECK_NOTHROW(build_program(s));
  }
  // HF Trainer's autocast (fp32 parameters and adapters) under DDP: the einsum's bf16 operand
  // casts and the fp32 merged weights, as on one GPU. (LoRA under autocast with FSDP2 is
  // refused for every model.)
  CHECK_THROWS_WITH(build_program(load_scenario_text(fsdp2_yaml("parallel:\n  data: 4\n  sharding: fsdp2\n"),
                                                    "moe.yaml", {{"precision.autocast", "bf16"}})),
                    Catch::Contains("not with sharded data parallelism"));
  const Scenario ac = load_scenario_text(fsdp2_yaml("parallel:\n  data: 4\n"), "moe.yaml",
                                         {{"precision.autocast", "bf16"}});
  const Scenario ac1 = load_scenario_text(fsdp2_yaml(""), "moe.yaml", {{"precision.autocast", "bf16"}});
  auto merged = [](const Program& prog) {
    uint64_t n = 0;
    memsim_test::measured_sum(prog, [&](const MemoryEvent& e) {
      return e.phase == Phase::forward && prog.str(e.op) == "add" && (e.bytes == 4u * 96 * 64 * 4 || e.bytes == 4u * 64 * 48 * 4);
    }, &n);
    return n;
  };
  const Program pa = build_program(ac);
  CHECK(merged(pa) == 2 * 2 * 2);
  CHECK(merged(pa) == merged(build_program(ac1)));
}

TEST_CASE("lora.target_parameters: FSDP1, ZeRO, tensor / pipeline / context parallelism stay refused",
          "[moe-lora]") {
  auto err = [](const std::string& parallel) {
    return memsim_test::scenario_error(fsdp2_yaml(parallel), "moe.yaml");
  };
  CHECK(err("parallel:\n  data: 4\n  sharding: fsdp\n  use_orig_params: true\n")
            .find("parallel.sharding: FSDP1 with lora.target_parameters is not modelled") != std::string::npos);
  CHECK(err("parallel:\n  data: 4\n  sharding: fsdp\n  fsdp_wrap: peft\n").find("huggingface/peft#3080") !=
        std::string::npos);
  // (LoRA with context parallelism is refused for every model before this key is checked.)
  CHECK_FALSE(memsim_test::scenario_error(fsdp2_yaml("parallel:\n  data: 4\n  sharding: fsdp2\n  context: 2\n"),
                                          "moe.yaml", {{"model.attention", "flash"}})
                  .empty());
  CHECK_FALSE(err("parallel:\n  data: 4\n  zero: 1\n").empty());
  CHECK_FALSE(err("parallel:\n  data: 4\n  sharding: deepspeed\n  zero: 3\n").empty());
  CHECK_FALSE(err("parallel:\n  data: 2\n  tensor: 2\n").empty());
}

TEST_CASE("lora.target_parameters on DeepSeek-V2-Lite under FSDP2: the experts' adapters shard on dim 0",
          "[moe-lora][fsdp2][deepseek]") {
  // 64 experts of 1408 (D 2048), r 4, both expert weights, 8 ranks: lora_A (r*E = 256, in)
  // keeps 32 rows a rank, lora_B (out, 256) out / 8 rows; the frozen experts 8 whole experts.
  const Scenario s = load_scenario_text(
      "model:\n  preset: deepseek-v2-lite\n  moe: {experts_implementation: eager}\nbatch:\n  seq_len: 16\n"
      "precision: {params: bf16}\nlora:\n  rank: 4\n  target_parameters: [gate_up_proj, down_proj]\n"
      "parallel: {sharding: fsdp2, data: 8}\ndevice: {capacity: 1TiB}\n",
      "ds.yaml");
  const Program p = build_program(s);
  constexpr uint64_t E = 64, F = 1408, D = 2048, r = 4, ws = 8;
  std::map<std::string, uint64_t> shard;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && e.kind == TensorKind::parameter) shard[p.str(p.tensors[e.tensor].name)] = e.bytes;
  const std::string pre = "FSDP2 shard of model.layers.1.mlp.experts.";
  const std::string post = " (padded chunk 0)";
  CHECK(shard.at(pre + "gate_up_proj" + post) == (E / ws) * 2 * F * D * 2);
  CHECK(shard.at(pre + "base_layer.lora_A.default.weight" + post) == (r * E / ws) * D * 4);
  CHECK(shard.at(pre + "base_layer.lora_B.default.weight" + post) == (2 * F / ws) * r * E * 4);
  CHECK(shard.at(pre + "lora_A.default.weight" + post) == (r * E / ws) * F * 4);
  CHECK(shard.at(pre + "lora_B.default.weight" + post) == (D / ws) * r * E * 4);
  // The dense first layer has no experts, so no adapters.
  CHECK(shard.count("FSDP2 shard of model.layers.0.mlp.experts.lora_A.default.weight" + post) == 0);
  // 26 MoE layers' adapters are the trainable parameters.
  CHECK(trainable_parameter_count(s) == 26LL * r * E * ((D + 2 * F) + (F + D)));
}
