// Combinations of the training-stack features (issue #16) that memsim does not model, found
// by running them together: each must be refused by its key (the project's rule: never
// approximate a setting silently), not run with the setting ignored.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario.h"
#include "sim/step/modelled_features.h"

using namespace memsim;

namespace {

const std::string kLlama =
    "model: { family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 1000,\n"
    "         attention: flash }\n"
    "batch: { micro_batch: 2, seq_len: 32 }\n"
    "precision: { params: bf16 }\n";

std::string error_of(const std::vector<std::pair<std::string, std::string>>& set) {
  try {
    // The reader's checks, then the scheduler's (what memsim run does before building).
    require_modelled(load_scenario_text(kLlama, "s.yaml", set));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("stack combinations: DeepSpeed ZeRO 1-3 with gradient accumulation are accepted",
          "[deepspeed][stack-refusals]") {
  // Modelled since wt/zero3ga (tests/test_deepspeed.cpp, "gradient accumulation" cases).
  std::vector<std::pair<std::string, std::string>> set = {
      {"parallel.sharding", "deepspeed"}, {"parallel.zero", "3"}, {"parallel.data", "4"},
      {"batch.grad_accum", "2"}};
  for (const char* zero : {"1", "2", "3"}) {
    set[1].second = zero;
    CHECK(error_of(set).empty());
  }
}

TEST_CASE("stack combinations: torch.compile of a no-grad forward is refused",
          "[compile][stack-refusals]") {
  CHECK(error_of({{"step.compile", "true"}, {"step.kind", "forward"}}).empty());
  CHECK_THAT(error_of({{"step.compile", "true"}, {"step.kind", "forward-no-grad"}}),
             Catch::Contains("step.kind"));
}

TEST_CASE("stack combinations: checkpoint.early_stop only where it changes something",
          "[torchtitan][stack-refusals]") {
  CHECK(error_of({{"checkpoint.policy", "full"}, {"checkpoint.early_stop", "false"}}).empty());
  CHECK_THAT(error_of({{"checkpoint.early_stop", "true"}}),
             Catch::Contains("checkpoint.early_stop: checkpoint.policy is none"));
  CHECK_THAT(error_of({{"checkpoint.policy", "full"},
                       {"checkpoint.reentrant", "true"},
                       {"checkpoint.early_stop", "false"}}),
             Catch::Contains("checkpoint.early_stop: early_stop is an option of non-reentrant"));
}

TEST_CASE("stack combinations: the torchtitan / torchtune rows refuse what their loops lack",
          "[implementation][stack-refusals]") {
  for (const char* impl : {"torchtitan", "torchtune"}) {
    INFO(impl);
    const std::pair<std::string, std::string> row = {"model.implementation", impl};
    CHECK(error_of({row}).empty());
    CHECK_THAT(error_of({row, {"parallel.data", "2"}, {"parallel.zero", "1"}}),
               Catch::Contains("parallel.zero"));
    CHECK_THAT(error_of({row, {"precision.master_weights", "true"}}),
               Catch::Contains("precision.master_weights"));
    CHECK_THAT(error_of({row, {"optimizer.type", "adafactor"}}), Catch::Contains("optimizer.type"));
    CHECK_THAT(error_of({row, {"optimizer.impl", "out-of-place"}}),
               Catch::Contains("optimizer.impl"));
  }
}

TEST_CASE("hf-gpt2 with SDPA is refused by key, not by a runtime error in the build",
          "[stack-refusals]") {
  const std::string gpt2 =
      "model: { family: hf-gpt2, layers: 2, d_model: 64, heads: 4, d_ff: 256, vocab: 1000 }\n"
      "batch: { micro_batch: 2, seq_len: 32 }\n";
  CHECK_NOTHROW(require_modelled(load_scenario_text(gpt2, "g.yaml")));
  CHECK_THROWS_WITH(
      require_modelled(load_scenario_text(gpt2, "g.yaml", {{"model.attention", "flash"}})),
      Catch::Contains("model.attention: hf-gpt2 is modelled with eager attention only"));
}
