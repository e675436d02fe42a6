// Settings the scheduler does not model yet are refused, never silently ignored.
#include <catch2/catch.hpp>

#include <string>

#include "sim/step/schedule.h"

using namespace memsim;

namespace {
const char* kTiny =
    "model: {family: cs336, layers: 2, d_model: 64, heads: 4, d_ff: 256, vocab: 512}\n"
    "batch: {micro_batch: 2, seq_len: 32}\n"
    "device: {capacity: 1GiB}\n";

std::string refusal(const std::vector<std::pair<std::string, std::string>>& overrides) {
  Scenario s = load_scenario_text(kTiny, "tiny.yaml", overrides);
  try {
    build_program(s);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("the tiny scenario itself is simulated", "[modelled]") {
  Scenario s = load_scenario_text(kTiny, "tiny.yaml");
  CHECK_FALSE(build_program(s).events.empty());
}

TEST_CASE("parallelism, autocast and unsupported combinations are refused by key",
          "[modelled]") {
  CHECK(refusal({{"parallel.tensor", "2"}}).rfind("tiny.yaml: parallel.tensor: multi-GPU", 0) == 0);
  CHECK(refusal({{"parallel.data", "8"}}).empty());  // torch DDP (sim/parallel/data_parallel.h)
  CHECK(refusal({{"parallel.zero", "3"}}).rfind("tiny.yaml: parallel.zero: ", 0) == 0);
  // autocast: modelled for cs336 with fp32 params (graph/autocast.h), refused otherwise.
  CHECK(refusal({{"precision.autocast", "bf16"}}).empty());
  CHECK(refusal({{"precision.autocast", "bf16"}, {"precision.params", "bf16"}})
            .rfind("tiny.yaml: precision.autocast: autocast casts fp32", 0) == 0);
  CHECK(refusal({{"model.dropout", "0.1"}}).rfind("tiny.yaml: model.dropout: ", 0) == 0);
}

TEST_CASE("sharded data parallelism with LoRA, master weights or autocast is refused by key",
          "[modelled]") {
  // Autocast composes with DDP (tests/test_dp_autocast.cpp) and FSDP
  // (tests/test_fsdp_autocast.cpp); with FSDP's MixedPrecision as well only as Accelerate's
  // FSDP1 bf16 path in HF Trainer's step (tests/test_fsdp1_accelerate.cpp).
  CHECK(refusal({{"parallel.data", "8"}, {"precision.autocast", "bf16"}}).empty());
  CHECK(refusal({{"parallel.data", "8"}, {"parallel.sharding", "fsdp"}, {"precision.autocast", "bf16"}})
            .empty());
  CHECK(refusal({{"parallel.data", "8"}, {"parallel.sharding", "fsdp"}, {"precision.autocast", "bf16"},
                 {"parallel.fsdp_mixed_precision", "bf16"}})
            .find("Accelerate's FSDP1 bf16 path") != std::string::npos);
  CHECK(refusal({{"parallel.data", "8"}, {"parallel.sharding", "fsdp"},
                 {"precision.params", "bf16"}, {"precision.master_weights", "true"},
                 {"optimizer.impl", "foreach"}})
            .rfind("tiny.yaml: precision.master_weights: is modelled with torch DDP "
                   "(parallel.data > 1, parallel.sharding: none, parallel.zero: 0) but not "
                   "with FSDP", 0) == 0);
  CHECK(refusal({{"parallel.data", "8"}, {"parallel.zero", "1"}, {"precision.params", "bf16"},
                 {"precision.master_weights", "true"}, {"optimizer.impl", "foreach"}})
            .rfind("tiny.yaml: precision.master_weights: is modelled with torch DDP", 0) == 0);
  CHECK(refusal({{"parallel.data", "8"}, {"parallel.zero", "1"}, {"precision.params", "bf16"},
                 {"precision.master_weights", "true"}, {"optimizer.impl", "foreach"}})
            .find("not with ZeRO-1 (parallel.zero: 1)") != std::string::npos);
  // torch DDP with master weights is simulated (tests/test_ddp_combos.cpp; LoRA too).
  CHECK(refusal({{"parallel.data", "8"}, {"precision.params", "bf16"},
                 {"precision.master_weights", "true"}, {"optimizer.impl", "foreach"}})
            .empty());
  // Each alone is simulated.
  CHECK(refusal({{"precision.params", "bf16"}, {"precision.master_weights", "true"},
                 {"optimizer.impl", "foreach"}})
            .empty());
}
