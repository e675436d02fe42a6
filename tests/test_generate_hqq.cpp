// generate.cache quantized:int8: transformers 5.x's QuantizedCache with the HQQ backend
// (graph/models/hqq_kv.h, docs/generate.md "HQQ (quantized:int8)"). The CPU fixtures
// tests/data/generate/*_quantized_int8_* (HqqQuantizedCacheStandIn, the optimizer loop stopped
// after its second iteration) run allocation by allocation in test_generate.cpp's fixture case;
// here:
//  - the same Llama run with the loop stopped after 5 iterations
//    (tests/data/generate_hqq/*_it5.json): more events, the same peak, live bytes and end, so
//    memsim's two iterations stand for any count the data stops at;
//  - torch.cuda.empty_cache(): three events per quantize, and what they do to reserved (the
//    same program with them removed keeps more reserved; allocated is unchanged);
//  - Llama-2-7B's cache bytes against the arithmetic (W_q one byte per element, scale and zero
//    bf16 per group, the residual bf16), memsim run with --set generate.cache=quantized:int8;
//  - the refusals by key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_support.h"
#include "json_test_support.h"
#include "scenario/scenario.h"
#include "sim/step/event_budget.h"
#include "sim/step/execute.h"
#include "sim/step/generate.h"
#include "test_paths.h"

using namespace memsim;

namespace {

struct FixtureWalk {
  int64_t peak = 0, end = 0;
  size_t events = 0;
};

FixtureWalk walk(const nlohmann::json& fx) {
  FixtureWalk w;
  int64_t live = 0;
  for (const auto& e : fx["events"]) {
    live += (e[0] == "alloc" ? 1 : -1) * e[2].get<int64_t>();
    w.peak = std::max(w.peak, live);
  }
  w.end = live;
  w.events = fx["events"].size();
  return w;
}

Scenario llama2_hqq(const std::string& extra, int64_t prompt = 3968, int64_t new_tokens = 128) {
  std::string y = "model:\n  hf_config: " + MEMSIM_SOURCE_DIR + "/scenarios/models/llama2-7b.json\n";
  y += "  attention: eager\nbatch:\n  micro_batch: 8\nprecision:\n  params: bf16\nstep:\n  kind: generate\n";
  y += "generate:\n  prompt_len: " + std::to_string(prompt) + "\n  new_tokens: " + std::to_string(new_tokens) +
       "\n" + extra + "device:\n  capacity: 1TiB\n";
  return load_scenario_text(y, "llama2-hqq.yaml");
}

// One quantized K or V of Llama-2-7B (B 8, KV 32 x hd 128, T tokens), HQQ 8 bits, group 64:
// W_q n bytes, scale and zero bf16 per group.
uint64_t hqq_kept(uint64_t tokens) {
  const uint64_t n = 8ull * 32 * 128 * tokens;
  return n + 2 * (n / 64) * 2;
}
constexpr uint64_t kResidualToken = 8ull * 32 * 128 * 2;

}  // namespace

TEST_CASE("quantized:int8 (HQQ): the optimizer's iteration count changes no byte alive", "[generate][hqq]") {
  const nlohmann::json two = memsim_test::load_json(MEMSIM_SOURCE_DIR + "/tests/data/generate/llama_quantized_int8_v5_r3_g32_s12_n6_b2.json");
  const nlohmann::json five = memsim_test::load_json(
      MEMSIM_SOURCE_DIR + "/tests/data/generate_hqq/llama_quantized_int8_v5_r3_g32_s12_n6_b2_it5.json");
  CHECK_FALSE(two["config"].contains("hqq_stop_after"));  // the stand-in's default: 2
  CHECK(five["config"]["hqq_stop_after"] == 5);
  const FixtureWalk a = walk(two), b = walk(five);
  // 3 more iterations x 19 allocations and 19 frees each x (prefill: 2 layers x K, V;
  // one re-quantization: 2 x 2) quantize calls
  CHECK(b.events - a.events == 3u * 38 * 8);
  CHECK(a.peak == b.peak);
  CHECK(a.end == b.end);
  CHECK(two["peak_live_bytes"] == five["peak_live_bytes"]);
  CHECK(two["cache_bytes"] == five["cache_bytes"]);
  // and memsim's program (two iterations) has that peak: test_generate.cpp matches `two`
  // allocation by allocation.
}

TEST_CASE("quantized:int8 (HQQ): three empty_cache per quantize release reserved memory", "[generate][hqq]") {
  const Scenario s = llama2_hqq("  cache: quantized:int8\n  cache_classes: v5\n", 256, 8);
  Program p;
  GenerateFacts f;
  build_generate_program(s, p, nullptr, &f);
  size_t empties = 0;
  for (const MemoryEvent& e : p.events) empties += e.type == EventType::empty_cache ? 1 : 0;
  // The prefill quantizes K and V of 32 layers; 7 decode steps never fill the 128 residual.
  CHECK(empties == 3u * 2 * 32);
  Program kept = p;
  kept.events.erase(std::remove_if(kept.events.begin(), kept.events.end(),
                                   [](const MemoryEvent& e) { return e.type == EventType::empty_cache; }),
                    kept.events.end());
  auto device = SimulatedDevice(s.device.capacity, s.device.cuda_context);
  const Timeline with = execute(p, s.allocator, device);
  auto device2 = SimulatedDevice(s.device.capacity, s.device.cuda_context);
  const Timeline without = execute(kept, s.allocator, device2);
  REQUIRE_FALSE(with.oom.has_value());
  REQUIRE_FALSE(without.oom.has_value());
  CHECK(*std::max_element(with.allocated.begin(), with.allocated.end()) ==
        *std::max_element(without.allocated.begin(), without.allocated.end()));
  CHECK(with.allocated.back() == without.allocated.back());
  // Each empty_cache releases the cached segments the quantizer's temporaries left: reserved
  // drops at the event (allocated does not), which the program without them never does.
  size_t released = 0;
  for (size_t i = 1; i < p.events.size(); ++i) {
    if (p.events[i].type != EventType::empty_cache) continue;
    CHECK(with.allocated[i] == with.allocated[i - 1]);
    released += with.reserved[i] < with.reserved[i - 1] ? 1 : 0;
  }
  CHECK(released == empties);
  CHECK(*std::max_element(with.reserved.begin(), with.reserved.end()) <=
        *std::max_element(without.reserved.begin(), without.reserved.end()));
}

TEST_CASE("quantized:int8 (HQQ): Llama-2-7B's cache is W_q, bf16 scale and zero, and the residual",
          "[generate][hqq]") {
  const Scenario s = llama2_hqq("  cache: quantized:int8\n  cache_classes: v5\n");
  Program p;
  GenerateFacts f;
  build_generate_program(s, p, nullptr, &f);
  CHECK(hqq_kept(3968) == 130023424ull + 8126464ull);
  REQUIRE(f.cache_bytes.size() == 128);
  CHECK(f.cache_bytes.front() == 32 * 2 * hqq_kept(3968));
  for (size_t i = 1; i < f.cache_bytes.size(); ++i)
    CHECK(f.cache_bytes[i] == 32 * 2 * (hqq_kept(3968) + i * kResidualToken));
  CHECK(f.cache_bytes_end == 9374269440ull);
  // residual_length 32: the whole cache re-quantized at decode step 32 (31 residual tokens)
  const Scenario s2 = llama2_hqq("  cache: quantized:int8\n  cache_classes: v5\n  residual_length: 32\n", 3968, 40);
  Program p2;
  GenerateFacts f2;
  build_generate_program(s2, p2, nullptr, &f2);
  REQUIRE(f2.cache_bytes.size() == 40);
  CHECK(f2.cache_bytes[31] == 32 * 2 * (hqq_kept(3968) + 31 * kResidualToken));
  CHECK(f2.cache_bytes[32] == 32 * 2 * hqq_kept(3968 + 32));
}

TEST_CASE("quantized:int8 (HQQ): the event estimate bounds a re-quantization every second step", "[generate][hqq]") {
  // residual_length 0: every second decode step re-quantizes K and V of every layer (the most
  // quantize calls a run can make); 242 events per layer and token measured, 300 estimated.
  const Scenario s = llama2_hqq("  cache: quantized:int8\n  cache_classes: v5\n  residual_length: 0\n", 64, 16);
  Program p;
  build_generate_program(s, p);
  CHECK(p.events.size() <= estimated_events(s));
  CHECK(p.events.size() * 3 >= estimated_events(s) * 2);  // and not far above it
}

TEST_CASE("memsim run: the quantized-int4 scenario with --set generate.cache=quantized:int8", "[generate][hqq][cli]") {
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-generate-quantized-int4.yaml";
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file +
      "' --set generate.cache=quantized:int8 --set generate.cache_classes=v5 --json - 2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& g = j["generate"];
  CHECK(g["cache"] == "quantized:int8");
  CHECK(g["quantization"]["backend"] == "hqq");
  CHECK(g["quantization"]["nbits"] == 8);
  CHECK(g["kv_cache_bytes_end"].get<uint64_t>() == 9374269440ull);
  CHECK(g["kv_cache_tokens_end"] == 4095);
  // v4.45's classes: refused by key (its HQQQuantizedCache's device and compute_dtype)
  const memsim_test::CommandResult r2 = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set generate.cache=quantized:int8 2>&1");
  CHECK(r2.status == 1);
  CHECK(r2.out.find("generate.cache:") != std::string::npos);
  CHECK(r2.out.find("cache_classes: v5") != std::string::npos);
}

TEST_CASE("quantized:int8 (HQQ): what is not modelled is refused by key", "[generate][hqq]") {
  auto refused = [](const std::string& extra, const std::string& key, const std::string& why) {
    INFO(extra);
    try {
      llama2_hqq(extra, 16, 4);
      FAIL("not refused");
    } catch (const ScenarioError& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find("llama2-hqq.yaml:") != std::string::npos);
      CHECK(what.find(key + ":") != std::string::npos);
      CHECK(what.find(why) != std::string::npos);
    }
  };
  refused("  cache: quantized:int8\n", "generate.cache", "HQQ");  // v4.45 classes
  refused("  cache: quantized:int8\n  cache_classes: v5\n  q_group_size: 96\n", "generate.q_group_size", "divide");
  const Scenario s = llama2_hqq("  cache: quantized:int8\n  cache_classes: v5\n  q_group_size: 32\n  residual_length: 0\n",
                                16, 4);
  CHECK(s.generate.cache == GenerateCache::quantized_int8);
  CHECK(s.generate.q_group_size == 32);
  CHECK(s.generate.residual_length == 0);
}
