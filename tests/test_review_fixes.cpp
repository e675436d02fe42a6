// Regression tests for the review findings of 2026-11-27 left open by that session and fixed
// in the next: each case names the problem it pins.
#include <catch2/catch.hpp>

#include <string>

#include "cli_test_support.h"
#include "scenario/scenario.h"
#include "test_paths.h"

namespace {

const std::string kGenerate = MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-generate-a100.yaml";
const std::string kServe = MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-vllm-h100.yaml";
const std::string kMoe = MEMSIM_SOURCE_DIR + "/scenarios/qwen3-30b-a3b-fsdp-8xh100.yaml";

std::string load_error(const std::string& path, const std::vector<std::pair<std::string, std::string>>& sets) {
  try {
    memsim::load_scenario(path, sets);
  } catch (const memsim::ScenarioError& e) {
    return e.what();
  }
  return "";
}

memsim_test::CommandResult serve(const std::string& args) {
  return memsim_test::run_shell(memsim_test::memsim_command() + "serve '" + kServe + "' " + args + " 2>&1");
}

}  // namespace

// generate ignored the model's context length: prompt_len + new_tokens past config.json's
// max_position_embeddings grew the model silently (batch.seq_len is refused the same way).
TEST_CASE("review: generate keeps to the model's context length", "[review]") {
  // 3968 + 129 tokens: 4096 fed positions fit (the last token is never fed); 3968 + 130 do not.
  CHECK(load_error(kGenerate, {{"generate.new_tokens", "129"}}).empty());
  const std::string e = load_error(kGenerate, {{"generate.new_tokens", "130"}});
  CHECK(e.rfind("--set generate.new_tokens: prompt_len + new_tokens - 1 = 4097 positions is longer than "
                "the model's context length 4096", 0) == 0);
  CHECK(e.find("set model.context_length: 4097") != std::string::npos);
  CHECK(load_error(kGenerate, {{"generate.new_tokens", "130"}, {"model.context_length", "4097"}}).empty());
}

// serve --min-tp 3 tried 1 and 2 only; --max-seqs longer than max_model_len answered a count
// for requests the engine refuses.
TEST_CASE("review: serve's inverse questions refuse what the engine would", "[review]") {
  const memsim_test::CommandResult odd = serve("--min-tp 3");
  CHECK(odd.status == 2);
  CHECK(odd.out.find("--min-tp 3: MAX must be a power of two") != std::string::npos);
  CHECK(serve("--min-tp 4 >/dev/null").status == 0);
  CHECK(serve("--min-tp >/dev/null").status == 0);
  const memsim_test::CommandResult longer = serve("--max-seqs 8193");
  CHECK(longer.status == 2);
  CHECK(longer.out.find("--max-seqs 8193: longer than serve.max_model_len 8192") != std::string::npos);
  CHECK(serve("--max-seqs 8192 >/dev/null").status == 0);
}

// The MoE rows mixed v4 attention and loss placements with transformers 5.x's MoE block, a
// model no release ran; model.transformers: 4 on them was accepted and changed nothing.
TEST_CASE("review: MoE rows are transformers 5.x throughout", "[review]") {
  const memsim::Scenario q = memsim::load_scenario(kMoe);
  const memsim::Scenario mixtral = memsim::load_scenario_text(
      "model:\n  family: hf-llama\n  architecture: mixtral\n  layers: 2\n  d_model: 64\n  heads: 4\n"
      "  kv_heads: 2\n  d_ff: 128\n  vocab: 256\n  context_length: 64\n  moe: {experts: 4, top_k: 2}\n"
      "batch:\n  micro_batch: 1\n  seq_len: 8\n",
      "mixtral.yaml");
  for (const memsim::Scenario* s : {&q, &mixtral}) {
    CHECK(s->model.arch.loss == memsim::graph::CausalLoss::pad);
    CHECK(s->model.arch.logits_float == memsim::graph::LogitsFloat::loss);
    CHECK(s->model.arch.rope == memsim::graph::RopeAt::model);
  }
  CHECK(load_error(kMoe, {{"model.transformers", "4"}})
            .rfind("--set model.transformers: 4: the qwen3_moe row is transformers 5.x's code", 0) == 0);
  CHECK(load_error(kMoe, {{"model.transformers", "5"}}).empty());
}

// `memsim completion bash` listed model.moe but none of its sub-keys.
TEST_CASE("review: completion offers model.moe's sub-keys", "[review]") {
  const memsim_test::CommandResult r =
      memsim_test::run_shell(memsim_test::memsim_command() + "completion bash 2>&1");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("model.moe.top_k") != std::string::npos);
  CHECK(r.out.find("model.moe.expert_d_ff") != std::string::npos);
}
