// step.keep_output (scenario/step_output_key.h, issue #16 item 8): what a training loop
// keeps of an iteration's output until the next forward. true (the default) is
// `out = model(x)` at loop level: the previous output, and for a forward with grad the
// whole autograd graph it holds, is alive during the next forward and dies only when the
// name is rebound after that forward returns. false is a step function whose names die
// when it returns: nothing of the previous iteration is alive in the next forward.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "step_measure_test_support.h"

using namespace memsim;

namespace {

const std::string kLlama =
    "model: { family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 1000 }\n"
    "batch: { micro_batch: 2, seq_len: 32 }\n"
    "optimizer: { type: adamw, impl: foreach }\n"
    "step: { warmup_steps: 2 }\n";

Program build(const std::string& kind, const char* keep, const std::string& text = kLlama) {
  std::vector<std::pair<std::string, std::string>> set = {{"step.kind", kind}};
  if (keep != nullptr) set.emplace_back("step.keep_output", keep);
  return build_program(load_scenario_text(text, "keep.yaml", set));
}

// Requested bytes at the measured step's start and the peak of its forward (from the
// start to the forward_end mark), plus memsim_test::measure_step's numbers.
struct ForwardMeasure {
  memsim_test::StepMeasure step;
  uint64_t forward_peak = 0;
};
ForwardMeasure measure(const Program& p) {
  ForwardMeasure m;
  m.step = memsim_test::measure_step(p);
  uint64_t live = 0;
  bool in_forward = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc) live += e.bytes;
    if (e.type == EventType::free) live -= p.tensors[e.tensor].bytes;
    if (e.type == EventType::mark) {
      const std::string& name = p.str(static_cast<uint32_t>(e.bytes));
      if (name == "measured_step_begin") in_forward = true;
      if (name == "forward_end") in_forward = false;
    }
    if (in_forward) m.forward_peak = std::max(m.forward_peak, live);
  }
  return m;
}

bool same_events(const Program& a, const Program& b) {
  if (a.events.size() != b.events.size()) return false;
  for (size_t i = 0; i < a.events.size(); ++i)
    if (a.events[i].type != b.events[i].type || a.events[i].bytes != b.events[i].bytes ||
        a.events[i].tensor != b.events[i].tensor)
      return false;
  return true;
}

}  // namespace

TEST_CASE("step.keep_output: the default is today's loop (true) for every step.kind",
          "[keep-output]") {
  for (const char* kind : {"train", "forward", "forward-no-grad", "forward-backward"}) {
    INFO(kind);
    CHECK(same_events(build(kind, nullptr), build(kind, "true")));
    CHECK_FALSE(same_events(build(kind, nullptr), build(kind, "false")));
  }
}

TEST_CASE("step.keep_output: a forward with grad keeps the previous graph alive", "[keep-output]") {
  // keep false: the measured step starts with nothing of the warm-up forward alive; its
  // forward then holds one graph (saved activations + output): G bytes at forward_end.
  const ForwardMeasure off = measure(build("forward", "false"));
  const ForwardMeasure on = measure(build("forward", "true"));
  const uint64_t graph = off.step.forward_end - off.step.before_forward;
  CHECK(graph > 0);
  // keep true: the warm-up's output and graph (the same G) are alive from the start of
  // the measured step through its whole forward, and die at the rebinding, before
  // forward_end.
  CHECK(on.step.before_forward - off.step.before_forward == graph);
  CHECK(on.forward_peak - off.forward_peak == graph);
  CHECK(on.step.forward_end == off.step.forward_end);
  CHECK(on.step.peak - off.step.peak == graph);  // a forward-only step peaks in its forward
}

TEST_CASE("step.keep_output: a train step keeps only the previous logits and loss", "[keep-output]") {
  // backward consumed the graph: what outlives the iteration is the logits (B,S,V) fp32
  // and the 0-d loss.
  const ForwardMeasure off = measure(build("train", "false"));
  const ForwardMeasure on = measure(build("train", "true"));
  const uint64_t logits = 2 * 32 * 1000 * 4, loss = 4;
  CHECK(on.step.before_forward - off.step.before_forward == logits + loss);
  CHECK(on.forward_peak - off.forward_peak == logits + loss);
  // The logits name is rebound when the forward returns; the loss name only by the next
  // loss, so the previous 0-d loss is still alive at forward_end.
  CHECK(on.step.forward_end - off.step.forward_end == loss);
}

TEST_CASE("step.keep_output: refusals name the key", "[keep-output]") {
  auto error_of = [](const std::string& text, const char* value) -> std::string {
    try {
      (void)load_scenario_text(text, "bad.yaml", {{"step.keep_output", value}});
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error_of(kLlama, "maybe"), Catch::Contains("step.keep_output"));
  const std::string megatron =
      "model: { family: megatron, layers: 2, d_model: 64, heads: 4, d_ff: 256, vocab: 1000 }\n"
      "batch: { micro_batch: 2, seq_len: 32 }\n";
  CHECK_THAT(error_of(megatron, "false"), Catch::Contains("step.keep_output"));
  CHECK(error_of(megatron, "true").empty());
}

TEST_CASE("step.keep_output false: each micro-batch's output dies after its backward",
          "[keep-output]") {
  // HF Trainer's training_step runs once per micro-batch and returns loss.detach(): its
  // logits and loss are dead at the backward's end, before the next micro-batch and the
  // optimizer step, however many micro-batches a step has.
  const uint64_t logits = 2 * 32 * 1000 * 4, loss = 4;
  for (const char* accum : {"1", "3"}) {
    INFO("batch.grad_accum " << accum);
    auto with = [&](const char* keep) {
      return memsim_test::measure_step(build_program(load_scenario_text(
          kLlama, "keep.yaml", {{"step.keep_output", keep}, {"batch.grad_accum", accum}})));
    };
    const memsim_test::StepMeasure off = with("false"), on = with("true");
    CHECK(on.after_backward - off.after_backward == logits + loss);
  }
}

TEST_CASE("step.keep_output false: torchtune's model lets go of its output chunks",
          "[keep-output][implementation]") {
  // torchtune's TransformerDecoder returns a list of 8 chunks that the model row holds; a
  // forward-only loop that keeps nothing must not keep the list either.
  const std::string tune =
      "model: { family: hf-llama, implementation: torchtune, layers: 2, d_model: 64, heads: 4,\n"
      "         d_ff: 128, vocab: 1000, attention: flash }\n"
      "batch: { micro_batch: 2, seq_len: 32 }\n"
      "precision: { params: bf16 }\n"
      "step: { warmup_steps: 2, kind: forward-no-grad }\n";
  auto before_forward = [&](const char* keep) {
    return measure(build_program(
               load_scenario_text(tune, "tune.yaml", {{"step.keep_output", keep}})))
        .step.before_forward;
  };
  // The chunks of the (B, S, V) bf16 logits: the whole output is what `true` keeps.
  CHECK(before_forward("true") - before_forward("false") >= 2 * 32 * 1000 * 2);
}
