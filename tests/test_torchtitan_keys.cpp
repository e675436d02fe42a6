// parallel.context (scenario/context_parallel_keys.h) and precision.float8
// (scenario/torchtitan_keys.h): read, checked for combinations no stack allows (exit 1
// naming the keys), then refused where not modelled (context parallelism is modelled with
// FSDP2: tests/test_context_parallel.cpp; float8 tensorwise and rowwise:
// tests/test_float8.cpp, test_float8_rowwise.cpp).
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario.h"

using namespace memsim;

namespace {

const char* kLlama =
    "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, kv_heads: 2, d_ff: 172, "
    "vocab: 96, context_length: 128, attention: flash}\n"
    "batch: {micro_batch: 1, seq_len: 96}\n"
    "precision: {params: bf16}\n";

std::string error_of(const std::vector<std::pair<std::string, std::string>>& overrides) {
  try {
    load_scenario_text(kLlama, "titan.yaml", overrides);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("parallel.context: combinations no stack allows fail first", "[torchtitan][keys]") {
  CHECK(error_of({{"parallel.context", "1"}}).empty());
  CHECK_THAT(error_of({{"parallel.context", "0"}}), Catch::Contains("parallel.context"));
  // 96 = 2 * 48: divisible by 2*4 = 8? 96 % 8 == 0; by 2*5 = 10? no.
  CHECK_THAT(error_of({{"parallel.context", "5"}}),
             Catch::Contains("parallel.context") && Catch::Contains("batch.seq_len 96") &&
                 Catch::Contains("2 x 5"));
  CHECK_THAT(error_of({{"parallel.context", "4"}, {"model.attention", "eager"}}),
             Catch::Contains("parallel.context") && Catch::Contains("model.attention eager"));
  // torchtitan shards with FSDP2 over dp_shard x cp whenever context parallelism is on.
  CHECK_THAT(error_of({{"parallel.context", "4"}}),
             Catch::Contains("parallel.sharding") && Catch::Contains("fsdp2"));
}

TEST_CASE("precision.float8: checked first, then the model's shape", "[torchtitan][keys]") {
  CHECK(error_of({{"precision.float8", "none"}}).empty());
  CHECK_THAT(error_of({{"precision.float8", "blockwise"}}),
             Catch::Contains("precision.float8") && Catch::Contains("tensorwise"));
  CHECK_THAT(error_of({{"precision.float8", "tensorwise"}, {"precision.params", "fp32"}}),
             Catch::Contains("precision.float8") && Catch::Contains("bf16") &&
                 Catch::Contains("precision.params fp32"));
  CHECK_THAT(error_of({{"precision.float8", "rowwise"}, {"precision.params", "fp16"}}),
             Catch::Contains("needs a bf16 compute dtype"));
  // rowwise is modelled (tests/test_float8_rowwise.cpp); d_ff 172 is no multiple of 16.
  CHECK_THAT(error_of({{"precision.float8", "rowwise"}}),
             Catch::Contains("model.d_model") && Catch::Contains("multiple of 16"));
  CHECK(error_of({{"precision.float8", "rowwise"}, {"model.d_ff", "176"}}).empty());
  CHECK_THAT(error_of({{"precision.float8", "tensorwise"}, {"parallel.sharding", "fsdp2"}}),
             Catch::Contains("precision.float8") && Catch::Contains("fsdp2"));
}
