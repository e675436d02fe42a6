// torch.compile with LoRA adapters (frozen base weights): what the min-cut partition of a
// block saves when only the adapters need grads (docs/compile.md "LoRA inside the compiled
// layers"). The partitioner needs nothing LoRA-specific: with frozen base weights the
// joint graph has no weight-grad matmul for them, so a value only the base matmul read
// (e.g. down_proj's input when down_proj has no adapter) is no backward input at all, and
// the adapters' lora_a input and lora_b input are what their weight grads read (matmul
// inputs: materialised in the backward, saved). memsim's recorded graph has exactly eager's
// saves (the ops follow requires_grad), so the rules apply unchanged.
//  - Against torch 1.13 on CPU (tests/data/compile/partition_hf_llama_lora.json,
//    tools/fixtures/gen_compile_lora_fixture.py): the fixture Llama block with LoRALinear
//    on q/v, and on all seven projections, partitioned by functorch's min-cut; memsim's
//    same block (the 1.13 rules) saves the same bytes and storages, and eager the same.
//  - torchtune's code (the scenario path): single device and FSDP2 (lora_finetune_
//    distributed: compile_model before shard_model), with and without checkpointing.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "compile_test_support.h"
#include "graph/compile.h"
#include "json_test_support.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// The fixture's block as layer 1 of 2 (its input then requires grad, as the fixture's
// does; layer 0's comes from the frozen embedding), LoRA on `targets`.
graph::CompiledRegionStats lora_block(const nlohmann::json& c, const nlohmann::json& run,
                                      graph::PartitionerVersion v) {
  std::string y = "model:\n  family: hf-llama\n  layers: 2\n";
  for (const char* k : {"d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += "  attention: eager\nbatch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "lora:\n  rank: " + std::to_string(run["lora_rank"].get<int>()) + "\n  alpha: 16\n  targets: [";
  bool first = true;
  for (const auto& t : run["lora_targets"]) {
    y += (first ? "" : ", ") + t.get<std::string>();
    first = false;
  }
  y += "]\n";
  const auto regions =
      memsim_test::compiled_block_forward(load_scenario_text(y, "lora-fixture.yaml"), nullptr, v);
  REQUIRE(regions.size() == 2);
  return regions[1];
}

std::string tune_yaml(bool compile, const std::string& rest) {
  std::string y =
      "model:\n  family: hf-llama\n  implementation: torchtune\n  attention: flash\n"
      "  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 160\n  vocab: 128\n"
      "  context_length: 16\n"
      "batch:\n  micro_batch: 2\n  seq_len: 16\n"
      "precision:\n  params: bf16\n  autocast: none\n"
      "optimizer:\n  type: adamw\n  impl: fused\n"
      "lora:\n  rank: 8\n  alpha: 16\n  targets: [q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]\n"
      "step:\n  kind: train\n  warmup_steps: 1\n";
  if (compile) y += "  compile: true\n  compile_scope: block\n";
  y += rest;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return y;
}

Program build(const std::string& y) { return build_program(load_scenario_text(y, "tl.yaml")); }

}  // namespace

TEST_CASE("compiled LoRA blocks save what AOTAutograd's min-cut saves (torch 1.13 CPU fixture)",
          "[compile][lora][fixtures]") {
  const nlohmann::json fx = memsim_test::load_json(std::filesystem::path(
      MEMSIM_SOURCE_DIR + "/tests/data/compile/partition_hf_llama_lora.json"));
  REQUIRE(fx["runs"].size() == 2);
  for (const nlohmann::json& run : fx["runs"]) {
    INFO(run["run"].get<std::string>());
    const auto st = lora_block(run["config"], run, graph::PartitionerVersion::torch113_inductor);
    // Eager: the fixture's, but for the Python float's wrapped-number tensor that each
    // adapter's `(alpha / rank) * lora_b(...)` saves (a 0-dim float64 MulBackward0 keeps
    // as `other`): 8 B on the CPU there, a CPU scalar with a CUDA model, no device memory.
    const uint64_t adapters = run["lora_targets"].size();
    CHECK(st.eager_saved_bytes + 8 * adapters == run["eager_saved_bytes"].get<uint64_t>());
    // Compiled: exactly the partition's bytes and storages (the scalar is a constant of
    // the graph, not saved).
    CHECK(st.saved_bytes == run["saved_bytes"].get<uint64_t>());
    CHECK(st.saved == run["saved_storages"].get<uint32_t>());
  }
}

namespace {
// One forward of torchtune's 2-layer LoRA model (targets q, v; bf16), every layer its own
// compiled region (the engine alone, no schedule): the regions' statistics.
std::vector<graph::CompiledRegionStats> tune_lora_regions(const std::string& targets) {
  std::string y = tune_yaml(false, "");
  const std::string all = "[q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]";
  y.replace(y.find(all), all.size(), targets);
  return memsim_test::compiled_block_forward(load_scenario_text(y, "tl.yaml"));
}
}  // namespace

TEST_CASE("compile + torchtune LoRA: what one compiled layer saves, by hand", "[compile][lora][torchtune]") {
  // bf16, rows 2 x 16, D 64, 4 heads / 2 KV, F 160, LoRA rank 8 on q_proj and v_proj (the
  // rest frozen, norms' scales included). The min-cut by hand:
  //  - sa_norm's output (x_normed * scale): lora_a's weight grad reads it (q's and v's);
  //    the frozen base mms read it for nothing (no weight grad). In layer 0 nothing needs
  //    sa_norm's backward (the embedding is frozen: no grad reaches the input), so neither
  //    its rsqrt nor the input is saved; in layer 1 both are.
  //  - each adapter's lora_a output (rows x 8 x 2 B): lora_b's weight grad reads it.
  //  - q after the RoPE, the repeated k and v, SDPA's output and logsumexp (as without
  //    LoRA).
  //  - mlp_norm's backward (the grad to the residual stream): its rsqrt, and what its input
  //    is recomputed from: layer 1, output_proj's output (with the layer input, saved
  //    anyway); layer 0, the residual sum itself (the input is not needed there, so one
  //    hidden-sized tensor is the cheaper cut). mlp_norm's output is not saved: w1 and w3
  //    are frozen, no weight grad reads it.
  //  - w1's and w3's outputs (silu's and the product's backward); not silu(w1) * w3:
  //    down_proj is frozen.
  const uint64_t act = 32 * 64 * 2, lo = 32 * 8 * 2, rstd = 32 * 4, lse = 2 * 4 * 16 * 4,
                 ff = 32 * 160 * 2;
  using graph::OpKind;
  using Want = std::vector<std::pair<OpKind, uint64_t>>;
  const Want layer0 = {{OpKind::mul, act},          {OpKind::mm_linear, lo},
                       {OpKind::to_copy, act},      {OpKind::mm_linear, lo},
                       {OpKind::expand_clone, act}, {OpKind::expand_clone, act},
                       {OpKind::sdpa_flash, act},   {OpKind::sdpa_flash, lse},
                       {OpKind::add, act},          {OpKind::rsqrt, rstd},
                       {OpKind::mm_linear, ff},     {OpKind::mm_linear, ff}};
  const Want layer1 = {{OpKind::other, act},        {OpKind::rsqrt, rstd},
                       {OpKind::mul, act},          {OpKind::mm_linear, lo},
                       {OpKind::to_copy, act},      {OpKind::mm_linear, lo},
                       {OpKind::expand_clone, act}, {OpKind::expand_clone, act},
                       {OpKind::sdpa_flash, act},   {OpKind::sdpa_flash, lse},
                       {OpKind::mm_linear, act},    {OpKind::rsqrt, rstd},
                       {OpKind::mm_linear, ff},     {OpKind::mm_linear, ff}};
  const auto regions = tune_lora_regions("[q_proj, v_proj]");
  REQUIRE(regions.size() == 2);  // the layers (forward only: no loss here)
  for (int l = 0; l < 2; ++l) {
    const auto& r = regions[l];
    const Want& want = l == 0 ? layer0 : layer1;
    INFO(l);
    memsim_test::check_saved_values(r, want, l == 1);
    uint64_t total = 0;
    for (const auto& w : want) total += w.second;
    // Eager saves instead the norms' fp32 upcasts (x.float(), rows x D x 4) and silu(w1),
    // and neither the layer input nor output_proj's output (layer 0: nor the residual sum;
    // its mlp_norm upcast stands for it).
    const uint64_t xf = 32 * 64 * 4;
    CHECK(r.eager_saved_bytes == (l == 0 ? total - act + xf + ff : total - 2 * act + 2 * xf + ff));
  }
}

TEST_CASE("compile + torchtune LoRA: the step, with checkpointing and under FSDP2",
          "[compile][lora][torchtune][fsdp2]") {
  const std::string ac = "checkpoint:\n  policy: full\n";
  const std::string par = "parallel:\n  data: 4\n  sharding: fsdp2\n";
  const memsim_test::Trace eager = memsim_test::trace(build(tune_yaml(false, "")));
  const memsim_test::Trace comp = memsim_test::trace(build(tune_yaml(true, "")));
  CHECK(eager.ok);
  CHECK(comp.ok);
  CHECK(comp.end == eager.end);
  CHECK(comp.forward_end < eager.forward_end);
  // Checkpointing around the compiled layers (graph/compile.h 4c): each layer keeps its
  // input only, as eager's checkpoint.
  const memsim_test::Trace eager_ac = memsim_test::trace(build(tune_yaml(false, ac)));
  const memsim_test::Trace comp_ac = memsim_test::trace(build(tune_yaml(true, ac)));
  CHECK(comp_ac.ok);
  CHECK(comp_ac.forward_end == eager_ac.forward_end);
  CHECK(comp_ac.end == eager_ac.end);
  // lora_finetune_distributed: compile_model, then shard_model. FSDP2's buffers are the
  // same compiled or not, and compile saves the same bytes as on one GPU.
  for (const std::string& rest : {par, ac + par}) {
    INFO(rest);
    const memsim_test::Trace e = memsim_test::trace(build(tune_yaml(false, rest)));
    const memsim_test::Trace c = memsim_test::trace(build(tune_yaml(true, rest)));
    CHECK(e.ok);
    CHECK(c.ok);
    CHECK(c.end == e.end);
    REQUIRE(!c.fsdp2.empty());
    CHECK(c.fsdp2 == e.fsdp2);
    if (rest == par) CHECK(e.forward_end - c.forward_end == eager.forward_end - comp.forward_end);
    else CHECK(c.forward_end == e.forward_end);
  }
}

TEST_CASE("compile + LoRA: what is not modelled is refused by key", "[compile][lora]") {
  auto error_of = [](const std::string& y) -> std::string {
    try {
      build(y);
    } catch (const ScenarioError& e) {
      return e.what();
    }
    return "";
  };
  // LoRA dropout inside the compiled layers.
  std::string y = tune_yaml(true, "");
  y.replace(y.find("  alpha: 16\n"), 12, "  alpha: 16\n  dropout: 0.05\n");
  CHECK(error_of(y).find("lora.dropout") != std::string::npos);
  // PEFT's adapters on transformers' code.
  const std::string hf = memsim_test::tiny_compile_yaml(
      "hf-llama", "bf16", "fused", "  compile: true\n  compile_scope: block\n",
      "lora:\n  rank: 8\n  targets: [q_proj, v_proj]\n");
  CHECK(error_of(hf).find("lora.rank") != std::string::npos);
}
