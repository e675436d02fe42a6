// QLoRA on mixture-of-experts models (issue #15 item 5; lora.base_dtype: nf4 on the MoE rows and
// DeepSeek; docs/moe.md "QLoRA on a mixture-of-experts model", docs/deepseek.md "QLoRA"):
//  - against real PyTorch: tests/data/torch_cpu_moe_qlora/*.json, training steps of the MoE
//    stand-ins with bitsandbytes' Linear4bit and PEFT's lora.bnb.Linear4bit written out
//    (tools/fixtures/gen_moe_qlora_fixtures.py, torch 1.13 CPU): forward-end bytes by kind and
//    by layer, every layer's forward allocations in order, layer 0's backward allocations;
//  - by construction: which weights are 4-bit (nn.Linear modules only: transformers 5.x's
//    replace_with_bnb_linear) and which stay in precision.params (routers, 3-D experts,
//    embeddings, norms, lm_head), on DeepSeek-V2-Lite and Qwen3-30B-A3B;
//  - PEFT's Linear4bit adapter path (the clone, the cast back before the add) on a dense model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "decoder_arch_test_support.h"
#include "json_test_support.h"
#include "moe_fixture_test_support.h"
#include "scenario/peft_input_grads_key.h"
#include "scenario/scenario.h"
#include "sim/analysis/parameter_count.h"
#include "torch_fixture_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kDir = MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_moe_qlora";

std::string yaml_list(const nlohmann::json& names) {
  std::string y = "[";
  for (size_t i = 0; i < names.size(); ++i) y += (i ? ", " : "") + names[i].get<std::string>();
  return y + "]";
}

// The lora section of a fixture: the 4-bit base, PEFT's adapters (fp32: the fixture's to_bf16
// keeps them so), its targets and target_parameters.
std::string lora_yaml(const nlohmann::json& l) {
  std::string y;
  y += "lora:\n  rank: " + std::to_string(l["rank"].get<int>()) + "\n  alpha: " +
       std::to_string(l["alpha"].get<int>()) + "\n  base_dtype: nf4\n  adapter_dtype: fp32\n";
  if (l.contains("targets")) y += "  targets: " + yaml_list(l["targets"]) + "\n";
  if (l.contains("target_parameters")) y += "  target_parameters: " + yaml_list(l["target_parameters"]) + "\n";
  return y;
}

// PEFT's prepare_model_for_kbit_training (lora.prepare_kbit, scenario/peft_kbit_key.h): the
// fixture's stand-in freezes, casts nothing (fp32), hooks the embedding output and
// checkpoints every layer reentrantly; the key alone must give memsim all of that.
std::string prepare_yaml(const nlohmann::json& c) {
  return c.value("prepare_kbit", false) ? "  prepare_kbit: true\n" : "";
}

std::string run_yaml(const nlohmann::json& c) {
  std::string y;
  // Every layer checkpointed, non-reentrant; torch 1.13 re-runs the whole layer.
  if (c.value("checkpoint", std::string("none")) == "full") y += "checkpoint:\n  policy: full\n  early_stop: false\n";
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  return y + "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
}

// A DeepSeek fixture's run (as tests/test_deepseek.cpp builds it): its config.json as
// model.hf_config, the forced routing as model.moe.routing counts.
Scenario deepseek_scenario_for(const nlohmann::json& c, const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / "memsim_test_moe_qlora";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / (name + ".config.json")).string();
  {
    std::ofstream out(path);
    out << c["hf_config"].dump(1);
  }
  std::string counts;
  for (const auto& n : c["deepseek"]["counts"]) counts += (counts.empty() ? "" : ", ") + std::to_string(n.get<int>());
  std::string y = "model:\n  hf_config: " + path + "\n  attention: eager\n  dropout: 0\n";
  y += "  moe:\n    routing: counts:[" + counts + "]\n";
  y += "    experts_implementation: eager\n";  // the fixtures' loop (memsim's default: grouped_mm)
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: " + c.value("dtype", std::string("fp32")) + "\n";
  return load_scenario_text(y + lora_yaml(c["lora"]) + prepare_yaml(c) + run_yaml(c),
                            "deepseek-qlora-fixture.yaml");
}

// A MoE fixture's run: its MoE block, the 4-bit linears and PEFT's adapters.
Scenario scenario_for(const nlohmann::json& c, const std::string& name) {
  if (c.contains("hf_config")) return deepseek_scenario_for(c, name);
  const std::string y = memsim_test::fixture_shape_yaml(c) + lora_yaml(c["lora"]) + prepare_yaml(c) + run_yaml(c);
  // The MoE block is set after loading (the fixture's forced counts); the overrides give the
  // reader a MoE model to check the LoRA keys against.
  return memsim_test::moe_fixture_scenario(y, "moe-qlora-fixture.yaml", c);
}

// Params4bit storage of an n-element weight (graph/models/lora.h): packed codes, uint8 absmax
// per 64, fp32 state2 absmax per 256 blocks, fp32 offset, 16-entry fp32 code.
uint64_t nf4_bytes(uint64_t n) {
  const uint64_t blocks = (n + 63) / 64;
  return (n + 1) / 2 + blocks + (blocks + 255) / 256 * 4 + 4 + 16 * 4;
}

using memsim_test::measured_sum;

}  // namespace

TEST_CASE("QLoRA on MoE models matches real PyTorch training steps (CPU fixtures)", "[moe-qlora]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 9);
  memsim_test::print_fixture_table_header();
  for (const auto& path : files) {
    const nlohmann::json fx = memsim_test::load_json(path);
    INFO(fx["name"].get<std::string>());
    const Scenario scenario = scenario_for(fx["config"], fx["name"].get<std::string>());
    const Program program = build_program(scenario);
    memsim_test::compare_with_fixture(fx, scenario, program);
    memsim_test::check_forward_allocs_by_layer(fx, program);
    // Every 4-bit linear dequantises its weight in forward (and again in backward where its
    // input needs a grad): the (out, in) bf16 temporaries, in both.
    uint64_t real_fw = 0, sim_fw = 0;
    for (const auto& ev : fx["events"])
      if (ev[0] == "alloc" && ev[3] == "forward" && ev[1] == "empty") ++real_fw;
    measured_sum(program, [&](const MemoryEvent& e) {
      return e.phase == Phase::forward && program.str(e.op) == "matmul_4bit";
    }, &sim_fw);
    // torch: the two `empty`s of dequantize_4bit per call (the output is F.linear's); memsim
    // records all three under matmul_4bit.
    CHECK(real_fw > 0);
    CHECK(sim_fw == real_fw / 2 * 3);
    // In backward: MatMul4Bit's backward dequantises again for every 4-bit linear whose input
    // needs a grad, and a checkpointed layer's recompute once more before that.
    uint64_t real_bw = 0, sim_bw = 0;
    for (const auto& ev : fx["events"])
      if (ev[0] == "alloc" && ev[3] == "backward" && ev[1] == "empty") ++real_bw;
    measured_sum(program, [&](const MemoryEvent& e) {
      return e.phase == Phase::backward &&
             (program.str(e.op) == "matmul_4bit" || program.str(e.op) == "MatMul4BitBackward");
    }, &sim_bw);
    CHECK(real_bw > 0);
    CHECK(sim_bw == real_bw / 2 * 3);
    if (fx["config"].value("checkpoint", std::string("none")) == "full") CHECK(real_bw > real_fw);
    if (fx["config"].value("prepare_kbit", false)) {
      // What the key set: every layer, reentrant, the embedding-output hook.
      CHECK(scenario.checkpoint.policy == CheckpointPolicy::full);
      CHECK(scenario.checkpoint.reentrant == std::optional<bool>(true));
      CHECK(lora_input_require_grads(scenario));
      CHECK(real_bw > real_fw);  // the reentrant re-run dequantises again
      // Exact up to layer 0's experts backward: the real peak comes there, where torch 1.13
      // CPU's IndexBackward0 (zeros + index_put_(accumulate=True)) allocates a second
      // (tokens, d_model) buffer next to its zeros (the trace's `new_zeros` then `index_put`,
      // 16 KiB each), which the CUDA path memsim models does not. Before it, the highest
      // point is the end of layer 0's reentrant re-run, with the whole re-run graph alive.
      const uint64_t base = fx["marks"]["measured_step_begin"]["total"];
      int64_t live = 0, high = 0;
      for (const auto& ev : fx["events"]) {
        const bool alloc = ev[0] == "alloc";
        if (alloc && ev[3] == "backward" && ev[4] == 0 && ev[1] == "index_put" && ev[2] == 16384) break;
        live += alloc ? ev[2].get<int64_t>() : -ev[2].get<int64_t>();
        high = std::max(high, live);
      }
      CHECK(base + static_cast<uint64_t>(high) == memsim_test::walk(program).step_peak);
    }
  }
}

TEST_CASE("QLoRA on DeepSeek-V2-Lite: nn.Linear weights in NF4, router and experts in bf16", "[moe-qlora]") {
  const Scenario s = load_scenario_text(
      "model: {preset: deepseek-v2-lite, attention: eager}\nbatch: {micro_batch: 1, seq_len: 64}\n"
      "precision: {params: bf16}\n"
      "lora: {rank: 8, alpha: 16, targets: [q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj], base_dtype: nf4}\n"
      "device: {capacity: 1TiB}\n",
      "ds-qlora.yaml");
  const Program p = build_program(s);
  // transformers 5.17 DeepseekV2: D 2048, 27 layers (layer 0 dense, d_ff 10944), 26 MoE layers of
  // 64 routed experts of 1408 and 2 shared (one MLP of 2816); MLA with q_proj (H 16, qk 192,
  // v 128), kv_lora_rank 512 + rope 64; vocab 102400, untied.
  constexpr uint64_t D = 2048, V = 102400, E = 64, F = 1408, S = 2816, Fd = 10944;
  const uint64_t attn = nf4_bytes(3072 * D) + nf4_bytes(576 * D) + nf4_bytes(4096 * 512) + nf4_bytes(D * D);
  const uint64_t norms = (512 + 2 * D) * 2;  // kv_a_layernorm, input / post-attention norms
  const uint64_t dense = 3 * nf4_bytes(Fd * D);
  const uint64_t moe = (E * D + E * 2 * F * D + E * D * F) * 2 + 3 * nf4_bytes(S * D);  // router, experts bf16
  const uint64_t root = (V * D + D + V * D) * 2 + 256 * 4;  // embed, norm, lm_head, bnb's dynamic map
  const uint64_t adapters = static_cast<uint64_t>(trainable_parameter_count(s)) * 4;  // fp32
  CHECK(adapters == 27ull * 8 * ((D + 3072) + (D + 576) + (512 + 4096) + (D + D)) * 4);
  const memsim_test::Walk w = memsim_test::walk(p);
  CHECK(w.forward_end_by_kind.at(TensorKind::parameter) ==
        27 * (attn + norms) + dense + 26 * moe + root + adapters);
  // The routed experts are the bulk: 26 x 64 x 3 x 1408 x 2048 bf16 = 26.81 GiB of 28.06 GiB.
  uint64_t experts = 0;
  for (const TensorInfo& t : p.tensors)
    if (t.kind == TensorKind::parameter && p.str(t.name).find("mlp.experts.") != std::string::npos) experts += t.bytes;
  CHECK(experts == 26 * E * 3 * F * D * 2);
  // Dequantised weights in forward: one fp32 absmax, one bf16 weight and the output per 4-bit
  // call: 4 per layer (q, kv_a, kv_b, o), 3 in the dense MLP and in each shared expert.
  uint64_t n = 0;
  measured_sum(p, [&](const MemoryEvent& e) {
    return e.phase == Phase::forward && p.str(e.op) == "matmul_4bit";
  }, &n);
  CHECK(n == 3 * (27 * 4 + 3 + 26 * 3));
}

TEST_CASE("QLoRA on Qwen3-30B-A3B: 4-bit attention, 54 GiB of bf16 experts", "[moe-qlora]") {
  const std::string y = "model: {preset: qwen3-30b-a3b, attention: flash}\nbatch: {micro_batch: 1, seq_len: 64}\n"
                        "precision: {params: bf16}\nlora: {rank: 16, alpha: 32, targets: [q_proj, k_proj, v_proj, o_proj]}\n"
                        "device: {capacity: 1TiB}\n";
  const Program q = build_program(load_scenario_text(y, "q.yaml", {{"lora.base_dtype", "nf4"}}));
  const Program b = build_program(load_scenario_text(y, "b.yaml"));
  // 48 layers: q 4096 x 2048, k and v 512 x 2048, o 2048 x 4096; 128 experts of 768.
  constexpr uint64_t D = 2048, L = 48;
  const uint64_t bf16_attn = L * (4096 * D + 2 * 512 * D + D * 4096) * 2;
  const uint64_t nf4_attn = L * (2 * nf4_bytes(4096 * D) + 2 * nf4_bytes(512 * D));
  const memsim_test::Walk wq = memsim_test::walk(q), wb = memsim_test::walk(b);
  // QLoRA saves what the attention loses, and bnb's shared map costs 1 KiB: nothing else moves.
  CHECK(wb.forward_end_by_kind.at(TensorKind::parameter) - wq.forward_end_by_kind.at(TensorKind::parameter) ==
        bf16_attn - nf4_attn - 256 * 4);
  uint64_t experts = 0;
  for (const TensorInfo& t : q.tensors)
    if (t.kind == TensorKind::parameter && q.str(t.name).find("mlp.experts.") != std::string::npos) experts += t.bytes;
  CHECK(experts == L * 128 * 3 * 768 * D * 2);
  CHECK(experts == 54ull << 30);
}

TEST_CASE("QLoRA's adapter path is PEFT's lora.bnb.Linear4bit: clone, cast back, add in bf16", "[moe-qlora][lora]") {
  // One adapted q_proj on a small bf16 LLaMA with fp32 adapters (PEFT's default).
  const std::string y = "model:\n  family: hf-llama\n  layers: 1\n  d_model: 64\n  heads: 4\n  kv_heads: 4\n"
                        "  d_ff: 128\n  vocab: 256\n  context_length: 64\n  attention: eager\n"
                        "batch: {micro_batch: 2, seq_len: 32}\nprecision: {params: bf16}\n"
                        "lora: {rank: 8, targets: [q_proj]}\ndevice: {capacity: 1TiB}\n";
  const Program q = build_program(load_scenario_text(y, "q.yaml", {{"lora.base_dtype", "nf4"}}));
  const Program b = build_program(load_scenario_text(y, "b.yaml"));
  constexpr uint64_t rows = 64, out = 64;
  auto forward_allocs = [](const Program& p, const char* op, uint64_t bytes) {
    uint64_t n = 0;
    measured_sum(p, [&](const MemoryEvent& e) {
      return e.phase == Phase::forward && p.str(e.op) == op && e.bytes == bytes;
    }, &n);
    return n;
  };
  // bnb: result.clone() of the (rows, out) bf16 base output; the adapter's fp32 output is cast
  // to bf16 before the add, so the sum is bf16. PEFT's Linear (a bf16 base): the sum promotes
  // to fp32 and is cast back after.
  // (The attention's own clones and adds of these sizes are in both.)
  CHECK(forward_allocs(q, "clone", rows * out * 2) == forward_allocs(b, "clone", rows * out * 2) + 1);
  CHECK(forward_allocs(b, "add", rows * out * 4) == forward_allocs(q, "add", rows * out * 4) + 1);
  CHECK(forward_allocs(q, "add", rows * out * 2) == forward_allocs(b, "add", rows * out * 2) + 1);
  // Both cast a (rows, out) tensor to bf16 once: the adapter output (bnb) or the sum (Linear).
  CHECK(forward_allocs(q, "_to_copy", rows * out * 2) == forward_allocs(b, "_to_copy", rows * out * 2));
}
