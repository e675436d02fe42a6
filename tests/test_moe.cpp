// Mixture-of-experts layers (graph/models/decoder_moe.cpp, docs/moe.md):
//  - against real PyTorch: tests/data/torch_cpu_moe/*.json are training steps of the
//    transformers 5.17 eager / batched_mm stand-ins (tools/fixtures/moe_models.py) with a forced
//    routing, measured on CPU with torch 1.13 (tools/fixtures/gen_moe_fixtures.py); compared
//    as the dense architecture rows are, plus every layer's forward allocations in order;
//  - parameter counts from the published config.json files (tests/data/moe_configs);
//  - the routing rules (graph/models/moe_routing.h) and the keys' bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_support.h"
#include "decoder_arch_test_support.h"
#include "graph/models/moe_routing.h"
#include "json_test_support.h"
#include "moe_fixture_test_support.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/parameter_count.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "torch_fixture_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kMoeFixtureDir = MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_moe";
const std::string kConfigs = MEMSIM_SOURCE_DIR + "/tests/data/moe_configs/";

// The fixture's run (as tests/test_decoder_arch.cpp builds it) with its MoE block.
Scenario scenario_for(const nlohmann::json& c) {
  std::string y = memsim_test::fixture_shape_yaml(c);
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  Scenario s = load_scenario_text(y, "moe-fixture.yaml");
  s.model.arch = memsim_test::arch_for(c);
  memsim_test::apply_moe_fixture_spec(c["moe"], s.model.arch.moe);
  return s;
}

Scenario load(const std::string& yaml) { return load_scenario_text(yaml, "moe.yaml"); }

std::string load_error(const std::string& yaml) {
  try {
    load(yaml);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

const char* kSmall =
    "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 128\n"
    "  vocab: 256\n  context_length: 64\n";

}  // namespace

TEST_CASE("MoE blocks match real PyTorch training steps (CPU fixtures)", "[moe]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kMoeFixtureDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 5);
  memsim_test::print_fixture_table_header();
  for (const auto& path : files) {
    const nlohmann::json fx = memsim_test::load_json(path);
    INFO(fx["name"].get<std::string>());
    const Scenario scenario = scenario_for(fx["config"]);
    const Program program = build_program(scenario);
    memsim_test::compare_with_fixture(fx, scenario, program);
    memsim_test::check_forward_allocs_by_layer(fx, program);
  }
}

TEST_CASE("MoE parameter counts from config.json match the model cards", "[moe]") {
  struct Row {
    const char* file;
    int64_t count;
  };
  // Mixtral-8x7B: 46,702,792,704 (the issue's number). Qwen3-30B-A3B: the card's "30.5B in
  // total". OLMoE-1B-7B-0924: the card's "6.9B total". Per layer (Qwen3-30B-A3B): q 2048x4096,
  // k/v 2048x512, o 4096x2048, q/k norms 128 each, router 128x2048, experts 3x128x2048x768,
  // 2 norms: 623,120,640; x48 + embeddings and lm_head 151936x2048 each + the final norm.
  for (const Row& r : {Row{"mixtral-8x7b-v0.1.json", 46702792704LL}, Row{"qwen3-30b-a3b.json", 30532122624LL},
                       Row{"olmoe-1b-7b-0924.json", 6919161856LL}}) {
    INFO(r.file);
    const Scenario s = load("model:\n  hf_config: " + kConfigs + r.file + "\nbatch:\n  seq_len: 16\n");
    CHECK(parameter_count(s.model) == r.count);
  }
  // A dense first layer (model.moe.first_dense_layers) keeps the dense MLP's count.
  const Scenario s = load(std::string(kSmall) +
                          "  moe: {experts_implementation: eager, experts: 4, top_k: 2, expert_d_ff: 32, first_dense_layers: 1}\n"
                          "batch:\n  seq_len: 16\n");
  const ModelConfig& m = s.model;
  CHECK(layer_parameter_count(m, 0) == layer_parameter_count(m));
  CHECK(layer_parameter_count(m, 1) - layer_parameter_count(m, 0) == (4 * 64 + 3 * 4 * 64 * 32) - 3 * 64 * 128);
}

TEST_CASE("MoE routing assumptions give tokens per expert", "[moe]") {
  graph::MoeSpec m;
  m.experts = 4;
  m.top_k = 2;
  // balanced: T*K = 10 slots over 4 experts: floor 2, the first 10 mod 4 = 2 experts +1.
  CHECK(graph::routed_tokens(m, 5, 0) == std::vector<int64_t>{3, 3, 2, 2});
  m.routing = graph::MoeRouting::worst_case;
  CHECK(graph::routed_tokens(m, 5, 0) == std::vector<int64_t>{5, 5, 0, 0});
  m.routing = graph::MoeRouting::skew;
  m.skew_alpha = 0.0;  // no skew: balanced shares
  CHECK(graph::routed_tokens(m, 8, 0) == std::vector<int64_t>{4, 4, 4, 4});
  // shares 1, 1/2, 1/3, 1/4 of 32 slots: 15.36, 7.68, 5.12, 3.84; floors 15, 7, 5, 3 and the two
  // largest remainders (.84, .68) get the last two slots
  m.skew_alpha = 1.0;
  {
    const auto c = graph::routed_tokens(m, 16, 0);
    CHECK(c == std::vector<int64_t>{15, 8, 5, 4});
  }
  m.skew_alpha = 3.0;  // expert 0 would take more than every token: capped at T, the rest re-spread
  {
    const auto c = graph::routed_tokens(m, 16, 0);
    CHECK(c[0] == 16);
    CHECK(c[0] + c[1] + c[2] + c[3] == 32);
    CHECK(std::is_sorted(c.rbegin(), c.rend()));
    for (int64_t v : c) CHECK(v <= 16);
  }
  m.routing = graph::MoeRouting::counts;
  m.counts = {1, 2, 3, 4, 4, 3, 2, 1};  // two MoE layers
  CHECK(graph::routed_tokens(m, 5, 1) == std::vector<int64_t>{4, 3, 2, 1});
  CHECK(graph::describe_routing(m) == "counts:[1,2,3,4,4,3,2,1]");
}

TEST_CASE("MoE keys: bad input names the key", "[moe]") {
  const std::string base = std::string(kSmall);
  const std::string batch = "batch:\n  micro_batch: 1\n  seq_len: 8\n";
  CHECK(load_error(base + "  moe: {experts_implementation: eager, experts: 4, top_k: 6, expert_d_ff: 32}\n" + batch) ==
        "moe.yaml:10: model.moe.top_k: 6 exceeds model.moe.experts 4");
  CHECK(load_error(base + "  moe:\n    experts: 4\n    top_k: 2\n    routing: counts:[8, 4, 2, 1]\n" + batch) ==
        "moe.yaml:13: model.moe.routing: counts sum to 15, but tokens x top_k = 8 x 2 = 16 "
        "(batch.micro_batch x batch.seq_len tokens, each routed to top_k experts)");
  CHECK(load_error(base + "  moe:\n    experts: 4\n    top_k: 2\n    routing: counts:[9, 4, 2, 1]\n" + batch)
            .find("model.moe.routing: counts: expert 0 gets 9 tokens, more than the 8 tokens") != std::string::npos);
  CHECK(load_error(base + "  moe:\n    experts: 4\n    top_k: 2\n    routing: counts:[8, 8]\n" + batch)
            .rfind("moe.yaml:13: model.moe.routing: counts: 2 entries; expected 4", 0) == 0);
  CHECK(load_error(base + "  moe:\n    experts: 4\n    top_k: 2\n    routing: skew:-1\n" + batch) ==
        "moe.yaml:13: model.moe.routing: skew:ALPHA needs a number ALPHA >= 0, got 'skew:-1'");
  CHECK(load_error(base + "  moe:\n    experts: 4\n    top_k: 2\n    routing: balance\n" + batch).find(
            "model.moe.routing: expected balanced, worst-case, skew:ALPHA (ALPHA >= 0) or counts:[N, ...], "
            "got 'balance'; did you mean 'balanced'?") != std::string::npos);
  CHECK(load_error(base + "  moe:\n    experts: 4\n    top_k: 2\n    capacity_factor: 0\n" + batch) ==
        "moe.yaml:13: model.moe.capacity_factor: expected a number > 0, got '0'");
  CHECK(load_error(base + "  moe:\n    experts: 4\n    top_k: 2\n    capacity_factor: 1.25\n" + batch)
            .rfind("moe.yaml:13: model.moe.capacity_factor: a capacity factor (token dropping and padding) is "
                   "Megatron-Core's", 0) == 0);
  CHECK(load_error(base + "  moe:\n    experts: 4\n    topk: 2\n" + batch).rfind("moe.yaml:12: model.moe.topk: unknown key", 0) == 0);
  CHECK(load_error(base + "  moe:\n    experts: 4\n    top_k: 2\n    experts_implementation: triton\n" + batch)
            .rfind("moe.yaml:13: model.moe.experts_implementation: ", 0) == 0);
  // LoRA on attention composes (tests/test_moe_compose.cpp); targets only the routed experts
  // would have are refused.
  CHECK(load_error(base + "  moe: {experts_implementation: eager, experts: 4, top_k: 2}\n" + batch + "lora:\n  rank: 8\n  targets: [q_proj, v_proj]\n")
            .empty());
  CHECK(load_error(base + "  moe: {experts_implementation: eager, experts: 4, top_k: 2}\n" + batch + "lora:\n  rank: 8\n  targets: [up_proj]\n")
            .find("lora.targets: no module of this mixture-of-experts model matches") != std::string::npos);
  CHECK(load_error(base + "  architecture: mixtral\n" + batch)
            .find("model.moe: architecture mixtral is a mixture of experts") != std::string::npos);
  // --set model.moe.routing
  const Scenario ok = load_scenario_text(base + "  moe: {experts_implementation: eager, experts: 4, top_k: 2}\n" + batch, "moe.yaml",
                                         {{"model.moe.routing", "worst-case"}});
  CHECK(ok.model.arch.moe.routing == graph::MoeRouting::worst_case);
  CHECK(ok.model.arch.moe.expert_d_ff == 128);  // expert_d_ff defaults to d_ff
}

TEST_CASE("MoE runs end to end: the routing sets each expert's sizes, checkpointing composes", "[moe]") {
  const std::string base =
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 128\n  heads: 4\n  kv_heads: 2\n  d_ff: 128\n"
      "  vocab: 64\n  context_length: 512\n  attention: flash\n"
      "  moe: {experts_implementation: eager, experts: 8, top_k: 2, expert_d_ff: 512}\n"
      "batch:\n  micro_batch: 8\n  seq_len: 256\nprecision:\n  params: bf16\ndevice:\n  capacity: 80GiB\n";
  auto peak = [](const Scenario& s) {
    const Program p = build_program(s);
    SimulatedDevice device(s.device.capacity, s.device.cuda_context);
    const Timeline t = execute(p, s.allocator, device, ExecuteOptions{});
    return analyze(p, t).peak_allocated;
  };
  // Layer 0's gathers of hidden states (aten::index, (n, D) bf16) in the measured forward:
  // one per expert that got tokens, n = its routed tokens.
  auto gathers = [](const Scenario& s) {
    const Program p = build_program(s);
    std::vector<uint64_t> out;
    bool measuring = false;
    for (const MemoryEvent& e : p.events) {
      if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
        measuring = true;
      if (measuring && e.type == EventType::alloc && e.phase == Phase::forward && e.layer == 0 &&
          p.str(e.op) == "index" && e.bytes % (128 * 2) == 0 && e.bytes >= 128 * 2 * 64)
        out.push_back(e.bytes);
    }
    return out;
  };
  const uint64_t T = 8 * 256, row = 128 * 2;
  CHECK(gathers(load(base)) == std::vector<uint64_t>(8, T * 2 / 8 * row));  // balanced: 512 each
  CHECK(gathers(load_scenario_text(base, "moe.yaml", {{"model.moe.routing", "worst-case"}})) ==
        std::vector<uint64_t>{T * row, T * row});
  CHECK(gathers(load_scenario_text(base, "moe.yaml", {{"model.moe.routing", "counts:[2048,1024,512,256,128,64,64,0]"}})) ==
        std::vector<uint64_t>{2048 * row, 1024 * row, 512 * row, 256 * row, 128 * row, 64 * row, 64 * row});
  // The saved bytes depend on the routed slots only through their sum: the peak at the start
  // of backward (every layer's saves alive) is the same for balanced and worst-case here.
  const uint64_t balanced = peak(load(base));
  CHECK(peak(load_scenario_text(base, "moe.yaml", {{"model.moe.routing", "worst-case"}})) == balanced);
  // The MoE block is the MLP half: the `modules` policy checkpoints it.
  CHECK(peak(load_scenario_text(base, "moe.yaml", {{"checkpoint.policy", "modules"}})) < balanced);
  CHECK(peak(load_scenario_text(base, "moe.yaml", {{"checkpoint.policy", "full"}})) < balanced);
  CHECK(peak(load_scenario_text(base, "moe.yaml", {{"checkpoint.policy", "custom"}, {"checkpoint.custom", "[mlp]"}})) <
        balanced);
  // router: sigmoid scores (SigmoidBackward0 instead of SoftmaxBackward0 in the router).
  {
    std::string y = base;
    y.replace(y.find("expert_d_ff: 512}"), 17, "expert_d_ff: 512, router: sigmoid}");
    const Scenario s = load(y);
    CHECK(s.model.arch.moe.score == graph::MoeScore::sigmoid);
    const Program p = build_program(s);
    bool sigmoid = false;
    for (const MemoryEvent& e : p.events)
      sigmoid = sigmoid || (e.type == EventType::alloc && e.phase == Phase::backward && p.str(e.op) == "SigmoidBackward0");
    CHECK(sigmoid);
  }
  // The three experts implementations: batched_mm gathers a weight copy per token-slot.
  auto with_impl = [&](const std::string& impl) {
    std::string y = base;
    y.replace(y.find("expert_d_ff: 512}"), 17, "expert_d_ff: 512, experts_implementation: " + impl + "}");
    return load(y);
  };
  CHECK(peak(with_impl("batched_mm")) > balanced);
  CHECK(peak(with_impl("grouped_mm")) > 0);
}

TEST_CASE("memsim run reports the routing assumption and, for balanced, the worst-case peaks", "[moe][cli]") {
  memsim_test::TempDir dir("memsim_moe");
  const auto path = dir.write("moe.yaml", std::string(kSmall) + "  moe: {experts_implementation: eager, experts: 8, top_k: 2, expert_d_ff: 64}\n" +
                                              "batch:\n  micro_batch: 2\n  seq_len: 32\ndevice:\n  capacity: 80GiB\n");
  const auto text = memsim_test::run_shell(memsim_test::memsim_command() + "run '" + path.string() + "' 2>&1");
  CHECK(text.status == 0);
  CHECK(text.out.find("moe routing  balanced (an assumption: model.moe.routing); worst-case routing peaks at ") !=
        std::string::npos);
  const auto json = memsim_test::run_shell(memsim_test::memsim_command() + "run '" + path.string() +
                                           "' --json - 2>/dev/null");
  const nlohmann::json j = nlohmann::json::parse(json.out);
  CHECK(j["moe"]["routing"] == "balanced");
  CHECK(j["moe"]["worst_case"]["peak_allocated_bytes"].get<uint64_t>() > 0);
  // The second simulation is the same scenario with worst-case routing.
  const Scenario worst = load_scenario(path.string(), {{"model.moe.routing", "worst-case"}});
  const Program p = build_program(worst);
  SimulatedDevice device(worst.device.capacity, worst.device.cuda_context);
  const Timeline t = execute(p, worst.allocator, device, ExecuteOptions{});
  CHECK(j["moe"]["worst_case"]["peak_allocated_bytes"].get<uint64_t>() == analyze(p, t).peak_allocated);
  // Any other assumption is named and not re-run.
  const auto skew = memsim_test::run_shell(memsim_test::memsim_command() + "run '" + path.string() +
                                           "' --set model.moe.routing=skew:1.5 --json - 2>/dev/null");
  const nlohmann::json js = nlohmann::json::parse(skew.out);
  CHECK(js["moe"]["routing"] == "skew:1.5");
  CHECK_FALSE(js["moe"].contains("worst_case"));
}

TEST_CASE("MoE composes with DDP, FSDP and FSDP2", "[moe]") {
  const std::string base = std::string(kSmall) + "  moe: {experts_implementation: eager, experts: 4, top_k: 2, expert_d_ff: 64}\n" +
                           "batch:\n  micro_batch: 2\n  seq_len: 32\nprecision:\n  params: bf16\n"
                           "device:\n  capacity: 80GiB\n";
  for (const auto& sets : std::vector<std::vector<std::pair<std::string, std::string>>>{
           {{"parallel.data", "2"}},
           {{"parallel.data", "2"}, {"parallel.sharding", "fsdp"}},
           {{"parallel.data", "2"}, {"parallel.sharding", "fsdp2"}}}) {
    INFO(sets.back().second);
    const Scenario s = load_scenario_text(base, "moe.yaml", sets);
    const Program p = build_program(s);
    CHECK(p.events.size() > 100);
  }
}

TEST_CASE("MoE aux loss: model.moe.output_router_logits from the key and config.json", "[moe]") {
  const std::string base = std::string(kSmall) + "  moe: {experts_implementation: eager, experts: 4, top_k: 2, expert_d_ff: 32}\n" +
                           "batch:\n  micro_batch: 2\n  seq_len: 16\ndevice:\n  capacity: 1GiB\n";
  const Scenario off = load(base);
  const Scenario on = load_scenario_text(base, "moe.yaml", {{"model.moe.output_router_logits", "true"}});
  CHECK_FALSE(off.model.arch.moe.output_router_logits);
  CHECK(on.model.arch.moe.output_router_logits);
  // transformers 5.17's load_balancing_loss_func, layer by layer: one bincount (E int64 =
  // 4 * 8 bytes) per MoE layer and step (a warm-up step and the measured one), and no
  // (layers * T, K, E) int64 one_hot any more (2 * 32 * 2 * 4 * 8 bytes, the earlier v5 code).
  auto count = [](const Scenario& s, const std::string& op, uint64_t bytes) {
    const Program p = build_program(s);
    int n = 0;
    for (const MemoryEvent& e : p.events)
      if (e.type == EventType::alloc && e.bytes == bytes && p.str(e.op) == op) ++n;
    return n;
  };
  CHECK(count(off, "sort", 4 * 8) == 0);
  CHECK(count(on, "sort", 4 * 8) == 2 * 2);
  CHECK(count(on, "one_hot", 2 * 32 * 2 * 4 * 8) == 0);
  // The aux loss's backward runs (the loss handle carries its AddBackward0): nothing of it is
  // left when backward ends, so the live bytes there equal the run without it.
  auto backward_end = [](const Scenario& s) {
    const Program p = build_program(s);
    SimulatedDevice device(s.device.capacity, s.device.cuda_context);
    const Timeline t = execute(p, s.allocator, device, ExecuteOptions{});
    for (const auto& [name, point] : analyze(p, t).marks)
      if (name == "backward_end" && point) return point->allocated;
    return uint64_t{0};
  };
  CHECK(backward_end(on) > 0);
  CHECK(backward_end(on) == backward_end(off));
  CHECK(load_error(base + "") == "");
  CHECK(load_error(std::string(kSmall) + "  moe: {experts_implementation: eager, experts: 4, top_k: 2, output_router_logits: maybe}\n" +
                   "batch:\n  micro_batch: 2\n  seq_len: 16\n")
            .find("model.moe.output_router_logits") != std::string::npos);
}
