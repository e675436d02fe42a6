// memsim serve (issue #17 items 2-4; docs/serve.md): the KV layout arithmetic against the
// seed values of the issue and hand-worked vLLM configurations, vLLM's loader's weight
// bytes against published start-up logs (tests/data/serve/vllm_logs.json), the planner's
// refusals with the engines' wording, and the CLI.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "scenario/scenario.h"
#include "sim/serve/kv_layout.h"
#include "sim/serve/serve_plan.h"
#include "sim/serve/served_model.h"
#include "sim/serve/vllm_profile_run.h"
#include "test_paths.h"

using namespace memsim;
using namespace memsim::serve;

namespace {

Scenario serve_scenario(const std::string& model_preset, const std::string& serve_body,
                        const std::vector<std::pair<std::string, std::string>>& sets = {}) {
  const std::string text = "name: t\nmodel:\n  preset: " + model_preset +
                           "\nprecision:\n  params: bf16\ndevice:\n  preset: h100-80gb\nserve:\n" +
                           serve_body;
  return load_scenario_text(text, "t.yaml", sets);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

constexpr double kGiB = 1073741824.0;

}  // namespace

TEST_CASE("seed values: 2 x layers x seq x kv_heads x head_dim x bytes from config-imported models", "[serve]") {
  // Llama-2-7B (scenarios/models/llama2-7b.json), bf16: 2 x 32 x 4096 x 4096 x 2 B.
  const Scenario s = serve_scenario("llama2-7b", "  engine: vllm\n");
  const ServedModel m = served_model(s);
  REQUIRE(m.kv.size() == 32);
  CHECK(contiguous_kv_bytes(m.kv, 4096) == 2147483648LL);      // 2.15 GB for one sequence
  CHECK(8 * contiguous_kv_bytes(m.kv, 4096) == 17179869184LL); // 17.2 GB for eight
  // vLLM's paged need for one 4096-token request is the same bytes (256 full blocks).
  CHECK(request_kv_bytes(m.kv, 4096, 16, 2048) == 2147483648LL);
  const ServedModel gqa = served_model(serve_scenario("llama2-7b", "  engine: vllm\n", {{"model.kv_heads", "8"}}));
  CHECK(contiguous_kv_bytes(gqa.kv, 4096) == 536870912LL);     // 0.54 GB with 8 KV heads
  const ServedModel mqa = served_model(serve_scenario("llama2-7b", "  engine: vllm\n", {{"model.kv_heads", "1"}}));
  CHECK(contiguous_kv_bytes(mqa.kv, 4096) == 67108864LL);      // 0.07 GB with one
  // fp8 KV halves it.
  const ServedModel fp8 = served_model(serve_scenario("llama2-7b", "  kv_cache_dtype: fp8\n"));
  CHECK(contiguous_kv_bytes(fp8.kv, 4096) == 1073741824LL);
}

TEST_CASE("KV layout: page size, TP sharding and replication, MLA, sliding windows", "[serve]") {
  const Scenario s = serve_scenario("llama3-8b", "  tensor_parallel: 1\n");
  const ServedModel m = served_model(s);
  CHECK(page_bytes(m.kv.front(), 16) == 2 * 16 * 8 * 128 * 2);  // 65,536 B
  const ServedModel tp2 = served_model(serve_scenario("llama3-8b", "  tensor_parallel: 2\n"));
  CHECK(tp2.kv_heads_rank == 4);
  CHECK(page_bytes(tp2.kv.front(), 16) == 32768);
  // kv_heads (8) < TP (16): each rank stores one replicated KV head.
  const ServedModel tp16 = served_model(serve_scenario("llama3-8b", "  tensor_parallel: 16\n"));
  CHECK(tp16.kv_heads_rank == 1);
  CHECK(tp16.q_heads_rank == 2);
  CHECK(page_bytes(tp16.kv.front(), 16) == 8192);
  CHECK(kv_heads_per_rank(8, 4) == 2);
  CHECK_THROWS(kv_heads_per_rank(8, 3));
  CHECK_THROWS(kv_heads_per_rank(2, 3));
  // 32 heads do not split over 3 ranks: vLLM's own message, naming the key.
  const std::string e = error_of([] { served_model(serve_scenario("llama3-8b", "  tensor_parallel: 3\n")); });
  CHECK(e.find("t.yaml:") != std::string::npos);
  CHECK(e.find("serve.tensor_parallel") != std::string::npos);
  CHECK(e.find("Total number of attention heads (32) must be divisible by tensor parallel size (3).") != std::string::npos);

  // MLA (DeepSeek-V2/V3): one latent of kv_lora_rank 512 + qk_rope_head_dim 64 per token,
  // never sharded: 576 x 2 B per token and layer, page = block x 576 x 2.
  KvLayer mla;
  mla.mla = true;
  mla.kv_heads = 1;
  mla.head_dim = 512 + 64;
  mla.elem_bytes = 2;
  CHECK(token_bytes(mla) == 1152);
  CHECK(page_bytes(mla, 64) == 73728);
  // Sliding-window layer: the contiguous cache holds min(seq, window) tokens; vLLM's paged
  // need is cdiv(min(window - 1 + max_batched, seq), block) + 1 pages.
  KvLayer sw;
  sw.kv_heads = 8;
  sw.head_dim = 128;
  sw.elem_bytes = 2;
  sw.window = 4096;
  CHECK(contiguous_kv_bytes({sw}, 32768) == 4096LL * 4096);
  CHECK(request_kv_bytes({sw}, 32768, 16, 2048) == 385LL * 65536);  // cdiv(6143, 16) + 1 pages
}

TEST_CASE("vLLM's hybrid grouping: Gemma-2-like 21 sliding + 21 full layers", "[serve]") {
  std::vector<KvLayer> layers;
  for (int l = 0; l < 42; ++l) {
    KvLayer k;
    k.kv_heads = 8;
    k.head_dim = 256;
    k.elem_bytes = 2;
    k.window = l % 2 == 0 ? 4096 : 0;
    layers.push_back(k);
  }
  const int64_t available = 10LL << 30;
  const VllmKvPlan p = plan_vllm_blocks(layers, available, 16, 8192, 8192, 8192);
  CHECK_FALSE(p.uniform_type);
  CHECK(p.page_bytes == 131072);
  CHECK(p.group_size == 21);
  CHECK(p.groups == 2);
  CHECK(p.padding_layers == 0);
  CHECK(p.num_gpu_blocks == 3900);             // 10 GiB // 131072 // 21
  CHECK(p.kv_cache_tokens == 1950 * 16);       // blocks // groups x block_size
  CHECK(p.kv_cache_bytes == 3900LL * 131072 * 21);
  CHECK(p.blocks_per_request == 512 + 513);    // full cdiv(8192,16); sliding cdiv(8192,16)+1
  CHECK(p.max_concurrency == Approx(3900.0 / 1025.0));
  // Uniform (all full): blocks = available // page // layers, tokens = blocks x 16.
  for (KvLayer& k : layers) k.window = 0;
  const VllmKvPlan u = plan_vllm_blocks(layers, available, 16, 8192, 8192, 8192);
  CHECK(u.uniform_type);
  CHECK(u.num_gpu_blocks == available / 131072 / 42);
  CHECK(u.kv_cache_tokens == u.num_gpu_blocks * 16);
  CHECK(u.max_concurrency == Approx(static_cast<double>(u.num_gpu_blocks) / 512.0));
  // The largest max_model_len one request fits: 42 layers x cdiv(L,16) pages <= available.
  CHECK(u.max_model_len_that_fits == 8192);
  const VllmKvPlan small = plan_vllm_blocks(layers, 42LL * 131072 * 100, 16, 8192, 8192, 8192);
  CHECK(small.max_model_len_that_fits == 1600);  // 100 blocks of 16 tokens
  CHECK_FALSE(small.enough);
  // Layers with different page sizes: vLLM raises NotImplementedError.
  layers[3].head_dim = 128;
  CHECK_THROWS(plan_vllm_blocks(layers, available, 16, 8192, 8192, 8192));
}

TEST_CASE("vLLM loader weights: Llama-3-8B bf16 is 'Model loading took 14.96 GiB'", "[serve]") {
  const ServedModel m = served_model(serve_scenario("llama3-8b", "  engine: vllm\n"));
  const auto w = vllm_weight_tensors(m);
  // 8,030,261,248 parameters x 2 B + the shared RoPE cos_sin_cache (8192 x 128 x 2 B).
  CHECK(weights_bytes(w) == 8030261248ULL * 2 + 8192ULL * 128 * 2);
  // TP 2: every sharded matrix halves; norms and the RoPE cache are replicated.
  const ServedModel t2 = served_model(serve_scenario("llama3-8b", "  tensor_parallel: 2\n"));
  const uint64_t norms = (2 * 32 + 1) * 4096ULL * 2;
  const uint64_t rope = 8192ULL * 128 * 2;
  CHECK(weights_bytes(vllm_weight_tensors(t2)) == (8030261248ULL * 2 - norms) / 2 + norms + rope);
  // Quantized weights: int8 halves the decoder linears (plus per-channel fp32 scales),
  // embeddings, lm_head and norms stay bf16.
  const ServedModel q8 = served_model(serve_scenario("llama3-8b", "  quantization: int8\n"));
  const uint64_t embed = 128256ULL * 4096 * 2;  // one of embed_tokens / lm_head
  const uint64_t linear_params = 8030261248ULL - 2 * 128256ULL * 4096 - (2 * 32 + 1) * 4096ULL;
  const uint64_t scales = 32ULL * ((6144 + 4096 + 28672 + 4096) * 4 + 0);
  CHECK(weights_bytes(vllm_weight_tensors(q8)) == 2 * embed + linear_params + scales + norms + rope);
}

TEST_CASE("serve keys: bad input names FILE:LINE and the key, in the engine's words", "[serve]") {
  const auto err = [](const std::string& body) {
    return error_of([&] { serve_scenario("llama3-8b", body); });
  };
  std::string e = err("  max_model_len: 10000\n");
  CHECK(e.find("t.yaml:9: serve.max_model_len: User-specified max_model_len (10000) is greater "
               "than the derived max_model_len (max_position_embeddings=8192") != std::string::npos);
  e = err("  gpu_memory_utilization: 1.5\n");
  CHECK(e.find("t.yaml:9: serve.gpu_memory_utilization") != std::string::npos);
  CHECK(e.find("GPU memory utilization must be less than 1.0. Got 1.5.") != std::string::npos);
  e = err("  gpu_memory_utilization: 0\n");
  CHECK(e.find("serve.gpu_memory_utilization: must be in (0, 1]") != std::string::npos);
  e = err("  block_size: 24\n");
  CHECK(e.find("serve.block_size: argument --block-size: invalid choice: 24 (choose from 1, 8, 16, 32, 64, 128)") != std::string::npos);
  e = err("  kv_cache_dtype: fp4\n");
  CHECK(e.find("serve.kv_cache_dtype: expected one of auto, fp8, int8, got 'fp4'") != std::string::npos);
  e = err("  kv_cache_dtype: int8\n");
  CHECK(e.find("serve.kv_cache_dtype: int8 is not a vLLM KV cache dtype") != std::string::npos);
  e = err("  engine: vllm\n  mem_fraction_static: 0.8\n");
  CHECK(e.find("serve.mem_fraction_static: is SGLang's") != std::string::npos);
  e = err("  engine: sglang\n  gpu_memory_utilization: 0.8\n");
  CHECK(e.find("serve.gpu_memory_utilization: is vLLM's") != std::string::npos);
  e = err("  engine: trtllm\n");
  CHECK(e.find("serve.engine: expected one of vllm, sglang") != std::string::npos);
  e = err("  max_num_sequences: 8\n");
  CHECK(e.find("max_num_sequences") != std::string::npos);
  // Checks that need the device defaults are made by the planner.
  e = error_of([] { plan_serve(serve_scenario("llama3-8b", "  max_num_batched_tokens: 512\n")); });
  CHECK(e.find("max_num_batched_tokens (512) must be greater than or equal to max_num_seqs (1024).") != std::string::npos);
  // Models whose vLLM code memsim does not model are refused by key.
  // (gemma2 / gemma3_text and the MoE rows are modelled: tests/test_serve_families.cpp.)
  e = error_of([] { plan_serve(serve_scenario("olmo2-7b", "  engine: vllm\n")); });
  CHECK(e.find("model.architecture") != std::string::npos);
  CHECK(e.find("'olmo2'") != std::string::npos);
  // A scenario without the section leaves every other command unchanged.
  const Scenario plain = load_scenario_text("model:\n  preset: llama3-8b\n", "p.yaml");
  CHECK_FALSE(plain.serve.present);
}

TEST_CASE("vLLM plan: no room for KV, and one max_model_len request that does not fit", "[serve]") {
  // Llama-3-8B bf16 weights (14.96 GiB) on a 17 GiB device at 0.9: nothing left (the profile
  // run itself still fits the device).
  const Scenario s = serve_scenario("llama3-8b", "  gpu_memory_utilization: 0.9\n",
                                    {{"device.capacity", "17GiB"}});
  const ServePlan p = plan_serve(s);
  CHECK_FALSE(p.fits);
  CHECK(p.available_kv_bytes < 0);
  CHECK(p.kv.num_gpu_blocks == 0);
  CHECK(p.failure == "No available memory for the cache blocks. Try increasing "
                     "`gpu_memory_utilization` when initializing the engine.");
  // Enough for some blocks but not one 8192-token request: vLLM's check_enough_kv_cache_memory.
  const Scenario tight = serve_scenario("llama3-8b", "  gpu_memory_utilization: 0.9\n  max_num_seqs: 16\n  max_num_batched_tokens: 512\n",
                                        {{"device.capacity", "18.2GiB"}});
  const ServePlan t = plan_serve(tight);
  INFO(t.failure);
  CHECK_FALSE(t.fits);
  CHECK(t.available_kv_bytes > 0);
  CHECK(t.kv.max_model_len_that_fits < 8192);
  CHECK(t.failure.find("To serve at least one request with the models's max seq len (8192)") == 0);
  CHECK(t.failure.find("the estimated maximum model length is " + std::to_string(t.kv.max_model_len_that_fits)) != std::string::npos);
}

TEST_CASE("vLLM plan arithmetic: available = capacity x util - weights - activation - non-torch", "[serve]") {
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-vllm-h100.yaml");
  const ServePlan p = plan_serve(s);
  REQUIRE(p.fits);
  REQUIRE(p.activation_peak_bytes.has_value());
  const double requested = static_cast<double>(s.device.capacity) * 0.9;
  CHECK(p.available_kv_bytes ==
        static_cast<int64_t>(requested - static_cast<double>(p.weights_bytes + *p.activation_peak_bytes +
                                                             p.non_torch_bytes)));
  CHECK(p.non_torch_bytes == s.device.cuda_context);
  CHECK(p.kv.page_bytes == 65536);
  CHECK(p.kv.num_gpu_blocks == p.available_kv_bytes / 65536 / 32);
  CHECK(p.kv.kv_cache_tokens == p.kv.num_gpu_blocks * 16);
  CHECK(p.kv.max_concurrency == Approx(static_cast<double>(p.kv.num_gpu_blocks) / 512.0));
  // The profile run: the forward's peak is at least one layer's MLP (gate_up [T, 2 f] and
  // SiluAndMul's [T, f]) and the sampler's at least its sort (fp32 values + int64 indices
  // of [requests, vocab]).
  CHECK(p.forward_peak_bytes >= 8192ULL * 3 * 14336 * 2);
  CHECK(p.sampler_peak_bytes >= 256ULL * 128256 * 12);
  CHECK(*p.activation_peak_bytes == std::max(p.forward_peak_bytes, p.sampler_peak_bytes));
  // fp8 KV doubles the blocks of the same budget; TP 2 shrinks the weights per rank.
  Scenario f = s;
  f.serve.kv_cache_dtype = KvCacheDtype::fp8;
  const ServePlan pf = plan_serve(f);
  CHECK(pf.kv.page_bytes == 32768);
  CHECK(pf.kv.num_gpu_blocks == pf.available_kv_bytes / 32768 / 32);
  Scenario t = s;
  t.serve.tensor_parallel = 2;
  const ServePlan pt = plan_serve(t);
  CHECK(pt.weights_bytes < p.weights_bytes / 2 + (64ULL << 20));
  CHECK(pt.nccl_bytes == kDefaultNcclBytes);
  CHECK(pt.kv.num_gpu_blocks > 2 * p.kv.num_gpu_blocks);
}

TEST_CASE("inverse questions: sequences of a length, the largest max_model_len, the smallest TP", "[serve]") {
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-vllm-h100.yaml");
  const ServePlan p = plan_serve(s);
  CHECK(sequences_that_fit(p, 8192) == p.kv.num_gpu_blocks / 512);
  CHECK(sequences_that_fit(p, 1000) == p.kv.num_gpu_blocks / 63);  // cdiv(1000, 16) blocks each
  CHECK(p.kv.max_model_len_that_fits == 8192);  // capped at the model's context
  // Llama-3.1-70B bf16 (141 GB) does not fit one or two H100s; four do.
  const Scenario big = serve_scenario("llama3.1-70b", "  max_model_len: 8192\n");
  const MinTpResult r = smallest_tp(big, 8);
  REQUIRE(r.tp.has_value());
  CHECK(*r.tp == 4);
  CHECK(r.tried.size() == 2);
}

TEST_CASE("published vLLM start-up logs (tests/data/serve/vllm_logs.json)", "[serve]") {
  std::ifstream in(MEMSIM_SOURCE_DIR + "/tests/data/serve/vllm_logs.json");
  REQUIRE(in.good());
  const nlohmann::json data = nlohmann::json::parse(in);
  REQUIRE(data["entries"].size() >= 3);
  for (const auto& e : data["entries"]) {
    INFO(e["id"].get<std::string>() << ": " << e["source"].get<std::string>());
    std::vector<std::pair<std::string, std::string>> sets;
    for (const auto& [k, v] : e["sets"].items()) sets.emplace_back(k, v.get<std::string>());
    const Scenario s = load_scenario_text("model:\n  preset: " + e["preset"].get<std::string>() +
                                              "\nprecision:\n  params: bf16\nserve:\n  engine: vllm\n",
                                          "log.yaml", sets);
    const ServePlan p = plan_serve(s);
    const auto& logged = e["logged"];
    const auto& mine = e["memsim"];
    const double w = static_cast<double>(p.weights_bytes) / kGiB;
    // Weights: what vLLM's "Model loading took" printed, to its digits (0.0001 GiB for the
    // one unidentified small tensor per linear of the w8a8 checkpoint).
    const double lw = logged["weights_gib"].get<double>();
    const bool two_digits = std::abs(lw * 100 - std::round(lw * 100)) < 1e-9;
    CHECK(std::abs(w - lw) <= (two_digits ? 0.005 : 0.00015));
    // memsim's recorded prediction (a drift in the model shows up here).
    CHECK(std::abs(w - mine["weights_gib"].get<double>()) <= 0.00005);
    const double act = static_cast<double>(*p.activation_peak_bytes) / kGiB;
    CHECK(std::abs(act - mine["activation_gib"].get<double>()) <= 0.005);
    CHECK(std::abs(static_cast<double>(p.available_kv_bytes) / kGiB - mine["available_kv_gib"].get<double>()) <= 0.005);
    CHECK(std::abs(p.kv.num_gpu_blocks - mine["num_gpu_blocks"].get<int64_t>()) <= 1);
    if (logged.contains("non_torch_gib"))  // an input: the log's value is fed in
      CHECK(std::abs(static_cast<double>(p.non_torch_bytes) / kGiB - logged["non_torch_gib"].get<double>()) <= 0.005);
    if (logged.contains("activation_gib") && e["id"] != "issue12330-llama3-8b-a100-40gb")
      CHECK(std::abs(act - logged["activation_gib"].get<double>()) <= 0.005);
    if (e["id"] == "pr10511-llama3-8b-h100-tp1")  // every term logged: the budget agrees
      CHECK(std::abs(static_cast<double>(p.available_kv_bytes) / kGiB - logged["available_kv_gib"].get<double>()) <= 0.005);
    // The block arithmetic on the log's own KV budget reproduces its block count.
    if (logged.contains("num_gpu_blocks")) {
      const int64_t blocks = logged["num_gpu_blocks"].get<int64_t>();
      const int64_t per_block_all_layers = p.kv.page_bytes * p.model.layers;
      int64_t available = 0, slack = 0;
      if (logged.contains("available_kv_gib")) {  // printed to 0.01 GiB
        available = static_cast<int64_t>(logged["available_kv_gib"].get<double>() * kGiB);
        slack = static_cast<int64_t>(0.005 * kGiB) / per_block_all_layers + 1;
      } else {
        available = blocks * per_block_all_layers;
      }
      const VllmKvPlan kv = plan_vllm_blocks(p.model.kv, available, p.settings.block_size,
                                             logged["max_model_len"].get<int64_t>(),
                                             p.settings.max_num_batched_tokens, p.model.context);
      CHECK(std::abs(kv.num_gpu_blocks - blocks) <= slack);
      if (logged.contains("max_concurrency"))
        CHECK(std::abs(std::round(static_cast<double>(blocks) * 16 / logged["max_model_len"].get<double>() * 100) / 100 -
                       logged["max_concurrency"].get<double>()) < 1e-9);
    }
  }
}

TEST_CASE("memsim serve: text, JSON keys, HTML, inverse flags and exit statuses", "[serve]") {
  using memsim_test::memsim_command;
  using memsim_test::run_shell;
  const std::string scenario = std::string(MEMSIM_SOURCE_DIR) + "/scenarios/llama3-8b-vllm-h100.yaml";
  auto r = run_shell(memsim_command() + "serve '" + scenario + "' 2>&1");
  CHECK(r.status == 0);
  CHECK(r.out.find("Available KV cache memory") != std::string::npos);
  CHECK(r.out.find("# GPU blocks") != std::string::npos);
  CHECK(r.out.find("Maximum concurrency for 8,192 tokens per request") != std::string::npos);
  r = run_shell(memsim_command() + "serve '" + scenario + "' --json - --max-seqs 4096 --min-tp 4");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* key : {"weights_bytes", "activation_peak_bytes", "non_torch_bytes", "kv_cache_bytes",
                          "num_gpu_blocks", "kv_cache_tokens", "max_concurrency", "max_model_len_that_fits"})
    CHECK(j.contains(key));
  const ServePlan p = plan_serve(load_scenario(scenario));
  CHECK(j["num_gpu_blocks"].get<int64_t>() == p.kv.num_gpu_blocks);
  CHECK(j["kv_cache_tokens"].get<int64_t>() == p.kv.kv_cache_tokens);
  CHECK(j["sequences_that_fit"]["count"].get<int64_t>() == p.kv.num_gpu_blocks / 256);
  CHECK(j["min_tensor_parallel"].get<int64_t>() == 1);
  r = run_shell(memsim_command() + "serve '" + scenario + "' --max-model-len-that-fits --set device.capacity=18.2GiB "
                "--set serve.max_num_seqs=16 --set serve.max_num_batched_tokens=512");
  CHECK(r.status == 3);
  CHECK(std::stoll(r.out) > 0);
  CHECK(std::stoll(r.out) < 8192);
  // No room for the KV cache: exit 3 with vLLM's message.
  r = run_shell(memsim_command() + "serve '" + scenario + "' --set device.capacity=18GiB 2>&1");
  CHECK(r.status == 3);
  CHECK(r.out.find("No available memory for the cache blocks") != std::string::npos);
  // Bad input: exit 1 naming the key.
  r = run_shell(memsim_command() + "serve '" + scenario + "' --set serve.block_size=24 2>&1");
  CHECK(r.status == 1);
  CHECK(r.out.find("--set serve.block_size: argument --block-size: invalid choice: 24") != std::string::npos);
  // HTML: one self-contained page with the budget.
  memsim_test::TempDir dir("serve_html");
  const auto html = dir.path / "plan.html";
  r = run_shell(memsim_command() + "serve '" + scenario + "' --html '" + html.string() + "' >/dev/null");
  CHECK(r.status == 0);
  const std::string page = memsim_test::slurp(html);
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("KV cache") != std::string::npos);
  CHECK(page.find("http") == std::string::npos);
  // --vary: one row per point, refusals as rows.
  r = run_shell(memsim_command() + "serve '" + scenario + "' --vary serve.tensor_parallel=1,3 --json -");
  CHECK(r.status == 0);
  const nlohmann::json g = nlohmann::json::parse(r.out);
  REQUIRE(g["points"].size() == 2);
  CHECK(g["points"][0]["kv_cache_tokens"].get<int64_t>() == p.kv.kv_cache_tokens);
  CHECK(g["points"][1]["error"].get<std::string>().find("must be divisible by tensor parallel size (3)") != std::string::npos);
}

TEST_CASE("SGLang's static pool: rest = avail - total x (1 - mem_fraction_static)", "[serve]") {
  const Scenario s = serve_scenario("llama3-8b", "  engine: sglang\n  mem_fraction_static: 0.85\n");
  const ServePlan p = plan_serve(s);
  REQUIRE(p.fits);
  CHECK_FALSE(p.activation_peak_bytes.has_value());
  CHECK(p.cell_bytes == 8 * 128 * 32 * 2 * 2);
  const double total = (static_cast<double>(s.device.capacity) - static_cast<double>(s.device.cuda_context)) / kGiB;
  CHECK(p.sglang_total_gib == Approx(total));
  CHECK(p.weights_reserved >= p.weights_bytes);
  const double avail = total - static_cast<double>(p.weights_reserved) / kGiB;
  const double rest = avail - total * 0.15;
  CHECK(p.kv.kv_cache_tokens == static_cast<int64_t>(std::floor(rest * kGiB / p.cell_bytes)));
  // The default fraction follows TP.
  CHECK(plan_serve(serve_scenario("llama3-8b", "  engine: sglang\n")).settings.utilization == 0.88);
  CHECK(plan_serve(serve_scenario("llama3-8b", "  engine: sglang\n  tensor_parallel: 8\n")).settings.utilization == 0.81);
  // Too small a fraction: SGLang's RuntimeError.
  const ServePlan no = plan_serve(serve_scenario("llama3-8b", "  engine: sglang\n  mem_fraction_static: 0.15\n"));
  CHECK_FALSE(no.fits);
  CHECK(no.failure == "Not enough memory. Please try to increase --mem-fraction-static.");
}

TEST_CASE("vLLM plans for the other modelled architectures: Mistral's sliding window, Qwen3, Phi-3", "[serve]") {
  // Mistral-7B v0.1: every layer slides (4096): one uniform sliding-window group, a request
  // of L tokens needs cdiv(min(window - 1 + batched, L), 16) + 1 blocks.
  const ServePlan m = plan_serve(serve_scenario("mistral-7b", "  max_model_len: 32768\n  max_num_batched_tokens: 8192\n  max_num_seqs: 256\n"));
  REQUIRE(m.fits);
  CHECK(m.kv.uniform_type);
  CHECK(m.kv.blocks_per_request == (4095 + 8192 + 15) / 16 + 1);
  CHECK(m.kv.max_concurrency == Approx(static_cast<double>(m.kv.num_gpu_blocks) / m.kv.blocks_per_request));
  // Qwen3-8B: q/k norms per head; 36 layers of 8 KV heads x 128.
  const ServePlan q = plan_serve(serve_scenario("qwen3-8b", "  max_num_seqs: 256\n"));
  REQUIRE(q.fits);
  CHECK(q.kv.page_bytes == 65536);
  CHECK(q.kv.num_gpu_blocks == q.available_kv_bytes / 65536 / 36);
  // Phi-3-mini: fused qkv / gate_up in its own checkpoint, 32 KV heads.
  const ServePlan ph = plan_serve(serve_scenario("phi3-mini", "  max_num_seqs: 256\n"));
  REQUIRE(ph.fits);
  CHECK(ph.kv.page_bytes == 2 * 16 * 32 * 96 * 2);
  // Eager (enforce_eager) keeps more of the forward alive than Inductor's lifetimes.
  const ServePlan eager = plan_serve(serve_scenario("llama3-8b", "  max_num_seqs: 16\n  cuda_graphs: false\n"));
  const ServePlan compiled = plan_serve(serve_scenario("llama3-8b", "  max_num_seqs: 16\n  cuda_graphs: true\n"));
  CHECK(eager.forward_peak_bytes > compiled.forward_peak_bytes);
}
