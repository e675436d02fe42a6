// lora.prepare_kbit: PEFT's prepare_model_for_kbit_training (scenario/peft_kbit_key.h).
//  - the key alone gives what the function turns on: every decoder layer checkpointed,
//    reentrant (transformers' gradient_checkpointing_enable() default), the
//    enable_input_require_grads hook; checkpoint.reentrant false / checkpoint.policy none
//    are the function's gradient_checkpointing_kwargs / use_gradient_checkpointing=False;
//  - the same program, event for event, as the scenario that spells those keys out (the
//    upcast is a no-op on fp32 parameters); against real PyTorch in tests/test_moe_qlora.cpp
//    (fixture qlora_qwen3_moe_l2_e4_k2_fp32_attn_r8_sgd_prepare_kbit);
//  - refusals by key: no nf4 base, no LoRA, a checkpoint policy other than full or none, a
//    non-boolean (bf16/fp16 loads: tests/test_qlora_dtype.cpp).
#include <catch2/catch.hpp>

#include <string>

#include "scenario/peft_input_grads_key.h"
#include "scenario/scenario.h"
#include "scenario_error_test_support.h"
#include "sim/step/schedule.h"

using namespace memsim;
using memsim_test::scenario_error;

namespace {

const std::string kModel =
    "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 160, vocab: 128, "
    "attention: eager}\n"
    "batch: {micro_batch: 2, seq_len: 32}\n"
    "optimizer: {type: adamw, impl: foreach}\n"
    "device: {capacity: 1GiB}\n";

std::string yaml(const std::string& params, const std::string& lora, const std::string& rest = "") {
  return kModel + "precision: {params: " + params + "}\n" + "lora: {rank: 4, alpha: 8, targets: all-linear" +
         lora + "}\n" + rest;
}

}  // namespace

TEST_CASE("lora.prepare_kbit turns on HF's gradient checkpointing and PEFT's hook", "[peft-kbit]") {
  const Scenario s = load_scenario_text(yaml("fp32", ", base_dtype: nf4, prepare_kbit: true"), "k.yaml");
  CHECK(s.checkpoint.policy == CheckpointPolicy::full);
  CHECK(s.checkpoint.reentrant == std::optional<bool>(true));
  CHECK(lora_input_require_grads(s));
  CHECK(s.lora.base_nf4);

  // gradient_checkpointing_kwargs={"use_reentrant": False}: no hook (PEFT skips it).
  const Scenario nr = load_scenario_text(
      yaml("fp32", ", base_dtype: nf4, prepare_kbit: true", "checkpoint: {reentrant: false}\n"), "k.yaml");
  CHECK(nr.checkpoint.policy == CheckpointPolicy::full);
  CHECK(nr.checkpoint.reentrant == std::optional<bool>(false));
  CHECK_FALSE(lora_input_require_grads(nr));

  // use_gradient_checkpointing=False: the cast and the freeze only.
  const Scenario none = load_scenario_text(
      yaml("fp32", ", base_dtype: nf4, prepare_kbit: true", "checkpoint: {policy: none}\n"), "k.yaml");
  CHECK(none.checkpoint.policy == CheckpointPolicy::none);
  CHECK_FALSE(none.checkpoint.reentrant.has_value());
  CHECK_FALSE(lora_input_require_grads(none));

  // false: nothing changes.
  const Scenario off = load_scenario_text(yaml("fp32", ", base_dtype: nf4, prepare_kbit: false"), "k.yaml");
  CHECK(off.checkpoint.policy == CheckpointPolicy::none);
  CHECK_FALSE(lora_input_require_grads(off));

  // From --set as well.
  const Scenario set = load_scenario_text(yaml("fp32", ", base_dtype: nf4"), "k.yaml", {{"lora.prepare_kbit", "true"}});
  CHECK(set.checkpoint.policy == CheckpointPolicy::full);
  CHECK(lora_input_require_grads(set));
}

TEST_CASE("lora.prepare_kbit on fp32 is the spelled-out reentrant QLoRA program", "[peft-kbit]") {
  const Scenario prepared = load_scenario_text(yaml("fp32", ", base_dtype: nf4, prepare_kbit: true"), "k.yaml");
  const Scenario spelled = load_scenario_text(
      yaml("fp32", ", base_dtype: nf4, input_require_grads: true", "checkpoint: {policy: full, reentrant: true}\n"),
      "k.yaml");
  const Program a = build_program(prepared), b = build_program(spelled);
  REQUIRE(a.events.size() == b.events.size());
  size_t same = 0;
  for (size_t i = 0; i < a.events.size(); ++i)
    same += a.events[i].type == b.events[i].type && a.events[i].bytes == b.events[i].bytes &&
            a.events[i].phase == b.events[i].phase;
  CHECK(same == a.events.size());
  // And it differs from the unprepared QLoRA (no checkpointing).
  const Program plain = build_program(load_scenario_text(yaml("fp32", ", base_dtype: nf4"), "k.yaml"));
  CHECK(plain.events.size() != a.events.size());
}

TEST_CASE("lora.prepare_kbit refuses what it does not model, by key", "[peft-kbit]") {
  // bf16 / fp16 loads are modelled since issue #15 item 5 (the fp32 upcast at setup:
  // tests/test_qlora_dtype.cpp).
  CHECK(load_scenario_text(yaml("bf16", ", base_dtype: nf4, prepare_kbit: true"), "k.yaml").lora.prepare_kbit);
  CHECK(load_scenario_text(yaml("fp16", ", base_dtype: nf4, prepare_kbit: true"), "k.yaml").lora.prepare_kbit);
  const std::string no_nf4 = scenario_error(yaml("fp32", ", prepare_kbit: true"), "k.yaml");
  CHECK_THAT(no_nf4, Catch::Contains("lora.prepare_kbit"));
  CHECK_THAT(no_nf4, Catch::Contains("nf4"));
  const std::string no_lora = scenario_error(kModel + "precision: {params: fp32}\nlora: {prepare_kbit: true}\n", "k.yaml");
  CHECK_THAT(no_lora, Catch::Contains("lora"));
  CHECK_FALSE(no_lora.empty());
  const std::string policy = scenario_error(
      yaml("fp32", ", base_dtype: nf4, prepare_kbit: true", "checkpoint: {policy: uniform:2}\n"), "k.yaml");
  CHECK_THAT(policy, Catch::Contains("checkpoint.policy"));
  CHECK_THAT(policy, Catch::Contains("prepare_kbit"));
  CHECK_THAT(scenario_error(yaml("fp32", ", base_dtype: nf4, prepare_kbit: maybe"), "k.yaml"),
             Catch::Contains("lora.prepare_kbit"));
}
