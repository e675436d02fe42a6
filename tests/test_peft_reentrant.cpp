// LoRA with activation checkpointing and PEFT's enable_input_require_grads hook
// (lora.input_require_grads, scenario/peft_input_grads_key.h; Runtime::requires_grad_),
// against tests/data/torch_cpu/peft_checkpoint_hf_llama.json
// (tools/fixtures/gen_peft_reentrant_fixtures.py: torch 1.13 on CPU, the hf-llama stand-in,
// 4 layers, LoRA r 8 on q_proj/v_proj, fp32): every policy with use_reentrant False (hook
// off and on) and True (hook on, HF's gradient_checkpointing_enable() default). Live bytes
// before the forward, at its end, after backward (logits and loss still bound: the graph,
// and with it the hooked embedding output and its .grad, alive) and the step's peak.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "scenario/peft_input_grads_key.h"
#include "scenario/scenario_checkpoint.h"
#include "sim/step/schedule.h"
#include "step_measure_test_support.h"

using namespace memsim;

namespace {

Scenario fixture_scenario(const nlohmann::json& fx) {
  Scenario s;
  s.optimizer.type = OptimizerType::none;
  s.step.warmup_steps = 0;
  s.device.cublas_workspace = 0;
  s.device.kernel_scratch = false;
  memsim_test::apply_hf_fixture_config(s, "hf-llama", fx["config"]);
  s.lora.rank = fx["lora"]["rank"];
  s.lora.alpha = fx["lora"]["alpha"];
  for (const auto& t : fx["lora"]["targets"]) s.lora.targets.push_back(t.get<std::string>());
  return s;
}

}  // namespace

TEST_CASE("peft: LoRA checkpointing with enable_input_require_grads matches torch", "[peft-reentrant]") {
  const nlohmann::json fx = memsim_test::load_torch_cpu_fixture("peft_checkpoint_hf_llama.json");
  const Scenario s = fixture_scenario(fx);
  for (const nlohmann::json& row : fx["policies"]) {
    const std::string policy = row["policy"];
    const bool reentrant = row["reentrant"], hook = row["input_require_grads"];
    INFO("policy " << policy << (reentrant ? " reentrant" : "") << (hook ? " hook" : ""));
    CHECK(row["adapters_with_grad"].get<int>() == 16);  // 4 layers x q/v x A/B: all trained
    Scenario sp = s;
    sp.checkpoint = parse_policy(policy);
    if (reentrant) sp.checkpoint.reentrant = true;
    sp.lora.input_require_grads = hook;
    CHECK(lora_input_require_grads(sp) == hook);
    TrainingScript script = default_script(sp);
    script.checkpoint_early_stop = fx["early_stop"];
    const memsim_test::StepMeasure m = memsim_test::measure_step(build_program(sp, script));
    CHECK(m.before_forward == row["before_forward"].get<uint64_t>());
    CHECK(m.forward_end == row["live_at_forward_end"].get<uint64_t>());
    CHECK(m.peak == row["step_peak"].get<uint64_t>());
    // Exact: the reentrant node's ctx.inputs keeps the (cos, sin) tuple after backward
    // (graph/checkpoint.h), except under `selective`, whose region gets none.
    CHECK(m.after_backward == row["after_backward"].get<uint64_t>());
  }
  // torch refuses the reentrant step without the hook (nothing requires grad).
  CHECK(fx["full_reentrant_without_hook"].get<std::string>().find("does not require grad") !=
        std::string::npos);
}

TEST_CASE("peft: the hook keeps the embedding output and its grad until the graph dies",
          "[peft-reentrant]") {
  const std::string text =
      "model: { family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 1000 }\n"
      "batch: { micro_batch: 2, seq_len: 32 }\n"
      "precision: { params: bf16 }\n"
      "optimizer: { type: adamw, impl: foreach }\n"
      "lora: { rank: 8, targets: [q_proj, v_proj] }\n"
      "checkpoint: { policy: full }\n";
  auto measure = [&](std::vector<std::pair<std::string, std::string>> set) {
    return memsim_test::measure_step(build_program(load_scenario_text(text, "peft.yaml", set)));
  };
  const uint64_t embeds = 2 * 32 * 64 * 2;  // (B, S, D) bf16
  const auto off = measure({});
  const auto on = measure({{"lora.input_require_grads", "true"}});
  // inputs_embeds and its .grad outlive backward (the logits keep the graph).
  CHECK(on.after_backward - off.after_backward == 2 * embeds);
  // The default with reentrant checkpointing is the hook on.
  const auto reentrant = measure({{"checkpoint.reentrant", "true"}});
  const auto reentrant_on =
      measure({{"checkpoint.reentrant", "true"}, {"lora.input_require_grads", "true"}});
  CHECK(reentrant.after_backward == reentrant_on.after_backward);
  CHECK(reentrant.peak == reentrant_on.peak);
  // step.keep_output false: the graph dies at the iteration's end, and with it the two.
  const auto dropped = measure({{"lora.input_require_grads", "true"}, {"step.keep_output", "false"}});
  CHECK(on.before_forward - dropped.before_forward >= 2 * embeds);
}

TEST_CASE("peft: lora.input_require_grads refusals name the key", "[peft-reentrant]") {
  const std::string text =
      "model: { family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 1000 }\n"
      "batch: { micro_batch: 2, seq_len: 32 }\n"
      "checkpoint: { policy: full, reentrant: true }\n";
  auto error_of = [&](std::vector<std::pair<std::string, std::string>> set) -> std::string {
    try {
      (void)build_program(load_scenario_text(text, "bad.yaml", set));
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error_of({{"lora.input_require_grads", "true"}}),
             Catch::Contains("lora.rank"));  // a lora section needs its rank
  CHECK_THAT(error_of({{"lora.rank", "8"}, {"lora.targets", "q_proj"},
                       {"lora.input_require_grads", "false"}}),
             Catch::Contains("lora.input_require_grads"));
  CHECK(error_of({{"lora.rank", "8"}, {"lora.targets", "q_proj"}}).empty());
}
