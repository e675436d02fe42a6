// step.keep_output: loss (scenario/step_output_key.h; issue #16 item 5, the HF Trainer GPU
// runs of tests/test_gpu_hft_runs.cpp): HF Trainer's compute_loss returns the loss only,
// so the model's output (the logits) dies as soon as the loss is computed, before
// backward; the loss dies at the iteration's end as with `false`. Checked on the measured
// step's events: where the logits are freed, what the step's peak loses, and the kinds of
// step that compute no loss (refused).
#include <catch2/catch.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "step_measure_test_support.h"

using namespace memsim;

namespace {

// 2 x 32 tokens, vocab 1000: fp32 logits are 256000 B, a size nothing else in the step has.
const std::string kLlama =
    "model: { family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 1000 }\n"
    "batch: { micro_batch: 2, seq_len: 32 }\n"
    "optimizer: { type: adamw, impl: foreach }\n"
    "step: { warmup_steps: 1 }\n";
constexpr uint64_t kLogits = 2 * 32 * 1000 * 4;

Program build(const char* keep, std::vector<std::pair<std::string, std::string>> set = {}) {
  set.emplace_back("step.keep_output", keep);
  return build_program(load_scenario_text(kLlama, "keep.yaml", set));
}

// In the measured step: the phase in which the logits (the forward's kLogits-byte output)
// are freed, and whether that is before the first backward event.
struct LogitsFree {
  bool found = false;
  Phase phase = Phase::other;
  bool before_backward = false;
};
LogitsFree logits_free(const Program& p) {
  LogitsFree out;
  bool measuring = false, backward_seen = false;
  uint32_t logits = UINT32_MAX;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measuring = true;
    if (!measuring) continue;
    if (e.phase == Phase::backward) backward_seen = true;
    if (e.type == EventType::alloc && e.phase == Phase::forward && e.bytes == kLogits && logits == UINT32_MAX)
      logits = e.tensor;
    if (e.type == EventType::free && e.tensor == logits) {
      out.found = true;
      out.phase = e.phase;
      out.before_backward = !backward_seen;
      return out;
    }
  }
  return out;
}

// Requested bytes live just before the measured step's first backward event.
uint64_t live_before_backward(const Program& p) {
  uint64_t live = 0;
  bool measuring = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measuring = true;
    if (measuring && e.phase == Phase::backward) return live;
    if (e.type == EventType::alloc) live += e.bytes;
    if (e.type == EventType::free) live -= p.tensors[e.tensor].bytes;
  }
  return live;
}

}  // namespace

TEST_CASE("step.keep_output loss: the logits die after the loss, before backward", "[keep-output-loss]") {
  const LogitsFree loss = logits_free(build("loss"));
  const LogitsFree off = logits_free(build("false"));
  REQUIRE(loss.found);
  REQUIRE(off.found);
  CHECK(loss.before_backward);       // compute_loss returned: `outputs` is gone
  CHECK(loss.phase == Phase::loss);  // freed right after the loss computed from them
  CHECK_FALSE(off.before_backward);  // false: a step-function local, dead after backward
  // The rest of the step is the same: before the forward and after backward (the loss and
  // the logits both dead in either) the live bytes are equal; when backward starts, the
  // difference is exactly the logits, and the step's peak is no higher.
  const Program pl = build("loss"), pf = build("false");
  const memsim_test::StepMeasure a = memsim_test::measure_step(pl);
  const memsim_test::StepMeasure b = memsim_test::measure_step(pf);
  CHECK(a.before_forward == b.before_forward);
  CHECK(a.forward_end == b.forward_end);  // the mark is before the loss: logits alive in both
  CHECK(a.after_backward == b.after_backward);
  CHECK(live_before_backward(pf) - live_before_backward(pl) == kLogits);
  CHECK(a.peak <= b.peak);
}

TEST_CASE("step.keep_output loss: spelled in any case, refused where no loss is computed",
          "[keep-output-loss]") {
  const Scenario s = load_scenario_text(kLlama, "keep.yaml", {{"step.keep_output", "Loss"}});
  CHECK_FALSE(s.step.keep_output);
  CHECK(s.step.output_dies_after_loss);
  const Scenario t = load_scenario_text(kLlama, "keep.yaml", {{"step.keep_output", "false"}});
  CHECK_FALSE(t.step.output_dies_after_loss);
  for (const char* kind : {"forward", "forward-no-grad"}) {
    INFO(kind);
    try {
      (void)load_scenario_text(kLlama, "keep.yaml", {{"step.kind", kind}, {"step.keep_output", "loss"}});
      FAIL("accepted");
    } catch (const std::exception& e) {
      CHECK(std::string(e.what()).find("step.keep_output") != std::string::npos);
      CHECK(std::string(e.what()).find("computes no loss") != std::string::npos);
    }
  }
  // forward-backward computes a loss: accepted, and the logits go before backward too.
  CHECK(logits_free(build("loss", {{"step.kind", "forward-backward"}})).before_backward);
  try {
    (void)load_scenario_text(kLlama, "keep.yaml", {{"step.keep_output", "outputs"}});
    FAIL("accepted");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).find("step.keep_output") != std::string::npos);
  }
}
