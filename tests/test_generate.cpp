// step.kind generate (issue #17 item 1; sim/step/generate.h, graph/models/kv_cache.h):
//  - against real PyTorch: tests/data/generate/*.json are greedy generate() runs of the
//    decoder stand-in with DynamicCache / StaticCache stand-ins on CPU, torch 1.13
//    (tools/fixtures/gen_generate_fixtures.py); every allocation's size in order, the live
//    bytes after each one, the peak, what stays alive after generate() and the cache's bytes
//    must agree exactly;
//  - the issue's seed formula values (2 x L x B x S x d x bytes) read from the cache of a
//    simulated generate run of the config-imported Llama-2-7B;
//  - the refusals by key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_test_support.h"
#include "decoder_arch_test_support.h"
#include "json_test_support.h"
#include "graph/models/kv_cache.h"
#include "scenario/scenario.h"
#include "sim/step/execute.h"
#include "sim/step/generate.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kGenerateFixtureDir = MEMSIM_SOURCE_DIR + "/tests/data/generate";

Scenario scenario_for(const nlohmann::json& c) {
  std::string y = "model:\n  family: hf-llama\n";
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += std::string("  tied_embeddings: ") + (c.value("tied", false) ? "true" : "false") + "\n";
  y += "  attention: eager\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) + "\n";
  y += "precision:\n  params: " + c.value("dtype", std::string("fp32")) + "\n";
  y += "step:\n  kind: generate\n";
  y += "generate:\n  prompt_len: " + std::to_string(c["seq"].get<int>()) +
       "\n  new_tokens: " + std::to_string(c["new_tokens"].get<int>()) +
       "\n  cache: " + c["cache"].get<std::string>() +
       "\n  logits_to_keep: " + std::to_string(c["logits_to_keep"].get<int>()) + "\n";
  if (c.contains("cache_classes")) y += "  cache_classes: " + c["cache_classes"].get<std::string>() + "\n";
  for (const char* k : {"residual_length", "q_group_size"})  // quantized caches' cache_config
    if (c.contains(k) && c["cache"].get<std::string>().rfind("quantized:", 0) == 0)
      y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  Scenario s = load_scenario_text(y, "generate-fixture.yaml");
  s.model.arch = memsim_test::arch_for(c);
  return s;
}

// Allocation sizes in order, and the live bytes (relative to the start) after each.
struct AllocWalk {
  std::vector<uint64_t> sizes;
  std::vector<int64_t> live_after;
  int64_t peak = 0;
  int64_t end = 0;
};

AllocWalk walk_program(const Program& p) {
  AllocWalk w;
  int64_t live = 0;
  bool on = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark) {
      const std::string& name = p.str(static_cast<uint32_t>(e.bytes));
      if (name == "measured_step_begin") {
        on = true;
        live = 0;
      }
      if (name == "generate_end") w.end = live;
      continue;
    }
    if (e.type == EventType::alloc) {
      live += static_cast<int64_t>(e.bytes);
      if (on) {
        w.sizes.push_back(e.bytes);
        w.live_after.push_back(live);
        w.peak = std::max(w.peak, live);
      }
    } else if (e.type == EventType::free) {
      live -= static_cast<int64_t>(p.tensors[e.tensor].bytes);
    }
  }
  return w;
}

AllocWalk walk_fixture(const nlohmann::json& fx) {
  AllocWalk w;
  int64_t live = 0;
  for (const auto& e : fx["events"]) {
    const int64_t n = e[2].get<int64_t>();
    if (e[0] == "alloc") {
      live += n;
      w.sizes.push_back(static_cast<uint64_t>(n));
      w.live_after.push_back(live);
      w.peak = std::max(w.peak, live);
    } else {
      live -= n;
    }
  }
  w.end = live;
  return w;
}

}  // namespace

TEST_CASE("generate matches greedy generation with HF's cache classes on CPU (stand-ins)", "[generate]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kGenerateFixtureDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 14);
  for (const auto& path : files) {
    const nlohmann::json fx = memsim_test::load_json(path);
    const std::string name = fx["name"];
    INFO(name);
    const Scenario s = scenario_for(fx["config"]);
    Program program;
    GenerateFacts facts;
    build_generate_program(s, program, nullptr, &facts);
    const AllocWalk sim = walk_program(program);
    const AllocWalk real = walk_fixture(fx);
    // The first allocation whose size or live total differs, for the message.
    size_t diverge = 0;
    while (diverge < std::min(sim.sizes.size(), real.sizes.size()) &&
           sim.sizes[diverge] == real.sizes[diverge] &&
           sim.live_after[diverge] == real.live_after[diverge])
      ++diverge;
    std::string around;
    for (size_t i = diverge >= 3 ? diverge - 3 : 0; i < diverge + 4; ++i) {
      around += "\n  #" + std::to_string(i) + " real ";
      around += i < real.sizes.size() ? std::to_string(real.sizes[i]) + " -> " + std::to_string(real.live_after[i]) : "-";
      around += " | memsim ";
      around += i < sim.sizes.size() ? std::to_string(sim.sizes[i]) + " -> " + std::to_string(sim.live_after[i]) : "-";
    }
    INFO("first difference at allocation " << diverge << " of " << real.sizes.size() << " (memsim "
                                            << sim.sizes.size() << "): size -> live after" << around);
    CHECK(diverge == real.sizes.size());
    CHECK(sim.sizes.size() == real.sizes.size());
    CHECK(sim.peak == fx["peak_live_bytes"].get<int64_t>() - fx["start_live_bytes"].get<int64_t>());
    CHECK(sim.end == fx["end_live_bytes"].get<int64_t>() - fx["start_live_bytes"].get<int64_t>());
    CHECK(facts.cache_bytes_end == fx["cache_bytes"].get<uint64_t>());
    if (fx.contains("cache_host_bytes")) {
      // generate.cache offloaded: the host copies, and the prefetches on their own stream.
      CHECK(facts.cache_host_bytes_end == fx["cache_host_bytes"].get<uint64_t>());
      CHECK(facts.cache_host_peak_bytes == fx["cache_host_peak_bytes"].get<uint64_t>());
      CHECK(program.host_offload_bytes == facts.cache_host_peak_bytes);
      size_t side = 0;
      for (const MemoryEvent& e : program.events)
        if (e.type == EventType::alloc && e.stream == graph::KvCache::kPrefetchStream) ++side;
      CHECK(side > 0);
    } else {
      CHECK(facts.cache_host_peak_bytes == 0);
    }
    // The run executes on the allocator without an OOM.
    SimulatedDevice device(s.device.capacity, s.device.cuda_context);
    const Timeline t = execute(program, s.allocator, device);
    CHECK_FALSE(t.oom.has_value());
  }
}

namespace {

// Llama-2-7B from its config.json (scenarios/models/llama2-7b.json), bf16, greedy generate.
Scenario llama2_generate(int64_t batch, int64_t prompt, int64_t new_tokens, const std::string& cache,
                         int64_t kv_heads = 0) {
  std::string y = "model:\n  hf_config: " + MEMSIM_SOURCE_DIR + "/scenarios/models/llama2-7b.json\n";
  if (kv_heads > 0) y += "  kv_heads: " + std::to_string(kv_heads) + "\n";
  y += "  attention: eager\nbatch:\n  micro_batch: " + std::to_string(batch) + "\n";
  y += "precision:\n  params: bf16\nstep:\n  kind: generate\n";
  y += "generate:\n  prompt_len: " + std::to_string(prompt) + "\n  new_tokens: " +
       std::to_string(new_tokens) + "\n  cache: " + cache + "\n";
  return load_scenario_text(y, "llama2-generate.yaml");
}

// Bytes of the live allocations made by `op` when the Program ends.
uint64_t live_bytes_of_op(const Program& p, const std::string& op) {
  std::vector<uint8_t> live(p.tensors.size(), 0);
  std::vector<uint32_t> op_of(p.tensors.size(), 0);
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc) {
      live[e.tensor] = 1;
      op_of[e.tensor] = e.op;
    } else if (e.type == EventType::free) {
      live[e.tensor] = 0;
    }
  }
  uint64_t total = 0;
  for (size_t t = 0; t < live.size(); ++t)
    if (live[t] && p.str(op_of[t]) == op) total += p.tensors[t].bytes;
  return total;
}

}  // namespace

TEST_CASE("generate: the issue's KV formula values from a config-imported Llama-2-7B run", "[generate]") {
  // 2 x L x B x S x d x bytes at S = 4096: 2 x 32 x 4096 x 4096 x 2 = 2147483648 B (2.15 GB)
  // per sequence, 17.2 GB for eight, 0.54 GB with 8 KV heads, 0.07 GB with one.
  struct Row {
    int64_t batch, kv_heads;
    uint64_t bytes;
  };
  const Row rows[] = {{1, 0, 2147483648ull}, {8, 0, 17179869184ull}, {1, 8, 536870912ull},
                      {1, 1, 67108864ull}};
  for (const Row& r : rows) {
    INFO("batch " << r.batch << " kv_heads " << (r.kv_heads ? r.kv_heads : 32));
    {
      // StaticCache(max_cache_len = 4000 + 96): its buffers, kept on the model afterwards.
      const Scenario s = llama2_generate(r.batch, 4000, 96, "static", r.kv_heads);
      Program p;
      GenerateFacts f;
      build_generate_program(s, p, nullptr, &f);
      CHECK(f.cache_bytes_end == r.bytes);
      CHECK(f.cache_tokens_end == 4096);
      CHECK(live_bytes_of_op(p, "zeros") == r.bytes);  // the 64 buffers, read from the events
      CHECK(f.cache_bytes.front() == r.bytes);          // preallocated: full from the prefill on
    }
    {
      // DynamicCache: 4001 prompt tokens + 96 new -> 4096 cached tokens after the last forward.
      const Scenario s = llama2_generate(r.batch, 4001, 96, "dynamic", r.kv_heads);
      Program p;
      GenerateFacts f;
      build_generate_program(s, p, nullptr, &f);
      CHECK(f.cache_bytes_end == r.bytes);
      CHECK(f.cache_tokens_end == 4096);
      REQUIRE(f.cache_bytes.size() == 96);
      CHECK(f.cache_bytes.front() == r.bytes / 4096 * 4001);  // after the prefill
      for (size_t i = 1; i < f.cache_bytes.size(); ++i)       // one token per step
        CHECK(f.cache_bytes[i] - f.cache_bytes[i - 1] == r.bytes / 4096);
      // The DynamicCache dies with generate(): of the concatenations only the returned
      // sequences (B x 4097 int64) stay.
      CHECK(live_bytes_of_op(p, "cat") == static_cast<uint64_t>(r.batch) * 4097 * 8);
    }
  }
}

TEST_CASE("generate: keys it does not model or use are refused by name", "[generate]") {
  const std::string base =
      "model:\n  preset: llama2-7b\nbatch:\n  micro_batch: 2\nprecision:\n  params: bf16\n"
      "step:\n  kind: generate\ngenerate:\n  prompt_len: 16\n  new_tokens: 4\n";
  auto refused = [&](const std::string& extra, const std::string& key,
                     const std::vector<std::pair<std::string, std::string>>& sets = {}) {
    INFO(extra << " " << key);
    try {
      load_scenario_text(base + extra, "gen.yaml", sets);
      FAIL("not refused");
    } catch (const ScenarioError& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK((what.find("gen.yaml") != std::string::npos || what.find("--set") != std::string::npos));
      CHECK(what.find(key + ":") != std::string::npos);
    }
  };
  refused("", "generate.cache", {{"generate.cache", "quantized:int8"}});  // HQQ (test_generate_quantized.cpp)
  refused("", "generate.cache", {{"generate.cache", "offloaded"}});
  refused("", "model.attention", {{"generate.cache", "static"}, {"model.attention", "flash"}});
  refused("", "generate.cache", {{"generate.cache", "paged"}});  // not a cache class
  refused("optimizer:\n  type: adamw\n", "optimizer.type");
  refused("", "batch.seq_len", {{"batch.seq_len", "20"}});
  refused("", "batch.grad_accum", {{"batch.grad_accum", "2"}});
  refused("checkpoint:\n  policy: full\n", "checkpoint.policy");
  refused("lora:\n  rank: 8\n  targets: [q_proj]\n", "lora.rank");
  refused("", "step.warmup_steps", {{"step.warmup_steps", "1"}});
  refused("", "precision.autocast", {{"precision.autocast", "bf16"}});
  refused("", "parallel.data", {{"parallel.data", "2"}});
  refused("", "model.family", {{"model.preset", "gpt2-small"}});
  refused("", "model.architecture", {{"model.architecture", "gemma2"}});
  refused("", "generate.logits_to_keep", {{"generate.logits_to_keep", "-1"}});
  refused("", "generate.new_tokens", {{"model.context_length", "16"}});
  // generate.* without step.kind generate; a generate step without its lengths
  try {
    load_scenario_text(
        "model:\n  preset: llama2-7b\nbatch:\n  seq_len: 16\ngenerate:\n  prompt_len: 16\n", "gen.yaml");
    FAIL("not refused");
  } catch (const ScenarioError& e) {
    CHECK(std::string(e.what()).find("generate.prompt_len:") != std::string::npos);
  }
  try {
    load_scenario_text("model:\n  preset: llama2-7b\nstep:\n  kind: generate\n", "gen.yaml");
    FAIL("not refused");
  } catch (const ScenarioError& e) {
    CHECK(std::string(e.what()).find("generate.prompt_len:") != std::string::npos);
  }
  // The defaults load: batch.seq_len is prompt_len + new_tokens.
  Scenario s = load_scenario_text(base, "gen.yaml");
  {  // a policy set on the loaded Scenario (memsim compare --policies) is refused too
    Scenario c = s;
    c.checkpoint.policy = CheckpointPolicy::full;
    CHECK_THROWS_WITH(build_program(c), Catch::Contains("checkpoint.policy:"));
  }
  CHECK(s.batch.seq_len == 20);
  CHECK(s.generate.cache == GenerateCache::dynamic);
  CHECK(s.generate.logits_to_keep == 1);
}

TEST_CASE("generate: the shipped scenario runs and its cache is the formula's", "[generate]") {
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-generate-a100.yaml");
  Program p;
  GenerateFacts f;
  build_generate_program(s, p, nullptr, &f);
  // 2 x 32 layers x 8 x (3968 + 128 - 1) tokens x 4096 x 2 bytes
  CHECK(f.cache_bytes_end == 2ull * 32 * 8 * 4095 * 4096 * 2);
  // 6,738,415,616 bf16 parameters and LlamaRotaryEmbedding's inv_freq (64 fp32)
  CHECK(f.weights_bytes == 6738415616ull * 2 + 64 * 4);
  auto device = SimulatedDevice(s.device.capacity, s.device.cuda_context);
  const Timeline t = execute(p, s.allocator, device);
  CHECK_FALSE(t.oom.has_value());
}

TEST_CASE("memsim run on a generate scenario: the generate report, marks and an OOM", "[generate][cli]") {
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-generate-a100.yaml";
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --json - 2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["fits"] == true);
  const nlohmann::json& g = j["generate"];
  CHECK(g["prompt_len"] == 3968);
  CHECK(g["new_tokens"] == 128);
  CHECK(g["cache"] == "dynamic");
  CHECK(g["kv_cache_bytes_end"].get<uint64_t>() == 2ull * 32 * 8 * 4095 * 4096 * 2);
  CHECK(g["kv_cache_tokens_end"] == 4095);
  CHECK(g["kv_cache_bytes_per_token"].get<uint64_t>() == 2ull * 32 * 8 * 4096 * 2);
  // After the prefill the cache (3968 tokens) and the weights are live; after generate()
  // the DynamicCache is gone: weights, prompts and the returned sequences remain.
  const uint64_t weights = g["weights_bytes"];
  const uint64_t prefill = j["marks"]["prefill_end"]["allocated"];
  const uint64_t end = j["marks"]["generate_end"]["allocated"];
  CHECK(prefill > weights + 2ull * 32 * 8 * 3968 * 4096 * 2);
  CHECK(end < weights + (64ull << 20));
  // A StaticCache stays on the model after generate() (self._cache).
  const memsim_test::CommandResult st = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set generate.cache=static --json - 2>/dev/null");
  REQUIRE(st.status == 0);
  const nlohmann::json k = nlohmann::json::parse(st.out);
  CHECK(k["generate"]["kv_cache_bytes_end"].get<uint64_t>() == 2ull * 32 * 8 * 4096 * 4096 * 2);
  CHECK(k["marks"]["generate_end"]["allocated"].get<uint64_t>() >
        weights + 2ull * 32 * 8 * 4096 * 4096 * 2);
  // Twice the batch does not fit an A100: exit 3, out of memory in the prefill.
  const memsim_test::CommandResult oom = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set batch.micro_batch=16 --json - 2>/dev/null");
  CHECK(oom.status == 3);
  const nlohmann::json o = nlohmann::json::parse(oom.out);
  CHECK(o["fits"] == false);
  CHECK(o["oom"]["phase"] == "forward");
}

namespace {

// Mistral-7B from its config.json (sliding_window 4096 on every layer), bf16, greedy generate.
Scenario mistral_generate(int64_t prompt, int64_t new_tokens, const std::string& classes,
                          const std::string& attention = "eager", const std::string& cache = "dynamic") {
  std::string y = "model:\n  hf_config: " + MEMSIM_SOURCE_DIR + "/scenarios/models/mistral-7b.json\n";
  y += "  attention: " + attention + "\nbatch:\n  micro_batch: 1\n";
  y += "precision:\n  params: bf16\nstep:\n  kind: generate\n";
  y += "generate:\n  prompt_len: " + std::to_string(prompt) + "\n  new_tokens: " +
       std::to_string(new_tokens) + "\n  cache: " + cache + "\n  cache_classes: " + classes + "\n";
  y += "device:\n  capacity: 1TiB\n";
  return load_scenario_text(y, "mistral-generate.yaml");
}

}  // namespace

TEST_CASE("generate.cache_classes v5: Mistral-7B's sliding layers hold the window, not every token",
          "[generate][sliding]") {
  // One token's K and V in one layer: 2 x 8 KV heads x 128 x 2 bytes = 4096 B; 32 layers.
  const uint64_t per_token = 2ull * 8 * 128 * 2 * 32;
  {
    // A prompt of 8000 > 4096: DynamicSlidingWindowLayer keeps a view of the prefill's
    // cat output (all 8000 tokens' storage) until the first decode step's cat of the last
    // 4095 + 1 tokens replaces it; from then on each layer holds 4096 tokens.
    const Scenario s = mistral_generate(8000, 97, "v5");
    Program p;
    GenerateFacts f;
    build_generate_program(s, p, nullptr, &f);
    REQUIRE(f.cache_bytes.size() == 97);
    CHECK(f.cache_bytes.front() == per_token * 8000);
    for (size_t i = 1; i < f.cache_bytes.size(); ++i) CHECK(f.cache_bytes[i] == per_token * 4096);
    CHECK(f.cache_bytes_end == 536870912ull);  // 512 MiB: 2 x 32 x 4096 x 4096/32*8 x 2
    CHECK(f.cache_tokens_end == 4096);
    // v4.45's DynamicCache (the default) keeps all 8096 tokens (the window is in the mask only).
    const Scenario old = mistral_generate(8000, 97, "v4.45");
    Program q;
    GenerateFacts g;
    build_generate_program(old, q, nullptr, &g);
    CHECK(g.cache_bytes_end == per_token * 8096);
  }
  {
    // A prompt shorter than the window: the cache grows by one token per step until it
    // holds the window (forward k stores 4000 + k tokens: 4096 at k = 96), then stays there.
    const Scenario s = mistral_generate(4000, 120, "v5");
    Program p;
    GenerateFacts f;
    build_generate_program(s, p, nullptr, &f);
    REQUIRE(f.cache_bytes.size() == 120);
    CHECK(f.cache_bytes.front() == per_token * 4000);
    CHECK(f.cache_bytes[95] == per_token * 4095);
    CHECK(f.cache_bytes[96] == per_token * 4096);
    CHECK(f.cache_bytes.back() == per_token * 4096);
    auto device = SimulatedDevice(s.device.capacity, s.device.cuda_context);
    CHECK_FALSE(execute(p, s.allocator, device).oom.has_value());
  }
}

TEST_CASE("generate.cache_classes: values and the combinations it does not model are refused by key",
          "[generate][sliding]") {
  auto refused = [](const std::function<Scenario()>& load, const std::string& key) {
    try {
      load();
      FAIL("not refused");
    } catch (const ScenarioError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(key + ":") != std::string::npos);
    }
  };
  refused([] { return mistral_generate(16, 4, "v6"); }, "generate.cache_classes");
  refused([] { return mistral_generate(16, 4, "v5", "eager", "static"); }, "generate.cache");
  refused([] { return mistral_generate(16, 4, "v5", "sdpa"); }, "model.attention");
  refused([] { return mistral_generate(16, 4, "v5", "eager", "quantized:int4"); }, "generate.cache");
  // Gemma-2 with v4.45's classes (HybridCache) or a v5 StaticCache stays refused.
  for (const char* extra : {"", "  cache_classes: v5\n  cache: static\n"})
    refused([extra] {
      return load_scenario_text("model:\n  hf_config: " + MEMSIM_SOURCE_DIR + "/scenarios/models/gemma2-2b.json\n"
                                "  attention: eager\nstep:\n  kind: generate\ngenerate:\n  prompt_len: 8\n"
                                "  new_tokens: 2\n" + std::string(extra), "g.yaml");
    }, "model.architecture");
  // The default is v4.45's classes; v5 loads for a full-attention model.
  CHECK_FALSE(mistral_generate(16, 4, "v4.45").generate.cache_classes_v5);
  CHECK(mistral_generate(16, 4, "v5").generate.cache_classes_v5);
}

TEST_CASE("generate.cache_classes v5: StaticCache's buffers are allocated in the prefill", "[generate][sliding]") {
  // Llama-2-7B (full attention only): 5.x's StaticLayer allocates its zeros at each layer's
  // first update, not before the first forward as v4.45's StaticCache does.
  const auto first_op = [](const Program& p, const std::string& op) {
    for (size_t i = 0; i < p.events.size(); ++i)
      if (p.events[i].type == EventType::alloc && p.str(p.events[i].op) == op) return i;
    return p.events.size();
  };
  std::string y = "model:\n  hf_config: " + MEMSIM_SOURCE_DIR + "/scenarios/models/llama2-7b.json\n"
                  "  attention: eager\nbatch:\n  micro_batch: 1\nprecision:\n  params: bf16\n"
                  "step:\n  kind: generate\ngenerate:\n  prompt_len: 4000\n  new_tokens: 96\n"
                  "  cache: static\n";
  for (const bool v5 : {false, true}) {
    INFO("v5 " << v5);
    const Scenario s = load_scenario_text(y + (v5 ? "  cache_classes: v5\n" : ""), "static.yaml");
    Program p;
    GenerateFacts f;
    build_generate_program(s, p, nullptr, &f);
    CHECK(f.cache_bytes_end == 2147483648ull);  // 2 x 32 x 4096 x 4096 x 2
    CHECK(live_bytes_of_op(p, "zeros") == 2147483648ull);
    CHECK((first_op(p, "zeros") > first_op(p, "embedding")) == v5);
  }
}

TEST_CASE("memsim run: generate.cache offloaded keeps the layers in pinned host memory", "[generate][cli]") {
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/mistral-7b-generate-sliding-a100.yaml";
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set generate.cache=offloaded --json - 2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& g = j["generate"];
  CHECK(g["cache"] == "offloaded");
  CHECK(g["cache_classes"] == "v5");
  // One sliding layer's window - 1 = 4095 tokens of K and V for 4 sequences, 8 KV heads:
  // 2 x 4 x 8 x 4095 x 128 x 2 B. After the last forward layer 0 waits on the device
  // (prefetched for the next step), the other 31 are on the host.
  const uint64_t layer = 2ull * 4 * 8 * 4095 * 128 * 2;
  CHECK(g["kv_cache_bytes_end"].get<uint64_t>() == layer);
  CHECK(g["kv_cache_host_bytes_end"].get<uint64_t>() == 31 * layer);
  CHECK(g["kv_cache_host_peak_bytes"].get<uint64_t>() == 31 * layer);
  CHECK(j["host_offload_bytes"].get<uint64_t>() == 31 * layer);
  // Without offloading the device keeps every layer's window: 32 x 4096 tokens.
  const memsim_test::CommandResult d = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --json - 2>/dev/null");
  REQUIRE(d.status == 0);
  const nlohmann::json k = nlohmann::json::parse(d.out);
  CHECK(k["generate"]["kv_cache_bytes_end"].get<uint64_t>() == 2ull * 32 * 4 * 8 * 4096 * 128 * 2);
  CHECK_FALSE(k.contains("host_offload_bytes"));
  CHECK(j["marks"]["generate_end"]["allocated"].get<uint64_t>() ==
        k["marks"]["generate_end"]["allocated"].get<uint64_t>());  // the cache is gone either way
  // v4.45's OffloadedCache is refused by key.
  const memsim_test::CommandResult o = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file +
      "' --set generate.cache=offloaded --set generate.cache_classes=v4.45 2>&1");
  CHECK(o.status == 1);
  CHECK(o.out.find("generate.cache:") != std::string::npos);
}

TEST_CASE("generate.cache_classes v5: Gemma-2-2B's sliding layers hold the window, its global ones every token",
          "[generate][sliding]") {
  // 26 layers alternating sliding (window 4096) and global; one token's K and V in one
  // layer: 2 x 4 KV heads x 256 x 2 bytes = 4096 B. A prompt of 8000 + 97 new tokens: 13
  // layers end with 4096 tokens, 13 with 8096.
  const Scenario s = load_scenario_text(
      "model:\n  hf_config: " + MEMSIM_SOURCE_DIR + "/scenarios/models/gemma2-2b.json\n  attention: eager\n"
      "batch:\n  micro_batch: 1\nprecision:\n  params: bf16\nstep:\n  kind: generate\n"
      "generate:\n  prompt_len: 8000\n  new_tokens: 97\n  cache_classes: v5\ndevice:\n  capacity: 1TiB\n",
      "gemma2-generate.yaml");
  Program p;
  GenerateFacts f;
  build_generate_program(s, p, nullptr, &f);
  CHECK(f.cache_bytes.front() == 26ull * 8000 * 4096);  // after the prefill: every layer 8000
  CHECK(f.cache_bytes_end == 13ull * (4096 + 8096) * 4096);
  auto device = SimulatedDevice(s.device.capacity, s.device.cuda_context);
  CHECK_FALSE(execute(p, s.allocator, device).oom.has_value());
}
