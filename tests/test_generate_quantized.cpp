// generate.cache quantized:int4 / quantized:int2 (transformers' QuantizedCache with the
// optimum-quanto backend; graph/models/quanto_kv.h, graph/models/kv_cache.h,
// docs/generate.md "Quantized caches"). The CPU fixtures (tests/data/generate/*_quantized_*)
// run in test_generate.cpp's fixture case with every other generate fixture; here:
//  - the cache of a config-imported Llama-2-7B run against the packing arithmetic (packed
//    data ceil(G / (8 / nbits)) x q_group_size bytes, a bf16 scale and shift per group, the
//    residual in bf16), step by step, with and without a re-quantization;
//  - memsim run on the shipped scenario (JSON `quantization`, the cache bytes, fits);
//  - the refusals by key.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.h"
#include "scenario/scenario.h"
#include "sim/step/event_budget.h"
#include "sim/step/generate.h"
#include "test_paths.h"

using namespace memsim;

namespace {

Scenario llama2_quantized(const std::string& extra, int64_t batch = 8, int64_t prompt = 3968,
                          int64_t new_tokens = 128) {
  std::string y = "model:\n  hf_config: " + MEMSIM_SOURCE_DIR + "/scenarios/models/llama2-7b.json\n";
  y += "  attention: eager\nbatch:\n  micro_batch: " + std::to_string(batch) + "\n";
  y += "precision:\n  params: bf16\nstep:\n  kind: generate\n";
  y += "generate:\n  prompt_len: " + std::to_string(prompt) + "\n  new_tokens: " + std::to_string(new_tokens) +
       "\n" + extra;
  y += "device:\n  capacity: 1TiB\n";
  return load_scenario_text(y, "llama2-quantized.yaml");
}

// What one quantized (B=8, KV 32 x hd 128, T tokens) K or V keeps, written out: G = n / 64
// groups; int4 packs two groups' rows per byte row of 64; scale and shift bf16 per group.
uint64_t kept(uint64_t tokens, uint64_t bits = 4, uint64_t group = 64) {
  const uint64_t n = 8ull * 32 * 128 * tokens;
  const uint64_t G = n / group, per_byte = 8 / bits;
  return (G + per_byte - 1) / per_byte * group + 2 * G * 2;
}
constexpr uint64_t kResidualToken = 8ull * 32 * 128 * 2;  // one token of K (or V), bf16

}  // namespace

TEST_CASE("quantized:int4: Llama-2-7B's cache is the packed prompt plus the bf16 residual", "[generate][quantized]") {
  const Scenario s = llama2_quantized("  cache: quantized:int4\n");
  CHECK(s.generate.q_group_size == 64);
  CHECK(s.generate.residual_length == 128);
  Program p;
  GenerateFacts f;
  build_generate_program(s, p, nullptr, &f);
  // The prefill quantizes the 3968 prompt tokens; the 127 decode steps each append one token
  // to the residual (128 - 1 at most: never full here).
  CHECK(kept(3968) == 73138176ull);
  REQUIRE(f.cache_bytes.size() == 128);
  CHECK(f.cache_bytes.front() == 32 * 2 * kept(3968));
  for (size_t i = 1; i < f.cache_bytes.size(); ++i)
    CHECK(f.cache_bytes[i] - f.cache_bytes[i - 1] == 32 * 2 * kResidualToken);
  CHECK(f.cache_bytes_end == 5213519872ull);  // 32 x 2 x (73,138,176 + 127 x 65,536)
  CHECK(f.cache_tokens_end == 4095);
  // against 17,171,480,576 B for the DynamicCache of the same run (test_generate.cpp)
  CHECK(f.cache_bytes_end * 3 < 2ull * 32 * 8 * 4095 * 4096 * 2);
}

TEST_CASE("quantized: a full residual re-quantizes the whole cache", "[generate][quantized]") {
  // residual_length 32: the residual grows to 31 tokens, then at the 32nd decode step the
  // returned 3968 + 31 + 1 = 4000 tokens are quantized whole and the residual emptied.
  const Scenario s = llama2_quantized("  cache: quantized:int4\n  residual_length: 32\n");
  Program p;
  GenerateFacts f;
  build_generate_program(s, p, nullptr, &f);
  REQUIRE(f.cache_bytes.size() == 128);
  CHECK(f.cache_bytes[31] == 32 * 2 * (kept(3968) + 31 * kResidualToken));
  CHECK(f.cache_bytes[32] == 32 * 2 * kept(4000));
  CHECK(f.cache_bytes[32] == 4718592000ull);
  CHECK(f.cache_bytes[33] == 32 * 2 * (kept(4000) + kResidualToken));
  CHECK(f.cache_bytes[64] == 32 * 2 * kept(4032));  // every 32 steps
  // 127 steps: re-quantized at 32, 64, 96 -> 4064 quantized, 31 in the residual
  CHECK(f.cache_bytes_end == 32 * 2 * (kept(4064) + 31 * kResidualToken));
  CHECK(f.cache_tokens_end == 4095);
  CHECK(p.events.size() <= estimated_events(s));  // the event budget's estimate bounds the run
  {
    // residual_length 0 (as 1 and 2): the whole cache re-quantized at every second decode step
    // (after a re-quantization the residual is the 1-D zeros(0) again: the next step appends)
    const Scenario s0 = llama2_quantized("  cache: quantized:int4\n  residual_length: 0\n", 8, 3968, 32);
    Program p0;
    GenerateFacts f0;
    build_generate_program(s0, p0, nullptr, &f0);
    CHECK(f0.cache_bytes[1] == 32 * 2 * (kept(3968) + kResidualToken));  // 1-D residual: appended
    CHECK(f0.cache_bytes[2] == 32 * 2 * kept(3970));
    CHECK(f0.cache_bytes[3] == 32 * 2 * (kept(3970) + kResidualToken));
    CHECK(p0.events.size() <= estimated_events(s0));
  }
  // 2 bits and a group of 128: a quarter byte per element, a scale and shift per 128
  const Scenario s2 = llama2_quantized("  cache: quantized:int2\n  q_group_size: 128\n");
  Program p2;
  GenerateFacts f2;
  build_generate_program(s2, p2, nullptr, &f2);
  CHECK(f2.cache_bytes.front() == 32 * 2 * kept(3968, 2, 128));
  CHECK(kept(3968, 2, 128) == 32505856ull + 4063232ull);
}

TEST_CASE("memsim run: the shipped quantized-int4 scenario", "[generate][quantized][cli]") {
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-generate-quantized-int4.yaml";
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --json - 2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["fits"] == true);
  const nlohmann::json& g = j["generate"];
  CHECK(g["cache"] == "quantized:int4");
  CHECK(g["kv_cache_bytes_end"].get<uint64_t>() == 5213519872ull);
  CHECK(g["kv_cache_tokens_end"] == 4095);
  CHECK(g["quantization"]["backend"] == "quanto");
  CHECK(g["quantization"]["nbits"] == 4);
  CHECK(g["quantization"]["q_group_size"] == 64);
  CHECK(g["quantization"]["residual_length"] == 128);
  // The cache dies with generate(): the end is the weights, prompts and sequences.
  const uint64_t weights = g["weights_bytes"];
  CHECK(j["marks"]["generate_end"]["allocated"].get<uint64_t>() < weights + (64ull << 20));
  // After the prefill: the weights and the quantized prompt (the states themselves are gone).
  const uint64_t prefill = j["marks"]["prefill_end"]["allocated"];
  CHECK(prefill > weights + 32 * 2 * kept(3968));
  CHECK(prefill < weights + 32 * 2 * kept(3968) + (1ull << 30));
  // --set generate.cache=quantized:int2 and the cache_config keys work from the command line
  const memsim_test::CommandResult r2 = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file +
      "' --set generate.cache=quantized:int2 --set generate.residual_length=16 --json - 2>/dev/null");
  REQUIRE(r2.status == 0);
  const nlohmann::json k = nlohmann::json::parse(r2.out);
  CHECK(k["generate"]["quantization"]["nbits"] == 2);
  CHECK(k["generate"]["kv_cache_bytes_end"].get<uint64_t>() < g["kv_cache_bytes_end"].get<uint64_t>());
}

TEST_CASE("quantized caches: what is not modelled is refused by key", "[generate][quantized]") {
  auto refused = [](const std::string& extra, const std::string& key, const std::string& why) {
    INFO(extra);
    try {
      llama2_quantized(extra, 1, 16, 4);
      FAIL("not refused");
    } catch (const ScenarioError& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find("llama2-quantized.yaml:") != std::string::npos);
      CHECK(what.find(key + ":") != std::string::npos);
      CHECK(what.find(why) != std::string::npos);
    }
  };
  refused("  cache: quantized:int8\n", "generate.cache", "HQQ");
  refused("  cache: quantized:int4\n  q_group_size: 96\n", "generate.q_group_size", "divide");
  refused("  cache: quantized:int4\n  q_group_size: 0\n", "generate.q_group_size", "");
  refused("  cache: quantized:int4\n  residual_length: -1\n", "generate.residual_length", "");
  refused("  cache: dynamic\n  residual_length: 64\n", "generate.residual_length", "quantized");
  refused("  q_group_size: 32\n", "generate.q_group_size", "quantized");
  // defaults and an explicit cache_config load
  const Scenario s = llama2_quantized("  cache: quantized:int2\n  q_group_size: 32\n  residual_length: 0\n", 1, 16, 4);
  CHECK(s.generate.cache == GenerateCache::quantized_int2);
  CHECK(s.generate.q_group_size == 32);
  CHECK(s.generate.residual_length == 0);
}
