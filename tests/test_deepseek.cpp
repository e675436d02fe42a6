// DeepSeek-V3 (graph/models/decoder_mla.cpp, decoder_moe_deepseek.cpp; docs/deepseek.md) and
// DeepSeek-V2 / V2-Lite (decoder_mla_v2.cpp, decoder_moe_deepseek_v2.cpp; transformers 5.17.0):
//  - against real PyTorch: tests/data/torch_cpu_deepseek/*.json are training steps of the
//    transformers 5.x DeepseekV3ForCausalLM stand-in (tools/fixtures/deepseek_models.py) with a
//    forced routing, measured on CPU with torch 1.13 (tools/fixtures/gen_deepseek_fixtures.py).
//    memsim reads each fixture's own config.json (model.hf_config), so the config import is
//    part of what is checked; compared as the other MoE fixtures are, plus every layer's
//    forward allocations in order;
//  - parameter counts from the published DeepSeek-V3, V2 and V2-Lite config.json files
//    (tests/data/moe_configs);
//  - what is refused, by key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "json_test_support.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/parameter_count.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "program/tensor_names.h"
#include "torch_fixture_test_support.h"
#include "test_paths.h"
#include "scenario_error_test_support.h"

using namespace memsim;

namespace {

const std::string kDeepseekFixtureDir = MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_deepseek";
const std::string kConfigs = MEMSIM_SOURCE_DIR + "/tests/data/moe_configs/";

std::string temp_dir() {
  const auto dir = std::filesystem::temp_directory_path() / "memsim_test_deepseek";
  std::filesystem::create_directories(dir);
  return dir.string();
}

// The fixture's run: its config.json as model.hf_config, its batch, dtype, optimizer and
// forced routing.
Scenario scenario_for(const nlohmann::json& c, const std::string& name) {
  const std::string path = temp_dir() + "/" + name + ".config.json";
  {
    std::ofstream out(path);
    out << c["hf_config"].dump(1);
  }
  std::string counts;
  for (const auto& n : c["deepseek"]["counts"]) counts += (counts.empty() ? "" : ", ") + std::to_string(n.get<int>());
  std::string y = "model:\n  hf_config: " + path + "\n  attention: eager\n  dropout: 0\n";
  y += "  moe:\n    routing: counts:[" + counts + "]\n";
  // The implementation the fixture ran (eager when it names none): memsim's default is
  // transformers 5.x's grouped_mm.
  y += "    experts_implementation: " + c["deepseek"].value("experts_implementation", std::string("eager")) + "\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: " + c.value("dtype", std::string("fp32")) + "\n";
  // HF Trainer's default mixed precision: fp32 parameters, forward and loss in autocast.
  if (c.value("autocast", std::string("none")) != "none") y += "  autocast: " + c["autocast"].get<std::string>() + "\n";
  // Every layer checkpointed, non-reentrant; torch 1.13 re-runs the whole layer.
  if (c.value("checkpoint", std::string("none")) == "full")
    y += "checkpoint:\n  policy: full\n  early_stop: false\n";
  // PEFT LoRA: rank, alpha, target_modules (fp32 adapters, no dropout) and / or
  // target_parameters (the routed experts' ParamWrappers; the adapters in the model's dtype
  // unless the fixture upcast them: adapter_dtype fp32).
  if (c.contains("lora")) {
    const nlohmann::json& l = c["lora"];
    auto list = [](const nlohmann::json& names) {
      std::string out;
      for (const auto& t : names) out += (out.empty() ? "" : ", ") + t.get<std::string>();
      return out;
    };
    y += "lora:\n  rank: " + std::to_string(l["rank"].get<int>()) + "\n  alpha: " + std::to_string(l["alpha"].get<int>()) + "\n";
    if (l.contains("targets")) y += "  targets: [" + list(l["targets"]) + "]\n";
    if (l.contains("target_parameters")) {
      y += "  target_parameters: [" + list(l["target_parameters"]) + "]\n";
      y += "  adapter_dtype: " + l.value("adapter_dtype", c.value("dtype", std::string("fp32"))) + "\n";
    }
  }
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "deepseek-fixture.yaml");
}

std::map<int, std::vector<uint64_t>> forward_allocs(const Program& p) {
  std::map<int, std::vector<uint64_t>> out;
  bool measuring = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measuring = true;
    if (measuring && e.type == EventType::alloc && e.phase == Phase::forward) out[e.layer].push_back(e.bytes);
  }
  return out;
}

// Every layer's forward allocations of the measured step, in order, real = memsim.
void check_forward_allocations(const nlohmann::json& fx, const Program& program) {
  std::map<int, std::vector<uint64_t>> real;
  for (const auto& ev : fx["events"])
    if (ev[0] == "alloc" && ev[3] == "forward") real[ev[4].get<int>()].push_back(ev[2].get<uint64_t>());
  const auto sim = forward_allocs(program);
  for (const auto& [layer, sizes] : real) {
    INFO("forward allocations of layer " << layer);
    const auto it = sim.find(layer);
    REQUIRE(it != sim.end());
    CHECK(it->second == sizes);
  }
}

// The real step's largest live total at an allocation that is not an `add` (torch 1.13's
// engine sums a tensor's grads out of place; 2.x, which memsim emulates, in place). The
// live totals are rebuilt from the recorded peak: its event index and bytes.
uint64_t peak_without_out_of_place_adds(const nlohmann::json& fx) {
  const auto& ev = fx["events"];
  const size_t at = fx["peak_at"]["event_index"].get<size_t>();
  auto delta = [&](size_t i) {
    const int64_t b = ev[i][2].get<int64_t>();
    return ev[i][0] == "alloc" ? b : -b;
  };
  auto counts = [&](size_t i) { return ev[i][0] == "alloc" && ev[i][1] != "add"; };
  int64_t live = fx["peak_live_bytes"].get<int64_t>(), best = 0;
  for (size_t i = at + 1; i-- > 0;) {  // backwards from the peak (live after event i)
    if (counts(i)) best = std::max(best, live);
    live -= delta(i);
  }
  live = fx["peak_live_bytes"].get<int64_t>();
  for (size_t i = at + 1; i < ev.size(); ++i) {
    live += delta(i);
    if (counts(i)) best = std::max(best, live);
  }
  return static_cast<uint64_t>(best);
}

std::string load_error(const std::string& yaml) { return memsim_test::scenario_error(yaml, "ds.yaml"); }

}  // namespace

TEST_CASE("DeepSeek-V3 and DeepSeek-V2 match real PyTorch training steps (CPU fixtures)", "[deepseek]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kDeepseekFixtureDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 2);
  memsim_test::print_fixture_table_header();
  for (const auto& path : files) {
    const nlohmann::json fx = memsim_test::load_json(path);
    const std::string name = fx["name"].get<std::string>();
    INFO(name);
    const Scenario scenario = scenario_for(fx["config"], name);
    REQUIRE(scenario.model.arch.mla.enabled());
    const Program program = build_program(scenario);
    // deepseek_v3_l2_qproj_e8_k3_g2_sgd's real peak is an `add` in layer 1's backward: torch
    // 1.13's engine sums two grads of the experts' gate_up_proj out of place (the
    // SelectBackward0 zeros of the whole 3-D weight, docs/moe.md), where 2.x, which memsim
    // emulates, adds in place. memsim's peak is that SelectBackward0's zeros, while its
    // incoming (2F, D) weight grad (the expert's mm) is alive; 1.13's add comes after the
    // node returned and freed it: the real peak holds one (E, 2F, D) fp32 tensor more and
    // one (2F, D) fp32 tensor less.
    const nlohmann::json& c = fx["config"];
    // deepseek_v2_l2_qlora_e8_k3_g4_sgd's likewise (the same weight's two grads).
    // And the checkpointed V3 under autocast (there layer 1's SelectBackward0 is memsim's peak
    // too).
    const bool out_of_place_add = name == "deepseek_v3_l2_qproj_e8_k3_g2_sgd" ||
                                  name == "deepseek_v2_l2_qlora_e8_k3_g4_sgd" ||
                                  name == "deepseek_v3_l2_qlora_e8_k2_g4_dense1_autocast_ckpt_full_sgd";
    // Their autocast versions too, but there the add is not where memsim peaks: the real
    // step's largest live total outside 1.13's out-of-place adds (the loss's
    // LogSoftmaxBackward0) is memsim's peak to the byte.
    // So is deepseek_v3_l2_qproj_e8_k3_g2_tp_both_attn_r8_adamw's (1.13 sums two
    // SelectBackward0 zeros of layer 1's merged gate_up weight out of place).
    if (name == "deepseek_v3_l2_qproj_e8_k3_g2_autocast_sgd" || name == "deepseek_v2_l2_qlora_e8_k3_g4_autocast_sgd" ||
        name == "deepseek_v3_l2_qproj_e8_k3_g2_tp_both_attn_r8_adamw") {
      CHECK(fx["peak_at"]["op"] == "add");
      const uint64_t without_adds = peak_without_out_of_place_adds(fx);
      CHECK(memsim_test::walk(program).step_peak == without_adds);
      nlohmann::json adjusted = fx;
      adjusted["peak_live_bytes"] = without_adds;
      memsim_test::compare_with_fixture(adjusted, scenario, program);
      check_forward_allocations(fx, program);
      continue;
    }
    const uint64_t expert_grad =
        2 * c["deepseek"]["moe_intermediate_size"].get<uint64_t>() * c["d_model"].get<uint64_t>() * 4;
    uint64_t torch113_add =
        out_of_place_add ? c["deepseek"]["n_routed_experts"].get<uint64_t>() * expert_grad - expert_grad : 0;
    // The target_parameters rows (PEFT's ParamWrapper on the routed experts): where 1.13's
    // peak is its out-of-place sum of two SelectBackward0 zeros of a merged weight, 2.x's
    // peak is the live bytes just before that sum, less what was freed between them, as in
    // tests/test_moe_lora.cpp.
    const bool target_parameters = c.contains("lora") && c["lora"].contains("target_parameters");
    if (target_parameters && fx["peak_at"]["op"] == "add" && fx["peak_at"]["phase"] == "backward") {
      const size_t at = fx["peak_at"]["event_index"].get<size_t>();
      uint64_t freed = 0;
      for (size_t i = at; i-- > 0 && fx["events"][i][0] == "free";) freed += fx["events"][i][2].get<uint64_t>();
      torch113_add = fx["events"][at][2].get<uint64_t>() - freed;
      CHECK(torch113_add > 0);
    }
    memsim_test::compare_with_fixture(fx, scenario, program, torch113_add);
    check_forward_allocations(fx, program);
  }
}

TEST_CASE("DeepSeek-V3 parameter count from its config.json matches the card", "[deepseek]") {
  // The published config.json has fp8 weights (quantization_config): refused by key.
  const std::string published = kConfigs + "deepseek-v3.json";
  const std::string e = load_error("model:\n  hf_config: " + published + "\nbatch:\n  seq_len: 16\n");
  CHECK(e.find("deepseek-v3.json:37: quantization_config: quantized checkpoints are not modelled") !=
        std::string::npos);
  // The same config without it (the bf16 weights people train): 671,026,404,352 parameters,
  // the card's "671B total" (the MTP layer's 14B are not built by transformers). Per MoE layer:
  // attention 187,107,328 (q_a 7168x1536 + norm 1536 + q_b 1536x128x192, kv_a 7168x576 +
  // norm 512 + kv_b 512x128x256, o 16384x7168), router 256x7168, experts 3x256x7168x2048,
  // shared 3x7168x2048, two norms: 11,507,286,016; x58, + 3 dense layers of 583,483,392,
  // + embeddings and lm_head 129280x7168 each + the final norm.
  const Scenario s = load_scenario_text("model:\n  hf_config: " + kConfigs + "deepseek-v3-bf16.json\nbatch:\n  seq_len: 16\n",
                                        "ds.yaml");
  CHECK(parameter_count(s.model) == 671026404352LL);
  CHECK(layer_parameter_count(s.model, 0) == 583483392LL);
  CHECK(layer_parameter_count(s.model, 3) == 11507286016LL);
  const graph::DecoderArch& a = s.model.arch;
  CHECK(a.mla.q_lora_rank == 1536);
  CHECK(a.mla.kv_lora_rank == 512);
  CHECK(a.head_dim == 192);
  CHECK(a.rotary_dim == 64);
  CHECK(a.moe.experts == 256);
  CHECK(a.moe.top_k == 8);
  CHECK(a.moe.n_group == 8);
  CHECK(a.moe.topk_group == 4);
  CHECK(a.moe.shared_d_ff == 2048);
  CHECK(a.moe.first_dense_layers == 3);
  CHECK(a.moe.code == graph::MoeRouterCode::deepseek_v3);
  CHECK(!a.moe.layer_is_moe(2));
  CHECK(a.moe.layer_is_moe(3));
  CHECK(s.precision.params == DType::bf16);
}

TEST_CASE("DeepSeek-V3: what is not modelled is refused by key", "[deepseek]") {
  const std::string cfg = "model:\n  hf_config: " + kConfigs + "deepseek-v3-bf16.json\n";
  const std::string batch = "batch:\n  micro_batch: 1\n  seq_len: 16\n";
  CHECK(load_error(cfg + "  attention: flash\n" + batch).find("model.attention: flash is not modelled with multi-head latent attention") !=
        std::string::npos);
  CHECK(load_error(cfg + "  moe: {router: softmax}\n" + batch).find("model.moe.router: DeepSeek-V3's router is sigmoid") !=
        std::string::npos);
  CHECK(load_error(cfg + "  moe: {output_router_logits: true}\n" + batch)
            .find("model.moe.output_router_logits: DeepseekV3ForCausalLM computes no auxiliary") != std::string::npos);
  // Autocast is modelled with the eager experts (the CPU fixtures *_autocast_*) and, since
  // 2026-11-28, with batched_mm (fixtures *_batched_mm_autocast_*) and grouped_mm.
  CHECK(load_error(cfg + batch + "precision:\n  params: fp32\n  autocast: bf16\n").empty());
  CHECK(load_error(cfg + "  moe: {experts_implementation: batched_mm}\n" + batch +
                   "precision:\n  params: fp32\n  autocast: bf16\n").empty());
  CHECK(load_error(cfg + "  moe: {experts_implementation: grouped_mm}\n" + batch +
                   "precision:\n  params: fp32\n  autocast: bf16\n").empty());
  CHECK(load_error("model:\n  architecture: deepseek_v3\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 128\n"
                   "  vocab: 256\n  context_length: 64\n  moe: {experts: 4, top_k: 2}\n" + batch)
            .find("model.architecture: deepseek_v3 needs its config.json") != std::string::npos);
  // config.json keys transformers' DeepseekV3 does not run, and bad group sizes.
  const std::string dir = temp_dir();
  auto config_error = [&](const std::string& name, const std::string& from, const std::string& to) {
    std::ifstream in(kConfigs + "deepseek-v3-bf16.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return load_error("model:\n  hf_config: " + path + "\n" + batch);
  };
  CHECK(config_error("freq.json", "\"moe_layer_freq\": 1", "\"moe_layer_freq\": 2")
            .find("freq.json:24: moe_layer_freq: transformers' DeepseekV3 makes every layer") != std::string::npos);
  CHECK(config_error("method.json", "\"topk_method\": \"noaux_tc\"", "\"topk_method\": \"greedy\"")
            .find("topk_method: 'greedy'") != std::string::npos);
  CHECK(config_error("score.json", "\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\"")
            .find("scoring_func: 'softmax'") != std::string::npos);
  CHECK(config_error("group.json", "\"n_group\": 8", "\"n_group\": 3")
            .find("n_group: 3 groups do not split n_routed_experts 256") != std::string::npos);
  CHECK(config_error("kv.json", "\"num_key_value_heads\": 128", "\"num_key_value_heads\": 64")
            .find("num_key_value_heads: 64 differs from num_attention_heads 128") != std::string::npos);
}

TEST_CASE("DeepSeek-V3 runs end to end: routing and the group-limited router's tensors", "[deepseek]") {
  // A small DeepSeek-V3 from its config (first layer dense), bf16, eager attention.
  const std::string dir = temp_dir();
  const std::string path = dir + "/small.json";
  std::ofstream(path) << R"({"model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 512,
  "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1024,
  "max_position_embeddings": 1024, "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
  "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 16, "num_experts_per_tok": 4,
  "n_group": 4, "topk_group": 2, "moe_intermediate_size": 128, "n_shared_experts": 1,
  "first_k_dense_replace": 1, "torch_dtype": "bfloat16"})";
  // The eager loop (memsim's default is transformers 5.x's grouped_mm, checked below).
  const std::string base = "model:\n  hf_config: " + path + "\n  moe: {experts_implementation: eager}\nbatch:\n"
                           "  micro_batch: 2\n  seq_len: 256\ndevice:\n  capacity: 80GiB\n";
  // Layer 1's measured forward allocations as (op, bytes).
  auto layer1 = [](const Scenario& s) {
    const Program p = build_program(s);
    std::vector<std::pair<std::string, uint64_t>> out;
    bool measuring = false;
    for (const MemoryEvent& e : p.events) {
      if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") measuring = true;
      if (measuring && e.type == EventType::alloc && e.phase == Phase::forward && e.layer == 1)
        out.emplace_back(p.str(e.op), e.bytes);
    }
    return out;
  };
  auto largest_gather = [](const std::vector<std::pair<std::string, uint64_t>>& a) {
    uint64_t m = 0;
    for (const auto& [op, bytes] : a)
      if (op == "index") m = std::max(m, bytes);
    return m;
  };
  const Scenario balanced = load_scenario_text(base, "ds.yaml");
  const Scenario worst = load_scenario_text(base, "ds.yaml", {{"model.moe.routing", "worst-case"}});
  const auto b = layer1(balanced), w = layer1(worst);
  // T = 512 tokens, K = 4 of E = 16 experts: balanced 128 tokens per expert, worst-case all
  // 512 to experts 0..3; each gathers its tokens' (n, 256) bf16 hidden states.
  CHECK(largest_gather(b) == 128ull * 256 * 2);
  CHECK(largest_gather(w) == 512ull * 256 * 2);
  // The router of layer 1 (T = 512, E = 16, G = 4 groups, TG = 2, K = 4), from the fp32
  // copies and logits on: sigmoid, + bias, the top-2 per group (values, indices), their sum, the group
  // top-k, zeros_like, the expanded mask's copy, .bool(), ~, masked_fill, the top-k, gather,
  // sum + 1e-20, the division's clone, * routed_scaling_factor.
  const std::vector<std::pair<std::string, uint64_t>> router = {
      {"_to_copy", 512ull * 256 * 4}, {"_to_copy", 16ull * 256 * 4},  // x.type(fp32), W.type(fp32)
      {"mm", 32768},     {"sigmoid", 32768},   {"add", 32768},        {"topk", 16384},   {"topk", 32768},
      {"sum.dim_IntList", 8192}, {"topk", 4096}, {"topk", 8192},      {"ones_like", 8192}, {"clone", 32768},
      {"_to_copy", 8192}, {"ge", 8192},        {"where", 32768},      {"topk", 8192},    {"topk", 16384},
      {"gather", 8192},  {"sum.dim_IntList", 2048}, {"add.Scalar", 2048}, {"clone", 8192}, {"mul.Scalar", 8192}};
  const auto at = std::search(b.begin(), b.end(), router.begin(), router.end());
  CHECK(at != b.end());
  // The attention, transformers 5.17's (T = 512, H = 8, rope 16, nope 32, v 32, bf16): the
  // even/odd RoPE (q: q1*cos, q2*sin, their difference, q2*cos, q1*sin, their sum, each
  // T x H x 8 x 2 bytes, and the cat; then k's at T x 8 x 2), the query's cat (T x H x 48 x 2),
  // then expand_kv: kv_b_proj (T x H x 64 x 2) and new_empty's key (T x H x 48 x 2).
  const uint64_t qh = 512ull * 8 * 8 * 2, kh = 512ull * 8 * 2;
  const std::vector<std::pair<std::string, uint64_t>> rope = {
      {"mul", qh}, {"mul", qh}, {"sub", qh}, {"mul", qh}, {"mul", qh}, {"add", qh}, {"cat", 2 * qh},
      {"mul", kh}, {"mul", kh}, {"sub", kh}, {"mul", kh}, {"mul", kh}, {"add", kh}, {"cat", 2 * kh},
      {"cat", 512ull * 8 * 48 * 2}, {"mm", 512ull * 8 * 64 * 2}, {"other", 512ull * 8 * 48 * 2}};
  CHECK(std::search(b.begin(), b.end(), rope.begin(), rope.end()) != b.end());
  // rope_interleave false: apply_rotary_pos_emb (rotate_half) on the same slices, no
  // half-width products.
  {
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.insert(text.rfind('}'), R"(, "rope_interleave": false)");
    const std::string plain_path = dir + "/small_plain_rope.json";
    std::ofstream(plain_path) << text;
    const auto pl = layer1(load_scenario_text("model:\n  hf_config: " + plain_path + base.substr(base.find("\n  moe:")),
                                              "ds.yaml"));
    CHECK(std::count(pl.begin(), pl.end(), std::pair<std::string, uint64_t>{"sub", qh}) == 0);
    CHECK(std::count(b.begin(), b.end(), std::pair<std::string, uint64_t>{"sub", qh}) == 1);
  }
  // Composes: full activation checkpointing keeps less at forward end (each layer re-runs
  // its latent attention and MoE block, routing included, in backward); FSDP and
  // grouped_mm build too.
  const Scenario ckpt = load_scenario_text(base, "ds.yaml", {{"checkpoint.policy", "full"}});
  CHECK(memsim_test::walk(build_program(ckpt)).forward_end_total <
        memsim_test::walk(build_program(balanced)).forward_end_total);
  const Scenario fsdp = load_scenario_text(base, "ds.yaml", {{"parallel.sharding", "fsdp"}, {"parallel.data", "4"}});
  CHECK(build_program(fsdp).events.size() > 1000);
  const Scenario grouped = load_scenario_text(base, "ds.yaml", {{"model.moe.experts_implementation", "grouped_mm"}});
  // out_per_sample_g[inv_perm]: every (token, slot)'s product with the fp32 routing weights.
  CHECK(largest_gather(layer1(grouped)) == 512ull * 4 * 256 * 4);
}

TEST_CASE("DeepSeek-V2 and V2-Lite parameter counts from their config.json files", "[deepseek]") {
  // DeepSeek-V2-Lite (the card: 15.7B total): q_proj (q_lora_rank null) 2048 x 16 x 192,
  // kv_a 2048 x 576 + norm 512, kv_b 512 x 16 x 256, o 2048 x 2048: 13,763,072 per layer; the
  // dense first layer's MLP 3 x 2048 x 10944; each of 26 MoE layers 64 experts of 3 x 2048 x
  // 1408, 2 shared (3 x 2048 x 2816) and the (64, 2048) router; embeddings and lm_head 102400 x
  // 2048 each, untied.
  const Scenario lite = load_scenario_text("model:\n  hf_config: " + kConfigs + "deepseek-v2-lite.json\nbatch:\n  seq_len: 16\n",
                                           "ds.yaml");
  CHECK(parameter_count(lite.model) == 15706484224LL);
  CHECK(layer_parameter_count(lite.model, 0) == 81007104LL);
  CHECK(layer_parameter_count(lite.model, 1) == 584847872LL);
  const graph::DecoderArch& a = lite.model.arch;
  CHECK(a.mla.q_lora_rank == 0);
  CHECK(a.mla.v2_code);
  CHECK(a.head_dim == 192);
  CHECK(a.rotary_dim == 64);
  CHECK(a.moe.code == graph::MoeRouterCode::deepseek_v2);
  CHECK(a.moe.score == graph::MoeScore::softmax);
  CHECK(!a.moe.group_limited);
  CHECK(a.moe.top_k == 6);
  CHECK(a.moe.shared_d_ff == 2816);
  CHECK(!a.moe.layer_is_moe(0));
  CHECK(a.moe.layer_is_moe(1));
  CHECK(lite.precision.params == DType::bf16);
  // The same through the preset (scenarios/models/deepseek-v2-lite.json, embedded).
  const Scenario preset = load_scenario_text("model:\n  preset: deepseek-v2-lite\nbatch:\n  seq_len: 16\n", "ds.yaml");
  CHECK(parameter_count(preset.model) == 15706484224LL);
  // DeepSeek-V2 (the card: 236B total): q_lora_rank 1536, 160 experts of 1536 in 8 groups
  // (3 chosen), 2 shared, 60 layers, the first dense.
  const Scenario v2 = load_scenario_text("model:\n  hf_config: " + kConfigs + "deepseek-v2.json\nbatch:\n  seq_len: 16\n",
                                         "ds.yaml");
  CHECK(parameter_count(v2.model) == 235741434880LL);
  CHECK(layer_parameter_count(v2.model, 0) == 337981440LL);
  CHECK(layer_parameter_count(v2.model, 1) == 3972116480LL);
  CHECK(v2.model.arch.moe.group_limited);
  CHECK(v2.model.arch.moe.n_group == 8);
  CHECK(v2.model.arch.moe.topk_group == 3);
  CHECK(v2.model.arch.mla.q_lora_rank == 1536);
}

TEST_CASE("PEFT LoRA on DeepSeek's latent attention: targets, trainable parameters, refusals", "[deepseek]") {
  // V2-Lite (q_proj): q_proj 2048 -> 3072, kv_a_proj_with_mqa 2048 -> 576, kv_b_proj 512 ->
  // 4096, o_proj 2048 -> 2048; r (in + out) each, 27 layers.
  // experts_implementation eager: target_parameters is modelled on the loop only.
  const std::string lite = "model:\n  hf_config: " + kConfigs + "deepseek-v2-lite.json\n"
                           "  moe: {experts_implementation: eager}\nbatch:\n  seq_len: 16\n";
  const Scenario s = load_scenario_text(
      lite + "lora:\n  rank: 8\n  targets: [q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj]\n", "ds.yaml");
  CHECK(trainable_parameter_count(s) == 27LL * 8 * ((2048 + 3072) + (2048 + 576) + (512 + 4096) + (2048 + 2048)));
  // V3, all-linear: q_a / q_b / kv_a / kv_b / o in 61 layers, the shared experts (2048 wide) in
  // the 58 MoE layers, the dense MLP (18432) in the first 3; not the routers, not the 3-D experts.
  const std::string v3 = "model:\n  hf_config: " + kConfigs + "deepseek-v3-bf16.json\n"
                         "  moe: {experts_implementation: eager}\nbatch:\n  seq_len: 16\n";
  const Scenario all = load_scenario_text(v3 + "lora:\n  rank: 16\n  targets: all-linear\n", "ds.yaml");
  CHECK(trainable_parameter_count(all) == 61LL * 1590272 + 58LL * 442368 + 3LL * 1228800);
  // lora.target_parameters (PEFT's ParamWrapper on the routed experts): r*E*((D + 2F) + (F + D))
  // more per MoE layer. V2-Lite, r 16 on all-linear and both expert weights: 26 MoE layers of
  // 64 experts of 1408 (D 2048); V3: 58 MoE layers of 256 experts of 2048 (D 7168), down_proj.
  const Scenario lite_tp = load_scenario_text(
      lite + "lora:\n  rank: 16\n  targets: all-linear\n  target_parameters: [gate_up_proj, down_proj]\n", "ds.yaml");
  CHECK(trainable_parameter_count(lite_tp) == 13799424LL + 26LL * 16 * 64 * ((2048 + 2 * 1408) + (1408 + 2048)));
  CHECK(trainable_parameter_count(lite_tp) == 235311104LL);
  const Scenario v3_tp =
      load_scenario_text(v3 + "lora:\n  rank: 8\n  target_parameters: [mlp.experts.down_proj]\n", "ds.yaml");
  CHECK(trainable_parameter_count(v3_tp) == 58LL * 8 * 256 * (2048 + 7168));
  // Names the latent attention does not have, and what is not modelled.
  CHECK(load_error(lite + "lora:\n  rank: 8\n  targets: [q_proj, k_proj]\n")
            .find("lora.targets: 'k_proj': multi-head latent attention has no k_proj") != std::string::npos);
  CHECK(load_error(v3 + "lora:\n  rank: 8\n  targets: [q_proj]\n")
            .find("lora.targets: 'q_proj': this config has q_lora_rank 1536") != std::string::npos);
  CHECK(load_error(lite + "lora:\n  rank: 8\n  targets: [q_b_proj]\n")
            .find("lora.targets: 'q_b_proj': this config's q_lora_rank is null") != std::string::npos);
  // QLoRA is modelled (tests/test_moe_qlora.cpp: the latent attention's projections and the
  // shared experts 4-bit, the router and the routed experts in precision.params).
  CHECK(load_error(lite + "lora:\n  rank: 8\n  targets: [q_proj]\n  base_dtype: nf4\n").empty());
  CHECK(load_error("model:\n  preset: llama2-7b\nbatch:\n  seq_len: 16\nlora:\n  rank: 8\n  targets: [kv_b_proj]\n")
            .find("lora.targets: 'kv_b_proj' is a projection of multi-head latent attention") != std::string::npos);
  // Runs end to end under autocast too (the adapters' path of lora_autocast.cpp; CPU fixture
  // deepseek_v3_l2_qproj_e8_k3_g2_lora_r8_autocast_adamw).
  CHECK(load_error(lite + "precision:\n  params: fp32\n  autocast: bf16\nlora:\n  rank: 8\n  targets: all-linear\n")
            .empty());
}

TEST_CASE("DeepSeek-V2: what is not modelled or cannot run is refused by key", "[deepseek]") {
  const std::string batch = "batch:\n  micro_batch: 1\n  seq_len: 16\n";
  const std::string dir = temp_dir();
  auto config_error = [&](const std::string& file, const std::string& name, const std::string& from,
                          const std::string& to) {
    std::ifstream in(kConfigs + file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return load_error("model:\n  hf_config: " + path + "\n" + batch);
  };
  const std::string full = "deepseek-v2.json", lite = "deepseek-v2-lite.json";
  CHECK(config_error(full, "tg.json", "\"topk_group\": 3", "\"topk_group\": 9").find("tg.json:54: topk_group: 9 exceeds n_group 8") !=
        std::string::npos);
  CHECK(config_error(full, "ng.json", "\"n_group\": 8", "\"n_group\": 7")
            .find("ng.json:27: n_group: 7 groups do not split n_routed_experts 160 evenly") != std::string::npos);
  CHECK(config_error(full, "nong.json", "\"n_group\": 8", "\"n_group\": null")
            .find("nong.json:27: n_group: required with topk_method group_limited_greedy") != std::string::npos);
  CHECK(config_error(lite, "m.json", "\"topk_method\": \"greedy\"", "\"topk_method\": \"noaux_tc\"")
            .find("m.json:54: topk_method: 'noaux_tc': transformers' DeepseekV2 router runs greedy or group_limited_greedy") !=
        std::string::npos);
  CHECK(config_error(lite, "sf.json", "\"scoring_func\": \"softmax\"", "\"scoring_func\": \"sigmoid\"")
            .find("sf.json:50: scoring_func: 'sigmoid': transformers' DeepseekV2 router is softmax only") != std::string::npos);
  CHECK(config_error(lite, "freq.json", "\"moe_layer_freq\": 1", "\"moe_layer_freq\": 2")
            .find("freq.json:25: moe_layer_freq: transformers' DeepseekV2 makes every layer") != std::string::npos);
  CHECK(config_error(lite, "k.json", "\"num_experts_per_tok\": 6,", "")
            .find("num_experts_per_tok: required") != std::string::npos);
  CHECK(config_error(lite, "odd.json", "\"kv_lora_rank\": 512", "\"kv_lora_rank\": 511")
            .find("odd.json:21: kv_lora_rank: 511 is odd") != std::string::npos);
  CHECK(config_error(lite, "bias.json", "\"attention_bias\": false", "\"attention_bias\": false, \"mlp_bias\": true")
            .find("mlp_bias: biases on DeepseekV2MLP's projections are not modelled") != std::string::npos);
  CHECK(config_error(lite, "shared.json", "\"n_shared_experts\": 2", "\"n_shared_experts\": null")
            .find("shared.json:28: n_shared_experts: null") != std::string::npos);
  // Scenario keys.
  const std::string cfg = "model:\n  hf_config: " + kConfigs + lite + "\n";
  CHECK(load_error(cfg + "  moe: {router: sigmoid}\n" + batch).find("model.moe.router: DeepSeek-V2's router is softmax") !=
        std::string::npos);
  CHECK(load_error(cfg + "  moe: {output_router_logits: true}\n" + batch)
            .find("model.moe.output_router_logits: DeepseekV2ForCausalLM computes no auxiliary") != std::string::npos);
  CHECK(load_error(cfg + "  attention: flash\n" + batch).find("model.attention: flash is not modelled with multi-head latent attention") !=
        std::string::npos);
  CHECK(load_error("model:\n  architecture: deepseek_v2\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 128\n"
                   "  vocab: 256\n  context_length: 64\n  moe: {experts: 4, top_k: 2}\n" + batch)
            .find("model.architecture: deepseek_v2 needs its config.json") != std::string::npos);
}

TEST_CASE("DeepSeek-V2 runs end to end: the complex RoPE table, the softmax routers, expand_kv", "[deepseek]") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/small_v2.json";
  std::ofstream(path) << R"({"model_type": "deepseek_v2", "hidden_size": 256, "intermediate_size": 512,
  "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1024,
  "max_position_embeddings": 1024, "q_lora_rank": null, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
  "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 16, "num_experts_per_tok": 4,
  "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2, "routed_scaling_factor": 16.0,
  "moe_intermediate_size": 128, "n_shared_experts": 2, "first_k_dense_replace": 1, "torch_dtype": "float32"})";
  // The eager loop (memsim's default is transformers 5.x's grouped_mm, checked below).
  const std::string base = "model:\n  hf_config: " + path + "\n  moe: {experts_implementation: eager}\nbatch:\n"
                           "  micro_batch: 2\n  seq_len: 256\ndevice:\n  capacity: 80GiB\n";
  auto forward = [](const Scenario& s, int layer) {
    const Program p = build_program(s);
    std::vector<std::pair<std::string, uint64_t>> out;
    bool measuring = false;
    for (const MemoryEvent& e : p.events) {
      if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") measuring = true;
      if (measuring && e.type == EventType::alloc && e.phase == Phase::forward && e.layer == layer)
        out.emplace_back(p.str(e.op), e.bytes);
    }
    return out;
  };
  const Scenario s = load_scenario_text(base, "ds.yaml");
  // The model's rotary table (layer -1, before the first layer): position_ids.float() (S x 4),
  // inv_freq @ positions (8 x S x 4), ones_like, polar (complex64: S x 8 x 8 bytes), the
  // attention_scaling product.
  const auto model = forward(s, -1);
  const std::vector<std::pair<std::string, uint64_t>> table = {
      {"_to_copy", 256ull * 4}, {"bmm", 8ull * 256 * 4}, {"ones_like", 8ull * 256 * 4},
      {"other", 256ull * 16 * 4}, {"mul.Scalar", 256ull * 16 * 4}};
  CHECK(std::search(model.begin(), model.end(), table.begin(), table.end()) != model.end());
  // Layer 1 (T = 512 tokens, E = 16, G = 4, TG = 2, K = 4): the router from its logits on:
  // softmax, the group max (values, indices), the group top-k (values, indices), zeros_like,
  // the expanded mask's copy, .bool(), ~, masked_fill(0.0), the top-k, * routed_scaling_factor.
  const auto l1 = forward(s, 1);
  const std::vector<std::pair<std::string, uint64_t>> router = {
      {"mm", 32768},     {"_softmax", 32768}, {"max.dim", 8192},  {"max.dim", 16384}, {"topk", 4096},
      {"topk", 8192},    {"ones_like", 8192}, {"clone", 32768},   {"_to_copy", 8192}, {"ge", 8192},
      {"where", 32768},  {"topk", 8192},      {"topk", 16384},    {"mul.Scalar", 8192}};
  CHECK(std::search(l1.begin(), l1.end(), router.begin(), router.end()) != l1.end());
  // Greedy (DeepSeek-V2-Lite's topk_method): softmax, then the top-k at once.
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.replace(text.find("group_limited_greedy"), 20, "greedy");
  const std::string greedy_path = dir + "/small_v2_greedy.json";
  std::ofstream(greedy_path) << text;
  const Scenario g = load_scenario_text("model:\n  hf_config: " + greedy_path +
                                            "\nbatch:\n  micro_batch: 2\n  seq_len: 256\ndevice:\n  capacity: 80GiB\n",
                                        "ds.yaml");
  const auto g1 = forward(g, 1);
  const std::vector<std::pair<std::string, uint64_t>> greedy = {
      {"mm", 32768}, {"_softmax", 32768}, {"topk", 8192}, {"topk", 16384}, {"mul.Scalar", 8192}};
  CHECK(std::search(g1.begin(), g1.end(), greedy.begin(), greedy.end()) != g1.end());
  // The attention (fp32, q_proj): the complex products of q_pe (T x 8 heads x 16 x 4) and k_pe
  // (T x 16 x 4), the query cat, then kv_b_proj and new_empty's key (T x 8 x 48 x 4).
  const std::vector<std::pair<std::string, uint64_t>> rope = {
      {"mul", 512ull * 8 * 16 * 4}, {"mul", 512ull * 16 * 4}, {"cat", 512ull * 8 * 48 * 4},
      {"mm", 512ull * 8 * 64 * 4},  {"other", 512ull * 8 * 48 * 4}};
  CHECK(std::search(l1.begin(), l1.end(), rope.begin(), rope.end()) != l1.end());
  // Composes with checkpointing and grouped_mm.
  const Scenario ckpt = load_scenario_text(base, "ds.yaml", {{"checkpoint.policy", "full"}});
  CHECK(memsim_test::walk(build_program(ckpt)).forward_end_total < memsim_test::walk(build_program(s)).forward_end_total);
  const Scenario grouped = load_scenario_text(base, "ds.yaml", {{"model.moe.experts_implementation", "grouped_mm"}});
  CHECK(build_program(grouped).events.size() > 1000);
}

// FSDP2 chunks each parameter on dim 0; DeepSeek's 3-D expert weights by whole experts
// (shape[0] = E), as the other MoE rows: with 64 experts over 48 ranks rank 0 holds
// ceil(64 / 48) = 2 experts of each, not 64/48 of one (its AdamW state, bf16 like the parameter, is sized so).
TEST_CASE("DeepSeek's routed experts shard by whole experts under FSDP2", "[deepseek]") {
  const Scenario s = load_scenario_text(
      "model:\n  preset: deepseek-v2-lite\nbatch:\n  seq_len: 16\nprecision: {params: bf16}\n"
      "parallel: {sharding: fsdp2, data: 48}\ndevice: {capacity: 1TiB}\n",
      "ds.yaml");
  const Program p = build_program(s);
  const uint64_t E = 64, F = 1408, D = 2048;
  bool found = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type != EventType::alloc || e.kind != TensorKind::optimizer_state) continue;
    if (tensor_name(p, e.tensor, e) !=
        "exp_avg of FSDP2 shard of model.layers.1.mlp.experts.gate_up_proj (padded chunk 0)")
      continue;
    CHECK(e.bytes == 2 * 2 * F * D * 2);  // two experts' (2F, D) rows, bf16 like the parameter
    CHECK(e.bytes != (E * 2 * F * D + 47) / 48 * 2);
    found = true;
    break;
  }
  CHECK(found);
}
