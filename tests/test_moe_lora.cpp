// LoRA on the routed experts (issue #15; lora.target_parameters, PEFT >= 0.17's
// LoraConfig(target_parameters=[...]): graph/models/moe_param_lora.h, docs/moe.md "LoRA on the
// routed experts"):
//  - against real PyTorch: tests/data/torch_cpu_moe_lora/*.json, training steps of the MoE
//    stand-ins with PEFT's ParamWrapper written out (tools/fixtures/gen_moe_lora_fixtures.py,
//    torch 1.13 CPU): forward-end bytes by kind and by layer, every layer's forward
//    allocations in order, and the step peak, exactly (where the real peak is one of torch
//    1.13's out-of-place grad sums, which 2.x makes in place, by exactly that tensor);
//  - the trainable parameters, grads and optimizer state, the CUDA-only einsum copies;
//  - the key's accepted forms and what stays refused, by key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_support.h"
#include "decoder_arch_test_support.h"
#include "json_test_support.h"
#include "moe_fixture_test_support.h"
#include "scenario_error_test_support.h"
#include "scenario/scenario.h"
#include "sim/analysis/parameter_count.h"
#include "torch_fixture_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kDir = MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_moe_lora";

Scenario scenario_for(const nlohmann::json& c) {
  std::string y = memsim_test::fixture_shape_yaml(c);
  // HF Trainer's mixed precision: fp32 model and adapters, forward and loss under autocast
  // (the precision block is fixture_shape_yaml's last, as in tests/test_moe_compose.cpp).
  if (c.value("autocast", std::string("none")) == "bf16") y += "  autocast: bf16\n";
  const std::string dtype = c.value("dtype", std::string("fp32"));
  const nlohmann::json& l = c["lora"];
  y += memsim_test::target_parameters_lora_yaml(l);
  // gen.run casts the adapters with the model (bf16), or PEFT's cast_adapter_dtype upcasts
  // them again (the fixture's adapter_dtype fp32).
  if (dtype == "bf16") y += "  adapter_dtype: " + l.value("adapter_dtype", std::string("bf16")) + "\n";

  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  // The checkpointed rows: torch 1.13's non-reentrant checkpoint re-runs the whole region
  // (early_stop false); "mlp" wraps the MoE block alone (checkpoint.custom [mlp]).
  // The *_reentrant rows: use_reentrant=True with PEFT's enable_input_require_grads hook
  // (lora.input_require_grads, true by default with reentrant checkpointing).
  const std::string ck = c.value("checkpoint", std::string("none"));
  const std::string mode = c.value("reentrant", false) ? "  reentrant: true\n" : "  early_stop: false\n";
  if (ck == "full") y += "checkpoint:\n  policy: full\n" + mode;
  if (ck == "mlp") y += "checkpoint:\n  policy: custom\n  custom: [mlp]\n" + mode;
  // The MoE block is set after loading (the fixture's forced counts); the reader checks the
  // target_parameters key against a MoE model, so the overrides give it one to read.
  return memsim_test::moe_fixture_scenario(y, "moe-lora-fixture.yaml", c);
}

std::string load_error(const std::string& yaml, const std::vector<std::pair<std::string, std::string>>& sets) {
  return memsim_test::scenario_error(yaml, "moe.yaml", sets);
}

// A small Qwen3-MoE-like run (as tests/test_moe_compose.cpp's).
const std::string kBase =
    "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 128\n"
    "  vocab: 256\n  context_length: 64\n  attention: eager\n"
    "  moe: {experts_implementation: eager, experts: 4, top_k: 2, expert_d_ff: 48}\n"
    "batch:\n  micro_batch: 2\n  seq_len: 32\nprecision:\n  params: bf16\ndevice:\n  capacity: 80GiB\n"
    "lora:\n  rank: 4\n";

using memsim_test::measured_sum;

}  // namespace

TEST_CASE("LoRA on the routed experts matches real PyTorch training steps (CPU fixtures)", "[moe-lora]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 17);
  memsim_test::print_fixture_table_header();
  for (const auto& path : files) {
    nlohmann::json fx = memsim_test::load_json(path);
    INFO(fx["name"].get<std::string>());
    // The reentrant rows compare exactly: their CheckpointFunction nodes keep the layer's
    // keyword arguments (transformers 5.x's GradientCheckpointingLayer partial: the mask,
    // (cos, sin), position_ids) until the graph dies, the previous step's past this
    // step's forward end, which memsim models (graph/checkpoint.h).
    const Scenario scenario = scenario_for(fx["config"]);
    const Program program = build_program(scenario);
    // The step peak, exactly: where torch 1.13's peak is one of its out-of-place grad sums
    // (`add` in backward: 2.x adds in place), 2.x's peak is the live bytes just after the
    // allocation before that sum: the real peak less the sum, plus what was freed between
    // them (in the checkpointed rows the expert's weight-slice grad, freed once
    // SelectBackward0's zeros hold it). compare_with_fixture checks real == memsim + that.
    uint64_t torch113_add = 0;
    if (fx["peak_at"]["op"] == "add" && fx["peak_at"]["phase"] == "backward") {
      const size_t at = fx["peak_at"]["event_index"].get<size_t>();
      uint64_t freed = 0;
      for (size_t i = at; i-- > 0 && fx["events"][i][0] == "free";) freed += fx["events"][i][2].get<uint64_t>();
      torch113_add = fx["events"][at][2].get<uint64_t>() - freed;
      CHECK(torch113_add > 0);
    }
    memsim_test::compare_with_fixture(fx, scenario, program, torch113_add);
    memsim_test::check_forward_allocs_by_layer(fx, program);
    // The measured step's backward: memsim allocates nothing torch 1.13 did not (as a
    // multiset), and each hit expert's SelectBackward0 (eager) or each layer's IndexBackward0
    // of `merged[expert_ids]` (batched_mm: torch's index_backward, new_zeros + index_put_)
    // makes a zeros of the whole merged weight in both. What 1.13 allocates besides are its
    // known differences from 2.x (out-of-place grad sums, `add`: of those zeros too;
    // TopkBackward0's out-of-place scatter; docs/moe.md).
    {
      const bool batched = fx["config"]["moe"].value("experts_implementation", std::string("eager")) == "batched_mm";
      const char* real_op = batched ? "new_zeros" : "select_backward";
      const char* sim_op = batched ? "IndexBackward0" : "SelectBackward0";
      std::vector<uint64_t> real_all, real_sel, sim_all, sim_sel;
      for (const auto& ev : fx["events"]) {
        if (ev[0] != "alloc" || ev[3] != "backward") continue;
        real_all.push_back(ev[2].get<uint64_t>());
        if (ev[1] == real_op) real_sel.push_back(ev[2].get<uint64_t>());
      }
      bool measuring = false;
      for (const MemoryEvent& e : program.events) {
        if (e.type == EventType::mark && program.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
          measuring = true;
        if (!measuring || e.type != EventType::alloc || e.phase != Phase::backward) continue;
        sim_all.push_back(e.bytes);
        if (program.str(e.op) == sim_op) sim_sel.push_back(e.bytes);
      }
      for (auto* v : {&real_all, &real_sel, &sim_all, &sim_sel}) std::sort(v->begin(), v->end());
      std::vector<uint64_t> only_sim;
      std::set_difference(sim_all.begin(), sim_all.end(), real_all.begin(), real_all.end(),
                          std::back_inserter(only_sim));
      CHECK(only_sim.empty());
      CHECK(sim_sel == real_sel);
      CHECK_FALSE(sim_sel.empty());
    }
    // Checkpointed rows: the recompute re-enters the ParamWrappers, so the einsum's whole
    // (E, out, in) delta is made again in backward, once per layer and target (in both).
    {
      const nlohmann::json& c = fx["config"];
      // The einsum runs in the model's dtype, or in bf16 under autocast.
      const bool low = c.value("dtype", std::string("fp32")) == "bf16" || c.value("autocast", std::string("none")) == "bf16";
      const uint64_t elem = low ? 2 : 4;
      const uint64_t E = c["moe"]["experts"], F = c["moe"]["expert_d_ff"], D = c["d_model"];
      auto whole = [&](uint64_t b) { return b == E * 2 * F * D * elem || b == E * D * F * elem; };
      uint64_t real_deltas = 0, sim_deltas = 0;
      for (const auto& ev : fx["events"])
        if (ev[0] == "alloc" && ev[3] == "backward" && ev[1] == "bmm" && whole(ev[2].get<uint64_t>())) ++real_deltas;
      measured_sum(program, [&](const MemoryEvent& e) {
        return e.phase == Phase::backward && program.str(e.op) == "bmm" && whole(e.bytes);
      }, &sim_deltas);
      if (c.value("checkpoint", std::string("none")) != "none") {  // (S 96's attention bmm has a like size)
        CHECK(sim_deltas == real_deltas);
        // (the batched_mm row's re-run gate_up bmm output, (S, 2F) = 128 x 96 fp32, has the
        // size of down_proj's (E, D, F) delta: one more per layer)
        const bool batched = c["moe"].value("experts_implementation", std::string("eager")) == "batched_mm";
        CHECK(real_deltas == c["layers"].get<uint64_t>() * (c["lora"]["target_parameters"].size() + (batched ? 1 : 0)));
      }
    }
  }
}

TEST_CASE("lora.target_parameters: adapters r*E*(in+out), frozen experts, merged weights kept", "[moe-lora]") {
  constexpr uint64_t L = 2, E = 4, D = 64, F = 48, r = 4, T = 64;
  const Scenario s = load_scenario_text(kBase + "  target_parameters: [gate_up_proj, down_proj]\n"
                                        "optimizer:\n  type: adamw\n",
                                        "moe.yaml");
  const Program p = build_program(s);
  // ParamWrapper: lora_A (r*E, in) and lora_B (out, r*E) per targeted parameter, fp32
  // (lora.adapter_dtype's default).
  const uint64_t numel = L * (r * E * (D + 2 * F) + r * E * (F + D));
  CHECK(numel == 2 * (4 * 4 * 160 + 4 * 4 * 112));
  CHECK(trainable_parameter_count(s) == static_cast<int64_t>(numel));
  // Gradients: the adapters' only (fp32); the router and the 3-D experts stay frozen.
  CHECK(measured_sum(p, [](const MemoryEvent& e) { return e.kind == TensorKind::gradient; }) == numel * 4);
  const memsim_test::Walk w = memsim_test::walk(p);
  CHECK(w.forward_end_by_kind.at(TensorKind::optimizer_state) == 2 * numel * 4);
  // Per layer and target: the einsum's (E, out, in) fp32 output, the scaled delta, its bf16
  // copy (.to(param dtype)), the registration's W + delta and the merged weight: bf16
  // merged weights of E*2F*D and E*D*F elements.
  uint64_t merged = 0;
  measured_sum(p, [&](const MemoryEvent& e) {
    return e.phase == Phase::forward && p.str(e.op) == "add" && (e.bytes == E * 2 * F * D * 2 || e.bytes == E * D * F * 2);
  }, &merged);
  CHECK(merged == L * 2 * 2);  // the check's transient and the merged weight, two targets
  // The backward: a zeros of the whole merged weight per hit expert (balanced: all four).
  uint64_t selects = 0;
  measured_sum(p, [&](const MemoryEvent& e) { return e.phase == Phase::backward && p.str(e.op) == "SelectBackward0"; },
               &selects);
  CHECK(selects == L * E * 2);
  // CUDA's contiguous copy of the einsum's left operand (B permuted), forward and backward:
  // B-sized fp32 temporaries (gate_up's 2F x r*E, down's D x r*E), none without kernel
  // scratch. (The bmm's own grads are the adapters' .grad: kind gradient.)
  auto clones = [&](const Program& q) {
    uint64_t n = 0;
    measured_sum(q, [&](const MemoryEvent& e) {
      return e.kind == TensorKind::temporary && (e.bytes == 2 * F * r * E * 4 || e.bytes == D * r * E * 4) &&
             (q.str(e.op) == "bmm" || q.str(e.op) == "BmmBackward0");
    }, &n);
    return n;
  };
  const Scenario cpu = load_scenario_text(kBase + "  target_parameters: [gate_up_proj, down_proj]\n"
                                          "optimizer:\n  type: adamw\n",
                                          "moe.yaml", {{"device.kernel_scratch", "false"}});
  // (left's own grad, a B-sized temporary on its way to the reshape's copy, is in both)
  CHECK(clones(p) == clones(build_program(cpu)) + L * 2 * 2);
  (void)T;
}

TEST_CASE("lora.target_parameters: accepted forms and refusals by key", "[moe-lora]") {
  for (const char* v : {"gate_up_proj", "experts.down_proj", "mlp.experts.gate_up_proj,down_proj"})
    CHECK(load_error(kBase, {{"lora.target_parameters", v}}).empty());
  CHECK(load_error(kBase, {{"lora.target_parameters", "up_proj"}})
            .find("lora.target_parameters: 'up_proj' is not a parameter") != std::string::npos);
  CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"lora.dropout", "0.1"}})
            .find("lora.dropout: PEFT's ParamWrapper") != std::string::npos);
  // Every experts implementation (the *_batched_mm_* fixtures; grouped_mm by hand below),
  // and without the key transformers 5.x's default, grouped_mm.
  for (const char* impl : {"eager", "batched_mm", "grouped_mm"})
    CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"model.moe.experts_implementation", impl}})
              .empty());
  {
    std::string dflt = kBase;
    dflt.replace(dflt.find("experts_implementation: eager, "), 31, "");
    CHECK(load_error(dflt, {{"lora.target_parameters", "gate_up_proj,down_proj"}}).empty());
  }
  // Checkpointing: full and custom [mlp] in every mode (the fixtures' *_ckpt_* rows, and the
  // early stop's structure below); the other policies by key.
  CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"checkpoint.policy", "full"}}).empty());
  CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"checkpoint.policy", "full"},
                           {"checkpoint.early_stop", "true"}}).empty());
  CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"checkpoint.policy", "full"},
                           {"checkpoint.early_stop", "false"}}).empty());
  CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"checkpoint.policy", "custom"},
                           {"checkpoint.custom", "[mlp]"}, {"checkpoint.early_stop", "false"}}).empty());
  // Reentrant (the *_reentrant rows): it never stops early, so early_stop is not asked for.
  CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"checkpoint.policy", "full"},
                           {"checkpoint.reentrant", "true"}}).empty());
  CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"checkpoint.policy", "custom"},
                           {"checkpoint.custom", "[mlp]"}, {"checkpoint.reentrant", "true"}}).empty());
  CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"checkpoint.policy", "selective"},
                           {"checkpoint.reentrant", "true"}})
            .find("checkpoint.policy: activation checkpointing with lora.target_parameters") != std::string::npos);
  for (const std::vector<std::pair<std::string, std::string>>& sets :
       std::vector<std::vector<std::pair<std::string, std::string>>>{
           {{"checkpoint.policy", "selective"}},
           {{"checkpoint.policy", "modules"}},
           {{"checkpoint.policy", "custom"}, {"checkpoint.custom", "[attention]"}},
           {{"checkpoint.policy", "custom"}, {"checkpoint.custom", "[0]"}}}) {
    auto all = sets;
    all.push_back({"lora.target_parameters", "down_proj"});
    INFO(sets.front().second);
    CHECK(load_error(kBase, all).find("checkpoint.policy: activation checkpointing with lora.target_parameters") !=
          std::string::npos);
  }
  // DDP and FSDP2 are modelled (tests/test_moe_lora_parallel.cpp); tensor parallelism is not.
  CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"parallel.data", "2"}}).empty());
  CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"parallel.data", "2"}, {"parallel.tensor", "2"}})
            .find("lora.target_parameters is not modelled") != std::string::npos);
  const std::string fp32 = kBase.substr(0, kBase.find("params: bf16")) + "params: fp32\n  autocast: bf16\n" +
                           kBase.substr(kBase.find("params: bf16") + 13);
  // Autocast over fp32 parameters and adapters (the *_autocast fixture); 16-bit parameters
  // or adapters under autocast stay refused.
  CHECK(load_error(fp32, {{"lora.target_parameters", "down_proj"}}).empty());
  CHECK(load_error(fp32, {{"lora.target_parameters", "down_proj"}, {"lora.adapter_dtype", "bf16"}})
            .find("precision.autocast: lora.target_parameters under autocast is modelled with fp32") !=
        std::string::npos);
  CHECK(load_error(kBase, {{"lora.target_parameters", "down_proj"}, {"precision.autocast", "bf16"}})
            .find("precision.autocast: lora.target_parameters under autocast is modelled with fp32") !=
        std::string::npos);
  // Megatron's MoE (its own experts, not PEFT's ParamWrapper).
  std::ifstream in(MEMSIM_SOURCE_DIR + "/scenarios/mixtral-8x7b-megatron-moe-ep8.yaml");
  const std::string megatron((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE_FALSE(megatron.empty());
  CHECK(load_error(megatron, {{"lora.rank", "4"}, {"lora.target_parameters", "down_proj"}})
            .find("lora.target_parameters: PEFT's target_parameters is modelled on transformers' MoE rows") !=
        std::string::npos);
  // lora.targets alone still needs a module the model has; with target_parameters it is optional.
  CHECK(load_error(kBase, {}).find("lora.targets: required") != std::string::npos);
}

TEST_CASE("lora.target_parameters end to end: memsim run on Qwen3-30B-A3B", "[moe-lora]") {
  // The preset (48 MoE layers, 128 experts, F 768, D 2048) with attention adapters and both
  // expert weights, r 16: trainable = 48 x (q 98,304 + k 40,960 + v 40,960 + o 98,304) +
  // 48 x 16 x 128 x ((2048 + 1536) + (768 + 2048)).
  memsim_test::TempDir dir("memsim_moe_lora");
  const auto path = dir.write("q.yaml",
                              "model:\n  preset: qwen3-30b-a3b\n  attention: flash\n"
                              "  moe: {experts_implementation: eager}\nbatch:\n  micro_batch: 1\n"
                              "  seq_len: 1024\nprecision:\n  params: bf16\nlora:\n  rank: 16\n  alpha: 32\n"
                              "  targets: [q_proj, k_proj, v_proj, o_proj]\n"
                              "  target_parameters: [mlp.experts.gate_up_proj, mlp.experts.down_proj]\n"
                              "device:\n  preset: h200\n");
  const auto out = memsim_test::run_shell(memsim_test::memsim_command() + "run '" + path.string() + "' --json - 2>&1");
  INFO(out.out);
  REQUIRE((out.status == 0 || out.status == 3));
  const nlohmann::json j = nlohmann::json::parse(out.out.substr(out.out.find('{')));
  CHECK(j["model"]["trainable_parameter_count"].get<int64_t>() ==
        int64_t{48} * (98304 + 40960 + 40960 + 98304) + int64_t{48} * 16 * 128 * ((2048 + 1536) + (768 + 2048)));
}

TEST_CASE("lora.target_parameters: plan searches cannot add unmodelled checkpointing to it", "[moe-lora]") {
  // memsim compare rebuilds the checkpoint section without the reader: the step refuses it
  // by the key (sim/step/schedule.cpp), as the reader does for checkpoint.policy.
  memsim_test::TempDir dir("memsim_moe_lora_compare");
  const auto path = dir.write("m.yaml", kBase + "  target_parameters: [gate_up_proj, down_proj]\n");
  const auto none = memsim_test::run_shell(memsim_test::memsim_command() + "compare '" + path.string() +
                                           "' --policies none 2>&1");
  CHECK(none.status == 0);
  // full (in the script's default mode: torch 2.1+'s early stop) is modelled; selective is
  // not checked at all.
  const auto full = memsim_test::run_shell(memsim_test::memsim_command() + "compare '" + path.string() +
                                           "' --policies none,full 2>&1");
  INFO(full.out);
  CHECK(full.status == 0);
  for (const char* policies : {"none,selective", "none,modules"}) {
    const auto other = memsim_test::run_shell(memsim_test::memsim_command() + "compare '" + path.string() +
                                              "' --policies " + policies + " 2>&1");
    INFO(other.out);
    CHECK(other.status == 1);
    CHECK(other.out.find("lora.target_parameters: PEFT's target_parameters with activation checkpointing") !=
          std::string::npos);
  }
}

TEST_CASE("trainable_parameter_count on MoE models equals the adapters the program builds", "[moe-lora]") {
  // The reported count (sim/analysis/parameter_count.h) against the gradients of the measured
  // step (fp32 adapters: 4 bytes each). Until 2026-11-28 the count gave every layer a dense
  // MLP of model.d_ff for gate/up/down_proj; a MoE layer has none (only a shared expert).
  const std::string base = kBase.substr(0, kBase.find("d_ff: 128")) + "d_ff: 256" +
                           kBase.substr(kBase.find("d_ff: 128") + 9);
  const std::vector<std::vector<std::pair<std::string, std::string>>> cases = {
      {{"lora.targets", "q_proj,gate_proj,down_proj"}, {"model.moe.first_dense_layers", "1"}},
      {{"lora.targets", "gate_proj,up_proj,down_proj"}, {"model.moe.shared_experts", "2"}},
      {{"lora.targets", "q_proj,up_proj"}, {"model.moe.shared_experts", "1"},
       {"lora.target_parameters", "down_proj"}},
      {{"lora.target_parameters", "gate_up_proj,down_proj"}, {"model.moe.first_dense_layers", "1"}},
  };
  for (const auto& sets : cases) {
    INFO(sets.front().second);
    const Scenario s = load_scenario_text(base, "moe.yaml", sets);
    const Program p = build_program(s);
    const uint64_t grads = measured_sum(p, [](const MemoryEvent& e) { return e.kind == TensorKind::gradient; });
    CHECK(grads > 0);
    CHECK(static_cast<uint64_t>(trainable_parameter_count(s)) * 4 == grads);
  }
}

TEST_CASE("lora.target_parameters with checkpointing end to end: memsim run, full and custom [mlp]", "[moe-lora]") {
  // The CLI path of the fixtures' *_ckpt_* rows (checked byte-exact above): both policies
  // run from a scenario file with early_stop false set explicitly.
  memsim_test::TempDir dir("memsim_moe_lora_ckpt");
  // Also reentrant, torch >= 2.1's default early stop, and autocast over fp32 parameters.
  const std::string fp32 = kBase.substr(0, kBase.find("params: bf16")) + "params: fp32\n  autocast: bf16\n" +
                           kBase.substr(kBase.find("params: bf16") + 13);
  const std::vector<std::pair<std::string, std::string>> runs = {
      {kBase, "  policy: full\n  early_stop: false\n"},
      {kBase, "  policy: custom\n  custom: [mlp]\n  early_stop: false\n"},
      {kBase, "  policy: full\n  reentrant: true\n"},
      {kBase, "  policy: custom\n  custom: [mlp]\n"},
      {fp32, "  policy: full\n"},
  };
  for (const auto& [base, ck] : runs) {
    const auto path = dir.write("c.yaml", base + "  target_parameters: [gate_up_proj, down_proj]\ncheckpoint:\n" + ck);
    const auto out = memsim_test::run_shell(memsim_test::memsim_command() + "run '" + path.string() + "' --json - 2>&1");
    INFO(out.out);
    REQUIRE(out.status == 0);
    const nlohmann::json j = nlohmann::json::parse(out.out.substr(out.out.find('{')));
    CHECK(j["model"]["trainable_parameter_count"].get<int64_t>() == 2 * (4 * 4 * 160 + 4 * 4 * 112));
  }
}

TEST_CASE("lora.target_parameters with early stop: the re-run ends at the last save, the wrappers unwind",
          "[moe-lora]") {
  // torch >= 2.1's non-reentrant default (checkpoint.early_stop true; torch/utils/checkpoint.py
  // at pytorch 0008d771: _recomputation_hook.pack_hook raises _StopRecomputationError once the
  // last saved tensor is recomputed, unpack_hook catches it). torch 1.13 has no early stop, so
  // this checks the structure against the run-to-the-end program that the *_ckpt_* fixtures
  // pin down byte for byte (docs/moe.md): the forward is the same; the re-run still makes
  // both deltas and both merged weights (the wrappers are entered before the experts' loop);
  // what disappears is what the region computes after its last save (index_add_'s source of
  // the last hit expert): in a whole-layer region the layer's residual add, one (T, D) tensor
  // per layer, and nothing in the MLP half's region; and while the exception unwinds, the
  // wrappers' exits (cached() drops the merged weights, the generators' deltas die) free
  // everything the saves did not take before backward allocates again.
  constexpr uint64_t L = 2, E = 4, D = 64, F = 48, T = 64;
  const std::string fp32 = kBase.substr(0, kBase.find("params: bf16")) + "params: fp32\n" +
                           kBase.substr(kBase.find("params: bf16") + 13);
  const auto delta_sized = [&](uint64_t b) { return b == E * 2 * F * D * 4 || b == E * D * F * 4; };
  struct Backward {
    std::vector<std::pair<std::string, uint64_t>> allocs;  // (op, bytes), in order
    uint64_t deltas = 0, merged = 0, peak = 0, forward_end = 0, selects = 0;
  };
  auto backward_of = [&](const Program& p) {
    Backward b;
    const memsim_test::Walk w = memsim_test::walk(p);
    b.peak = w.step_peak;
    b.forward_end = w.forward_end_total;
    std::vector<uint8_t> live_delta(p.tensors.size(), 0);
    uint64_t live_deltas = 0;
    bool measuring = false;
    for (const MemoryEvent& e : p.events) {
      if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") measuring = true;
      if (!measuring || e.phase != Phase::backward) continue;
      if (e.type == EventType::free && live_delta[e.tensor]) {
        live_delta[e.tensor] = 0;
        --live_deltas;
      }
      if (e.type != EventType::alloc) continue;
      const std::string op = p.str(e.op);
      b.allocs.push_back({op, e.bytes});
      if (op == "bmm" && delta_sized(e.bytes)) ++b.deltas;   // the re-run's einsum
      if (op == "add" && delta_sized(e.bytes)) ++b.merged;   // registration check + merged W
      if (op == "mul" && delta_sized(e.bytes)) {             // the re-run's `* scaling` delta
        live_delta[e.tensor] = 1;
        ++live_deltas;
      }
      // Backward's own work on the experts: no re-run delta is alive any more.
      if (op == "SelectBackward0") {
        CHECK(live_deltas == 0);
        ++b.selects;
      }
    }
    return b;
  };
  for (const char* ck : {"  policy: full\n", "  policy: custom\n  custom: [mlp]\n"}) {
    INFO(ck);
    const std::string y = fp32 + "  target_parameters: [gate_up_proj, down_proj]\ncheckpoint:\n" + ck;
    const Backward stop = backward_of(build_program(load_scenario_text(y + "  early_stop: true\n", "m.yaml")));
    const Backward run = backward_of(build_program(load_scenario_text(y + "  early_stop: false\n", "m.yaml")));
    // The default (no early_stop key) is torch >= 2.1's: the early stop.
    const Backward dflt = backward_of(build_program(load_scenario_text(y, "m.yaml")));
    CHECK(dflt.allocs == stop.allocs);
    CHECK(stop.forward_end == run.forward_end);
    CHECK(stop.selects == L * E * 2);  // every expert hit (balanced), both weights
    CHECK(run.selects == stop.selects);
    CHECK(stop.deltas == L * 2);
    CHECK(run.deltas == L * 2);
    CHECK(stop.merged == L * 2 * 2);
    CHECK(run.merged == L * 2 * 2);
    // run = stop + what comes after the last save (as multisets).
    auto sorted = [](std::vector<std::pair<std::string, uint64_t>> v) {
      std::sort(v.begin(), v.end());
      return v;
    };
    const auto a = sorted(run.allocs), b = sorted(stop.allocs);
    std::vector<std::pair<std::string, uint64_t>> only_run, only_stop;
    std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(only_run));
    std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(only_stop));
    CHECK(only_stop.empty());
    const bool whole_layer = std::string(ck).find("full") != std::string::npos;
    const std::vector<std::pair<std::string, uint64_t>> residual_adds(L, {"add", T * D * 4});
    CHECK(only_run == (whole_layer ? residual_adds : std::vector<std::pair<std::string, uint64_t>>{}));
    CHECK(stop.peak <= run.peak);
  }
}

TEST_CASE("lora.target_parameters under grouped_mm and batched_mm: where the merged weights live (by hand)",
          "[moe-lora]") {
  // transformers' grouped_mm_experts_forward passes `self.gate_up_proj` / `self.down_proj`
  // (under PEFT's ParamWrappers: the parametrization's cached W + delta) to
  // _grouped_linear -> torch._grouped_mm(input, weight.transpose(-2, -1), offs), whose node
  // saves mat2 when its input requires grad (derivatives.yaml: grad_self needs mat2). Without
  // attention adapters layer 0's hidden states need no grad, so its gate_up merged weight is
  // not saved and dies at the wrappers' exit, while its down_proj input (act * up, through
  // gate_up's adapter) needs grad: forward-end merged weights are layer 0's down and layer
  // 1's both, 3 of 4 (as in the eager loop, whose F.linear saves the select view).
  // batched_mm gathers merged[expert_ids] (IndexBackward0 saves only the indices): the bmm's
  // keep the gathered copies and no merged weight survives the wrappers' exit.
  constexpr uint64_t L = 2, E = 4, D = 64, F = 48, T = 64, K = 2;
  const uint64_t gu = E * 2 * F * D * 2, dn = E * D * F * 2;  // bf16 merged weights
  auto run = [&](const char* impl) {
    const Scenario s = load_scenario_text(kBase + "  target_parameters: [gate_up_proj, down_proj]\n"
                                          "optimizer:\n  type: sgd\n",
                                          "moe.yaml", {{"model.moe.experts_implementation", impl}});
    return build_program(s);
  };
  struct Count {
    int merged_alive = 0;     // whole-size `add` outputs alive when backward begins
    int grad_w = 0;           // GroupedMmBackward0's whole-size grads of the merged weights
    int index_zeros = 0;      // IndexBackward0's whole-size zeros
    uint64_t gathered = 0;    // forward `index` outputs of the gathered weight copies
  };
  auto count = [&](const Program& p) {
    Count c;
    std::vector<uint8_t> merged(p.tensors.size(), 0);
    bool measuring = false, backward = false;
    for (const MemoryEvent& e : p.events) {
      if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") measuring = true;
      if (!measuring) continue;
      const bool whole = e.bytes == gu || e.bytes == dn;
      if (e.type == EventType::alloc && e.phase == Phase::backward && !backward) {
        backward = true;
        for (uint8_t m : merged) c.merged_alive += m;
      }
      if (e.type == EventType::alloc && e.phase == Phase::forward && p.str(e.op) == "add" && whole)
        merged[e.tensor] = 1;
      if (e.type == EventType::free) merged[e.tensor] = 0;
      if (e.type == EventType::alloc && e.phase == Phase::backward && whole) {
        c.grad_w += p.str(e.op) == "GroupedMmBackward0";
        c.index_zeros += p.str(e.op) == "IndexBackward0";
      }
      if (e.type == EventType::alloc && e.phase == Phase::forward && p.str(e.op) == "index" &&
          (e.bytes == T * K * 2 * F * D * 2 || e.bytes == T * K * D * F * 2))
        c.gathered += e.bytes;
    }
    return c;
  };
  const Count g = count(run("grouped_mm")), b = count(run("batched_mm")), eager = count(run("eager"));
  CHECK(g.merged_alive == 3);
  CHECK(eager.merged_alive == 3);
  CHECK(b.merged_alive == 0);
  // grouped_mm's backward: one grad_mat2 per layer and target (in mat2's layout: the merged
  // weight's grad after TransposeBackward0, no copy), no zeros + index_put_.
  CHECK(g.grad_w == static_cast<int>(L * 2));
  CHECK(g.index_zeros == 0);
  CHECK(g.gathered == 0);
  // batched_mm's: each layer's two IndexBackward0 zeros of the merged weights; forward, the
  // per-sample copies (S = T*K samples) of both targets, per layer.
  CHECK(b.index_zeros == static_cast<int>(L * 2));
  CHECK(b.grad_w == 0);
  CHECK(b.gathered == L * (T * K * 2 * F * D * 2 + T * K * D * F * 2));
}
