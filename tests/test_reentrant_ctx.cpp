// What a reentrant checkpoint's node keeps until its graph dies (graph/checkpoint.h,
// docs/hf-trainer.md "Reentrant checkpointing's ctx"), end to end from scenario text: the
// same scenario with checkpoint.reentrant true and false, the difference in live bytes at
// the measured step's marks. torch's CheckpointFunction keeps non-tensor arguments in
// ctx.inputs (v4's (cos, sin) tuple) and transformers 5.x's keyword arguments in
// ctx.run_function (GradientCheckpointingLayer's partial: mask, (cos, sin), position_ids);
// both outlive backward and die with the graph: at the next `loss =` (the previous step's
// graph lives through this step's forward), or at the iteration's end with
// step.keep_output false. The byte-exact checks against torch are the CPU fixtures'
// (tests/test_checkpoint_fixtures.cpp, test_trainer_autocast.cpp, test_peft_reentrant.cpp,
// test_moe_lora.cpp); this file pins the lifetime and which arguments count.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "step_measure_test_support.h"

using namespace memsim;

namespace {

using Sets = std::vector<std::pair<std::string, std::string>>;

// fp32 Llama, 2 layers, head_dim 16, batch 2 x 32: one (cos, sin) table pair is
// 2 x (1, 32, 16) fp32 = 4096 B; position_ids (1, 32) int64 = 256 B.
const char* kText =
    "model: { family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 1000 }\n"
    "batch: { micro_batch: 2, seq_len: 32 }\n"
    "precision: { params: fp32 }\n"
    "optimizer: { type: adamw, impl: foreach }\n"
    "step: { warmup_steps: 1 }\n"
    "checkpoint: { policy: full }\n";
constexpr uint64_t kTables = 2 * 32 * 16 * 4;
constexpr uint64_t kPositionIds = 32 * 8;

memsim_test::StepMeasure measure(Sets set, bool reentrant) {
  set.emplace_back("checkpoint.reentrant", reentrant ? "true" : "false");
  return memsim_test::measure_step(build_program(load_scenario_text(kText, "ctx.yaml", set)));
}

// reentrant minus non-reentrant, per mark (the forward itself keeps the same bytes in both:
// the frame holds every input until the region's backward).
struct Diff {
  int64_t before_forward, forward_end, after_backward;
};
Diff diff(const Sets& set) {
  const auto r = measure(set, true), n = measure(set, false);
  return {static_cast<int64_t>(r.before_forward) - static_cast<int64_t>(n.before_forward),
          static_cast<int64_t>(r.forward_end) - static_cast<int64_t>(n.forward_end),
          static_cast<int64_t>(r.after_backward) - static_cast<int64_t>(n.after_backward)};
}

}  // namespace

TEST_CASE("reentrant ctx: v4's (cos, sin) tuple lives until the graph dies", "[reentrant-ctx]") {
  // The outputs stay bound: the warm-up step's graph, and its tables, die only at the
  // measured step's `loss =`, after its forward.
  const Diff kept = diff({});
  CHECK(kept.before_forward == static_cast<int64_t>(kTables));
  CHECK(kept.forward_end == static_cast<int64_t>(kTables));
  CHECK(kept.after_backward == static_cast<int64_t>(kTables));
  // step.keep_output false (HF Trainer's training_step): the graph dies at the iteration's
  // end, after backward_end's mark is passed by nothing but the optimizer.
  const Diff dropped = diff({{"step.keep_output", "false"}});
  CHECK(dropped.before_forward == 0);
  CHECK(dropped.forward_end == 0);
}

TEST_CASE("reentrant ctx: transformers 5.x keeps every keyword argument", "[reentrant-ctx]") {
  // SDPA: 5.x builds no mask; the partial keeps (cos, sin) and position_ids.
  const Diff sdpa = diff({{"model.transformers", "5"}, {"model.attention", "flash"}});
  CHECK(sdpa.after_backward == static_cast<int64_t>(kTables + kPositionIds));
  CHECK(sdpa.forward_end == static_cast<int64_t>(kTables + kPositionIds));
  // Eager: the (B, 1, S, S) fp32 mask too.
  const Diff eager = diff({{"model.transformers", "5"}, {"model.attention", "eager"}});
  CHECK(eager.after_backward == static_cast<int64_t>(kTables + kPositionIds + 2 * 32 * 32 * 4));
}

TEST_CASE("reentrant ctx: what the call does not wrap stays as before", "[reentrant-ctx]") {
  // Mistral computes its tables in the attention: the v4 call passes no tuple.
  const Diff mistral = diff({{"model.architecture", "mistral"}});
  CHECK(mistral.after_backward == 0);
  CHECK(mistral.forward_end == 0);
  // Checkpointing only the MLP halves: their region gets the hidden state alone.
  const Diff mlp = diff({{"checkpoint.policy", "custom"}, {"checkpoint.custom", "[0.mlp, 1.mlp]"}});
  CHECK(mlp.after_backward == 0);
}
