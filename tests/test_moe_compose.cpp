// Mixture-of-experts composing with the rest (issue #15 item 5; docs/moe.md "Composing"):
//  - LoRA (PEFT target_modules on attention, dense MLPs and the shared expert; frozen router
//    and 3-D experts) and bf16 autocast over fp32 weights (HF Trainer's default), against
//    real PyTorch: tests/data/torch_cpu_moe_compose/*.json, training steps of the MoE
//    stand-ins measured on CPU with torch 1.13 (tools/fixtures/gen_moe_compose_fixtures.py),
//    compared as tests/test_moe.cpp compares the plain MoE fixtures;
//  - checkpoint policies, DDP, FSDP, FSDP2, memsim compare / optimize / sweep on a MoE
//    scenario, each checked on a number;
//  - what stays refused, by key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_support.h"
#include "decoder_arch_test_support.h"
#include "json_test_support.h"
#include "moe_fixture_test_support.h"
#include "scenario_error_test_support.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "torch_fixture_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kComposeDir = MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_moe_compose";

// The fixture's run with its MoE block, LoRA adapters and autocast region.
Scenario scenario_for(const nlohmann::json& c) {
  std::string y = memsim_test::fixture_shape_yaml(c);
  const std::string dtype = c.value("dtype", std::string("fp32"));
  if (c.value("autocast", std::string("none")) == "bf16") y += "  autocast: bf16\n";
  if (c.contains("lora")) {
    const nlohmann::json& l = c["lora"];
    y += "lora:\n  rank: " + std::to_string(l["rank"].get<int>()) + "\n  alpha: " +
         std::to_string(l["alpha"].get<int>()) + "\n  targets: [";
    for (size_t i = 0; i < l["targets"].size(); ++i)
      y += (i ? ", " : "") + l["targets"][i].get<std::string>();
    y += "]\n";
    // gen.run casts the whole model, adapters included, to bf16 after get_peft_model.
    if (dtype == "bf16") y += "  adapter_dtype: bf16\n";
  }
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  Scenario s = load_scenario_text(y, "moe-compose-fixture.yaml");
  s.model.arch = memsim_test::arch_for(c);
  memsim_test::apply_moe_fixture_spec(c["moe"], s.model.arch.moe);
  return s;
}

uint64_t peak_of(const Scenario& s) {
  const Program p = build_program(s);
  SimulatedDevice device(s.device.capacity, s.device.cuda_context);
  const Timeline t = execute(p, s.allocator, device, ExecuteOptions{});
  return analyze(p, t).peak_allocated;
}

std::string load_error(const std::string& yaml, const std::vector<std::pair<std::string, std::string>>& sets) {
  return memsim_test::scenario_error(yaml, "moe.yaml", sets);
}

// A small Qwen3-MoE-like run (hf-llama with an MoE block, transformers 5.x layout).
const std::string kBase =
    "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 128\n"
    "  vocab: 256\n  context_length: 64\n  attention: eager\n"
    "  moe: {experts_implementation: eager, experts: 4, top_k: 2, expert_d_ff: 64}\n"
    "batch:\n  micro_batch: 2\n  seq_len: 32\nprecision:\n  params: bf16\ndevice:\n  capacity: 80GiB\n";

}  // namespace

TEST_CASE("MoE with LoRA and autocast matches real PyTorch training steps (CPU fixtures)", "[moe-compose]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kComposeDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 17);
  memsim_test::print_fixture_table_header();
  for (const auto& path : files) {
    const nlohmann::json fx = memsim_test::load_json(path);
    INFO(fx["name"].get<std::string>());
    const Scenario scenario = scenario_for(fx["config"]);
    const Program program = build_program(scenario);
    memsim_test::compare_with_fixture(fx, scenario, program);
    // Every layer's forward, the MoE loop and its autocast copies included.
    memsim_test::check_forward_allocs_by_layer(fx, program);
  }
}

namespace {

using memsim_test::measured_sum;

// kBase's shapes: T tokens, D, E experts, K, F, the attention widths.
constexpr uint64_t kT = 2 * 32, kD = 64, kE = 4, kK = 2, kF = 64, kKv = 32, kV = 256, kL = 2;
// One MoE layer's parameters (elements): q, k, v, o, two norms, the router, the 3-D experts.
constexpr uint64_t kLayerNumel = kD * kD + 2 * kKv * kD + kD * kD + 2 * kD + kE * kD + kE * 2 * kF * kD + kE * kD * kF;
constexpr uint64_t kRootNumel = kV * kD + kD + kV * kD;  // embed, final norm, untied lm_head

}  // namespace

TEST_CASE("MoE under LoRA: adapters only on nn.Linear modules, no expert grads or state", "[moe-compose]") {
  const std::string lora = "lora:\n  rank: 8\n  alpha: 16\n  targets: [q_proj, k_proj, v_proj, o_proj]\n";
  const Scenario s = load_scenario_text(kBase + lora, "moe.yaml");
  const Program p = build_program(s);
  // The adapters (fp32: lora.adapter_dtype's default): A (r x in) and B (out x r) on q, k, v, o.
  const uint64_t r = 8;
  const uint64_t adapter_numel = kL * (r * kD + kD * r + 2 * (r * kD + kKv * r) + r * kD + kD * r);
  // Gradients are the adapters' alone (AccumulateGrad's .grad, fp32): the router and the
  // routed experts are frozen, so no SelectBackward0 zeros of the 3-D weights either.
  CHECK(measured_sum(p, [](const MemoryEvent& e) { return e.kind == TensorKind::gradient; }) == adapter_numel * 4);
  uint64_t selects = 0;
  measured_sum(p, [&](const MemoryEvent& e) { return e.phase == Phase::backward && p.str(e.op) == "SelectBackward0"; },
               &selects);
  CHECK(selects == 0);
  // AdamW's state: two fp32 tensors per adapter, nothing for the 3-D experts.
  const memsim_test::Walk w = memsim_test::walk(p);
  CHECK(w.forward_end_by_kind.at(TensorKind::optimizer_state) == 2 * adapter_numel * 4);
  // The MoE block still saves its activations (the input requires grad through the adapters):
  // each expert that got tokens keeps its gathered (n, D) bf16 input for the gate_up matmul.
  uint64_t gathers = 0;
  measured_sum(p, [&](const MemoryEvent& e) {
    return e.phase == Phase::forward && p.str(e.op) == "index" && e.bytes == kT * kK / kE * kD * 2;
  }, &gathers);
  CHECK(gathers == kL * kE);
  // Qwen2-MoE style: gate/up/down_proj reach the shared expert (3 adapters per MoE layer).
  const std::string shared = kBase.substr(0, kBase.find("expert_d_ff: 64}")) +
                             "expert_d_ff: 64, shared_experts: 2}" +
                             kBase.substr(kBase.find("expert_d_ff: 64}") + 16);
  const Scenario sh = load_scenario_text(shared + "lora:\n  rank: 4\n  targets: [gate_proj, up_proj, down_proj]\n", "moe.yaml");
  const Program ps = build_program(sh);
  const uint64_t S = 2 * kF;  // shared_experts x expert_d_ff
  const uint64_t shared_numel = kL * 4 * (kD + S + kD + S + S + kD);  // A r x in + B out x r, three modules
  CHECK(measured_sum(ps, [](const MemoryEvent& e) { return e.kind == TensorKind::gradient; }) == shared_numel * 4);
}

TEST_CASE("MoE under autocast: each hit expert casts its weight slices, not cached", "[moe-compose]") {
  // expert_d_ff 48: the (2F, D) bf16 slice copy (12 KiB) has a size no other forward cast has.
  std::string base = kBase.substr(0, kBase.find("params: bf16")) + "params: fp32\n  autocast: bf16\n" +
                     kBase.substr(kBase.find("params: bf16") + 13);
  base.replace(base.find("expert_d_ff: 64"), 15, "expert_d_ff: 48");
  constexpr uint64_t kF48 = 48;
  auto casts = [](const Scenario& s) {
    const Program p = build_program(s);
    uint64_t n = 0;
    // gate_up_proj[e].to(bf16): a (2F, D) bf16 copy per expert with tokens, in every layer.
    measured_sum(p, [&](const MemoryEvent& e) {
      return e.phase == Phase::forward && p.str(e.op) == "_to_copy" && e.bytes == 2 * kF48 * kD * 2;
    }, &n);
    return n;
  };
  const Scenario balanced = load_scenario_text(base, "moe.yaml");
  CHECK(casts(balanced) == kL * kE);  // every expert gets tokens
  CHECK(casts(load_scenario_text(base, "moe.yaml", {{"model.moe.routing", "worst-case"}})) == kL * kK);
  // Saved until backward: autocast keeps more than the bf16-parameter run, whose saves hold
  // views of the parameters; the step runs end to end.
  CHECK(peak_of(balanced) > 0);
}

TEST_CASE("MoE under autocast: batched_mm casts every gathered weight copy, grouped_mm stays fp32",
          "[moe-compose]") {
  // docs/moe.md "batched_mm and grouped_mm under autocast" (the batched_mm rules are also
  // checked against the CPU fixtures autocast_*_batched_mm_*). S = T * K samples.
  // expert_d_ff 48: sizes no other op of the step shares.
  std::string base = kBase.substr(0, kBase.find("params: bf16")) + "params: fp32\n  autocast: bf16\n" +
                     kBase.substr(kBase.find("params: bf16") + 13);
  base.replace(base.find("expert_d_ff: 64"), 15, "expert_d_ff: 48");
  constexpr uint64_t kS = kT * kK, kF = 48;
  auto count = [](const Program& p, const char* op, uint64_t bytes) {
    uint64_t n = 0;
    measured_sum(p, [&](const MemoryEvent& e) {
      return e.phase == Phase::forward && p.str(e.op) == op && e.bytes == bytes;
    }, &n);
    return n;
  };
  const Program batched = build_program(
      load_scenario_text(base, "moe.yaml", {{"model.moe.experts_implementation", "batched_mm"}}));
  // Per layer: the fp32 gathers of the two 3-D weights, each one's own bf16 copy (a gather
  // is no leaf: never cached), the fp32 repeated states' bf16 copy; bf16 bmm outputs; the
  // fp32 sum (CUDA's fp32_set_opt_dtype) and no `.to(hidden_states.dtype)` copy after it.
  CHECK(count(batched, "index", kS * 2 * kF * kD * 4) == kL);
  CHECK(count(batched, "index", kS * kD * kF * 4) == kL);
  CHECK(count(batched, "_to_copy", kS * 2 * kF * kD * 2) == kL);
  CHECK(count(batched, "_to_copy", kS * kD * kF * 2) == kL);
  CHECK(count(batched, "bmm", kS * 2 * kF * 2) == kL);
  // (S, D) bf16 is also the attention scores' size here: counted beside the eager experts'.
  const Program eager = build_program(load_scenario_text(base, "moe.yaml"));
  CHECK(count(batched, "_to_copy", kS * kD * 2) == count(eager, "_to_copy", kS * kD * 2) + kL);
  CHECK(count(batched, "bmm", kS * kD * 2) == count(eager, "bmm", kS * kD * 2) + kL);
  CHECK(count(batched, "sum.dim_IntList", kT * kD * 4) == kL);
  const Program grouped = build_program(
      load_scenario_text(base, "moe.yaml", {{"model.moe.experts_implementation", "grouped_mm"}}));
  // _grouped_mm is on no autocast list and gets input.to(weight.dtype): fp32 in, fp32 out,
  // no cast of the 3-D weights (no (E, 2F, D) or (E, D, F) bf16 copy anywhere).
  CHECK(count(grouped, "_grouped_mm", kS * 2 * kF * 4) == kL);
  CHECK(count(grouped, "_grouped_mm", kS * kD * 4) == kL);
  CHECK(count(grouped, "_grouped_mm", kS * 2 * kF * 2) == 0);
  CHECK(count(grouped, "_to_copy", kE * 2 * kF * kD * 2) == 0);
  CHECK(count(grouped, "_to_copy", kE * kD * kF * 2) == 0);
  CHECK(peak_of(load_scenario_text(base, "moe.yaml", {{"model.moe.experts_implementation", "grouped_mm"}})) > 0);
}

TEST_CASE("MoE composes with checkpointing: the routed block is re-run with its counts", "[moe-compose]") {
  // Forward FLOPs of one MoE block: the router and, for the T*K routed slots, the gate_up
  // and down matmuls (the counts split them, their sum is T*K whatever the routing).
  const double block = 2.0 * kT * kD * kE + 2.0 * (kT * kK) * kD * 2 * kF + 2.0 * (kT * kK) * kF * kD;
  for (const char* routing : {"balanced", "worst-case"}) {
    INFO(routing);
    const Scenario s = load_scenario_text(kBase, "moe.yaml",
                                          {{"checkpoint.policy", "custom"}, {"checkpoint.custom", "[mlp]"},
                                           {"model.moe.routing", routing}});
    const Program p = build_program(s);
    // Recompute (warm-up and measured step): every layer's MoE block once more.
    CHECK(p.flops.recompute == Approx(2.0 * kL * block).epsilon(1e-12));
    // The re-run makes the one_hot expert mask (T, K, E) int64 again in backward.
    uint64_t masks = 0;
    measured_sum(p, [&](const MemoryEvent& e) { return p.str(e.op) == "one_hot" && e.bytes == kT * kK * kE * 8; },
                 &masks);
    CHECK(masks == 2 * kL);
  }
  const Scenario full = load_scenario_text(kBase, "moe.yaml", {{"checkpoint.policy", "full"}});
  const memsim_test::Walk w = memsim_test::walk(build_program(full));
  // full: every layer keeps only its input, (T, D) bf16, at the end of the forward (filed under
  // the layer that made it: the embedding for layer 0, layer 0 for layer 1).
  CHECK(w.forward_end_activations_by_layer.at(0) == kT * kD * 2);
  CHECK(w.forward_end_activations_by_layer.count(1) == 0);
}

TEST_CASE("MoE composes with DDP, FSDP and FSDP2: the experts are bucketed and sharded", "[moe-compose]") {
  // DDP: the reducer's buckets hold every parameter's grad (the 3-D experts and the router too).
  {
    const Scenario s = load_scenario_text(kBase, "moe.yaml", {{"parallel.data", "2"}});
    const Program p = build_program(s);
    // Rebuilt each step in gradient-ready order (sim/parallel/data_parallel.h): the measured
    // step's buckets hold the grads of all 156,480 parameters, bf16.
    CHECK(measured_sum(p, [&](const MemoryEvent& e) {
            return p.tensors[e.tensor].name != 0 && p.str(p.tensors[e.tensor].name) == "ddp.reducer.bucket";
          }) == (kRootNumel + kL * kLayerNumel) * 2);
    CHECK(kRootNumel + kL * kLayerNumel == 156480);
  }
  // FSDP (one unit per layer): AdamW's state lives on each unit's flat shard, padded to a
  // multiple of the world size: the layer's experts are in its flat parameter.
  {
    const Scenario s = load_scenario_text(kBase, "moe.yaml", {{"parallel.data", "8"}, {"parallel.sharding", "fsdp"}});
    const memsim_test::Walk w = memsim_test::walk(build_program(s));
    const uint64_t shards = (kRootNumel + 7) / 8 + kL * ((kLayerNumel + 7) / 8);
    CHECK(w.forward_end_by_kind.at(TensorKind::optimizer_state) == 2 * shards * 2);
  }
  // FSDP2: every parameter is chunked on dim 0; the 3-D experts by whole experts, so with 4
  // experts over 8 ranks rank 0 holds one expert of each (chunk 0 is the largest).
  {
    const Scenario s = load_scenario_text(kBase, "moe.yaml", {{"parallel.data", "8"}, {"parallel.sharding", "fsdp2"}});
    const memsim_test::Walk w = memsim_test::walk(build_program(s));
    auto chunk = [](uint64_t rows, uint64_t cols) { return (rows + 7) / 8 * cols; };
    const uint64_t layer = chunk(kD, 1) + chunk(kD, kD) + 2 * chunk(kKv, kD) + chunk(kD, kD) + chunk(kD, 1) +
                           chunk(kE, kD) + chunk(kE, 2 * kF * kD) + chunk(kE, kD * kF);
    const uint64_t shards = chunk(kV, kD) + kL * layer + chunk(kD, 1) + chunk(kV, kD);
    CHECK(w.forward_end_by_kind.at(TensorKind::optimizer_state) == 2 * shards * 2);
  }
}

TEST_CASE("MoE in memsim compare, optimize and sweep", "[moe-compose][cli]") {
  memsim_test::TempDir dir("memsim_moe_compose");
  const auto path = dir.write("moe.yaml", kBase);
  const std::string file = "'" + path.string() + "'";
  // compare: the custom:mlp row re-runs exactly the MoE blocks.
  {
    const auto out = memsim_test::run_shell(memsim_test::memsim_command() + "compare " + file +
                                            " --policies none,custom:mlp --json - 2>/dev/null");
    REQUIRE(out.status == 0);
    const nlohmann::json j = nlohmann::json::parse(out.out);
    const nlohmann::json& rows = j["policies"];
    REQUIRE(rows.size() == 2);
    const double block = 2.0 * kT * kD * kE + 6.0 * (kT * kK) * kD * kF;
    CHECK(rows[1]["flops"]["recompute"].get<double>() == Approx(2.0 * kL * block).epsilon(1e-12));
    // none's row is `memsim run`'s number.
    const Scenario s = load_scenario(path.string());
    CHECK(rows[0]["peak_allocated_bytes"].get<uint64_t>() == peak_of(s));
  }
  // sweep over the routing assumption: each point is its own run.
  {
    const auto out = memsim_test::run_shell(memsim_test::memsim_command() + "sweep " + file +
                                            " --vary model.moe.routing=balanced,worst-case --json - 2>/dev/null");
    REQUIRE(out.status == 0);
    const nlohmann::json j = nlohmann::json::parse(out.out);
    const nlohmann::json& points = j["points"];
    REQUIRE(points.size() == 2);
    CHECK(points[1]["peak_allocated_bytes"].get<uint64_t>() ==
          peak_of(load_scenario(path.string(), {{"model.moe.routing", "worst-case"}})));
  }
  // sweep --max: the largest micro-batch that fits a small device; memsim run agrees (exit 0
  // there, 3 = out of memory one micro-batch more).
  {
    const std::string device = " --set device.capacity=256MiB --set device.cuda_context=0";
    const auto out = memsim_test::run_shell(memsim_test::memsim_command() + "sweep " + file + device +
                                            " --max batch.micro_batch --json - 2>/dev/null");
    REQUIRE(out.status == 0);
    const nlohmann::json j = nlohmann::json::parse(out.out);
    REQUIRE(j["points"].size() == 1);
    const nlohmann::json& best = j["points"][0];
    INFO(best.dump());
    const int64_t mb = best["largest_fit"].get<int64_t>();
    REQUIRE(mb > 1);
    CHECK(best["first_failure"].get<int64_t>() == mb + 1);
    auto run_status = [&](int64_t b) {
      return memsim_test::run_shell(memsim_test::memsim_command() + "run " + file + device +
                                    " --set batch.micro_batch=" + std::to_string(b) + " >/dev/null 2>&1")
          .status;
    };
    CHECK(run_status(mb) == 0);
    CHECK(run_status(mb + 1) == 3);
  }
  // optimize: under a budget between the full and none policies' reserved peaks (24 and 26
  // MiB at micro-batch 8) a plan recomputes a little; memsim run with that plan gives its peak.
  {
    const auto out = memsim_test::run_shell(memsim_test::memsim_command() + "optimize " + file +
                                            " --set batch.micro_batch=8 --budget 25MiB --json - 2>/dev/null");
    INFO(out.out.substr(0, 600));
    REQUIRE(out.status == 0);
    const nlohmann::json j = nlohmann::json::parse(out.out);
    CHECK(j["found"].get<bool>());
    const uint64_t reserved = j["peak_reserved_bytes"];
    CHECK(reserved <= 25ull << 20);
    CHECK(j["recompute_share"].get<double>() > 0.0);
    CHECK(j["recompute_share"].get<double>() < 0.2);
    const nlohmann::json& ck = j["plan"]["checkpoint"];
    std::string items;
    for (const auto& it : ck["custom"]) items += (items.empty() ? "" : ",") + it.get<std::string>();
    const Scenario planned = load_scenario(path.string(), {{"batch.micro_batch", "8"},
                                                           {"checkpoint.policy", ck["policy"].get<std::string>()},
                                                           {"checkpoint.custom", "[" + items + "]"}});
    const Program p = build_program(planned);
    SimulatedDevice device(planned.device.capacity, planned.device.cuda_context);
    const Timeline t = execute(p, planned.allocator, device, ExecuteOptions{});
    CHECK(analyze(p, t).peak_reserved == reserved);
  }
}

TEST_CASE("MoE composition: what stays refused names its key", "[moe-compose]") {
  const std::string fp32_autocast = kBase.substr(0, kBase.find("params: bf16")) + "params: fp32\n  autocast: bf16\n" +
                                    kBase.substr(kBase.find("params: bf16") + 13);
  // batched_mm / grouped_mm under autocast: modelled since 2026-11-28 (docs/moe.md).
  CHECK(load_error(fp32_autocast, {{"model.moe.experts_implementation", "grouped_mm"}}).empty());
  CHECK(load_error(fp32_autocast, {{"model.moe.experts_implementation", "batched_mm"}}).empty());
  CHECK(load_error(fp32_autocast, {{"model.moe.output_router_logits", "true"}}).empty());  // modelled (fixtures)
  CHECK(load_error(fp32_autocast, {}).empty());
  CHECK(load_error(kBase, {{"lora.rank", "8"}, {"lora.targets", "gate_proj,down_proj"}})
            .find("lora.targets: no module of this mixture-of-experts model matches") != std::string::npos);
  // QLoRA is modelled (tests/test_moe_qlora.cpp): bitsandbytes quantizes the nn.Linear modules
  // only, the 3-D experts stay in precision.params.
  CHECK(load_error(kBase, {{"lora.rank", "8"}, {"lora.targets", "q_proj"}, {"lora.base_dtype", "nf4"}}).empty());
  CHECK(load_error(kBase, {{"lora.rank", "8"}, {"lora.targets", "all-linear"}, {"model.moe.shared_experts", "1"}})
            .find("lora.targets: all-linear on a model with a shared expert") != std::string::npos);
  CHECK(load_error(kBase, {{"lora.rank", "8"}, {"lora.targets", "all-linear"}}).empty());
  // LoRA on the routed experts (PEFT's target_parameters) is modelled (tests/test_moe_lora.cpp);
  // on a dense model it is refused by its key.
  CHECK(load_error(kBase, {{"lora.rank", "8"}, {"lora.targets", "q_proj"},
                           {"lora.target_parameters", "mlp.experts.gate_up_proj"}}).empty());
  const std::string dense = kBase.substr(0, kBase.find("  moe: ")) + kBase.substr(kBase.find("batch:"));
  CHECK(load_error(dense, {{"lora.rank", "8"}, {"lora.targets", "q_proj"},
                           {"lora.target_parameters", "mlp.experts.gate_up_proj"}})
            .find("lora.target_parameters: PEFT's target_parameters adapts nn.Parameters") != std::string::npos);
  // The dense rows' q/k norms (Qwen3, OLMo-2) are not checked under autocast: memsim run
  // refuses them by the knob's key (the MoE rows' are: "MoE rows under autocast" below).
  memsim_test::TempDir dir("memsim_moe_refused");
  const auto path = dir.write("qwen3-8b.yaml", "model:\n  preset: qwen3-8b\nprecision:\n  params: fp32\n  autocast: bf16\n");
  const auto out = memsim_test::run_shell(memsim_test::memsim_command() + "run '" + path.string() + "' 2>&1");
  CHECK(out.status == 1);
  CHECK(out.out.find("model.qk_norm: precision.autocast with this architecture knob") != std::string::npos);
}

TEST_CASE("MoE rows under autocast: the long fixtures' peak outside torch 1.13's out-of-place add", "[moe-compose]") {
  // At S 96 the real step peak is torch 1.13's out-of-place sum of two experts'
  // SelectBackward0 grads in layer 1 (an `add` of the whole (E, 2F, D) fp32 weight; 2.x adds
  // in place, as memsim does). The highest point of the real stream outside the layers' adds,
  // the final norm's backward (layer -1), is memsim's step peak to the byte. The fixture's
  // event list starts before the measured step, so its live bytes are known up to a constant,
  // fixed by the recorded peak.
  for (const char* name : {"autocast_qwen3_moe_l2_e4_k2_s96_v64_sgd", "autocast_olmoe_l2_e4_k2_s96_v64_sgd"}) {
    INFO(name);
    const nlohmann::json fx = memsim_test::load_json(std::string(kComposeDir) + "/" + name + ".json");
    REQUIRE(fx["peak_at"]["op"] == "add");
    int64_t live = 0, top = INT64_MIN, top_final_norm = INT64_MIN;
    for (const auto& ev : fx["events"]) {
      if (ev[1] == "mark") continue;
      live += (ev[0] == "alloc" ? 1 : -1) * ev[2].get<int64_t>();
      top = std::max(top, live);
      if (ev[3] == "backward" && ev[4] == -1) top_final_norm = std::max(top_final_norm, live);
    }
    const int64_t real_final_norm = top_final_norm - top + fx["peak_live_bytes"].get<int64_t>();
    const memsim_test::Walk w = memsim_test::walk(build_program(scenario_for(fx["config"])));
    CHECK(w.peak_phase == Phase::backward);
    CHECK(w.peak_layer == -1);
    CHECK(static_cast<int64_t>(w.step_peak) == real_final_norm);
  }
}

TEST_CASE("MoE under autocast: the load-balancing loss's allocations in order, the step peaks to the byte", "[moe-compose]") {
  // load_balancing_loss_func inside the autocast region (HF's CausalLM forward): the bf16
  // router logits get an fp32 copy and fp32 probabilities (CUDA's fp32_set_opt_dtype), the
  // topk values are fp32 and `.float()` copies nothing. The loss phase of the measured step,
  // allocation by allocation, less CUDA's two 0-d min()/max() checks before bincount that
  // the CPU build skips; the step peak to the byte.
  for (const char* name : {"autocast_qwen3_moe_l2_e4_k2_aux_adamw", "autocast_mixtral_l2_e4_k2_aux_sgd"}) {
    INFO(name);
    const nlohmann::json fx = memsim_test::load_json(std::string(kComposeDir) + "/" + name + ".json");
    std::vector<uint64_t> real, sim;
    for (const auto& ev : fx["events"])
      if (ev[0] == "alloc" && ev[3] == "loss") real.push_back(ev[2].get<uint64_t>());
    const Program p = build_program(scenario_for(fx["config"]));
    bool measuring = false;
    for (const MemoryEvent& e : p.events) {
      if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") measuring = true;
      if (measuring && e.type == EventType::alloc && e.phase == Phase::loss &&
          !(p.str(e.op) == "max" && e.bytes == 8))
        sim.push_back(e.bytes);
    }
    CHECK(sim == real);
    CHECK(memsim_test::walk(p).step_peak == fx["peak_live_bytes"].get<uint64_t>());
  }
  // The other MoE-row autocast fixtures' step peaks, to the byte (compare_with_fixture
  // allows 2%).
  for (const char* name : {"autocast_mixtral_l2_e4_k2_sgd", "autocast_qwen3_moe_l2_e4_k2_adamw",
                           "autocast_olmoe_l2_e4_k2_sgd"}) {
    INFO(name);
    const nlohmann::json fx = memsim_test::load_json(std::string(kComposeDir) + "/" + name + ".json");
    CHECK(memsim_test::walk(build_program(scenario_for(fx["config"]))).step_peak ==
          fx["peak_live_bytes"].get<uint64_t>());
  }
}

TEST_CASE("MoE rows under autocast run end to end: Mixtral, Qwen3-MoE, OLMoE", "[moe-compose]") {
  // The presets' dense parts under autocast (transformers 5.17: Llama's v5 attention for
  // Mixtral, q/k RMSNorms on the bf16 projections for Qwen3-MoE and OLMoE), checked op by op
  // by the autocast_{mixtral,qwen3_moe,olmoe}_* fixtures above; here from a preset through
  // memsim run, at two layers.
  memsim_test::TempDir dir("memsim_moe_autocast_rows");
  for (const char* preset : {"mixtral-8x7b", "qwen3-30b-a3b", "olmoe-1b-7b"}) {
    INFO(preset);
    const auto path = dir.write(std::string(preset) + ".yaml",
                                std::string("model:\n  preset: ") + preset +
                                    "\n  layers: 2\n  attention: eager\nbatch:\n  micro_batch: 1\n  seq_len: 128\n"
                                    "precision:\n  params: fp32\n  autocast: bf16\ndevice:\n  capacity: 1TiB\n");
    const auto out = memsim_test::run_shell(memsim_test::memsim_command() + "run '" + path.string() + "' 2>&1");
    CHECK(out.status == 0);
    CHECK(out.out.find("moe routing") != std::string::npos);
  }
  // OLMoE's q/k norms over the whole projections (T = 128 rows; q and k 2048 wide): each
  // layer's forward makes an fp32 copy of the bf16 q and k projections (`.to(float32)`; the
  // only 1 MiB casts of the forward: the residual stream is fp32 and needs none).
  const Scenario olmoe = load_scenario_text(
      "model:\n  preset: olmoe-1b-7b\n  layers: 2\n  attention: eager\nbatch:\n  micro_batch: 1\n  seq_len: 128\n"
      "precision:\n  params: fp32\n  autocast: bf16\ndevice:\n  capacity: 1TiB\n",
      "olmoe.yaml");
  const Program p = build_program(olmoe);
  uint64_t up = 0;
  constexpr uint64_t kRows = 128, kWidth = 2048;
  measured_sum(p, [&](const MemoryEvent& e) {
    return e.phase == Phase::forward && p.str(e.op) == "_to_copy" && e.bytes == kRows * kWidth * 4;
  }, &up);
  CHECK(up == 2 * 2);  // q and k, two layers
}
