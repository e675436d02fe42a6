// The megatron family against published memory formulas (sim/megatron/megatron_checks.h), and the
// shipped GPT-3 175B scenario end to end.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "graph/models/megatron.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/megatron/megatron_checks.h"
#include "sim/megatron/megatron_step.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

Scenario gpt3() { return load_scenario(std::string(MEMSIM_SOURCE_DIR) + "/scenarios/gpt3-175b.yaml"); }

void print(const FormulaCheck& c) {
  std::printf("  %-62s %-22s formula %16.1f  memsim %16.1f  extra %10.1f %s\n", c.name.c_str(),
              c.formula.c_str(), c.expected, c.simulated, c.extra, c.note.c_str());
}

}  // namespace

TEST_CASE("Korthikanti et al. 2022: GPT-3 175B keeps s*b*h*(34 + 5as/h) per layer", "[megatron]") {
  const Scenario s = gpt3();
  REQUIRE(s.model.family == ModelFamily::megatron);
  const auto checks = korthikanti_checks(s);
  REQUIRE(checks.size() == 2);
  const double sbh = 2048.0 * 1 * 12288;
  // eager: 34 + 5*96*2048/12288 = 114
  CHECK(checks[0].expected == sbh * 114);
  CHECK(checks[1].expected == sbh * 34);
  for (const FormulaCheck& c : checks) {
    print(c);
    // Exactly the formula plus the documented O(sb) terms the paper leaves out.
    CHECK(c.simulated == c.expected + c.extra);
    CHECK(c.extra / c.expected < 1e-3);
  }
  // The same seen through the allocator: the Timeline's activation bytes at forward_end
  // are the 96 layers' share plus what lives outside the layers (rounding to 512-byte
  // blocks changes nothing here but the 4-byte loss).
  {
    Scenario fwd = s;
    fwd.step.kind = StepKind::forward;
    fwd.step.warmup_steps = 0;
    const Program program = build_program(fwd);
    SimulatedDevice device(1ull << 50, 0);
    const Timeline t = execute(program, fwd.allocator, device);
    REQUIRE_FALSE(t.oom.has_value());
    size_t at = 0;
    for (size_t i = 0; i < program.events.size(); ++i)
      if (program.events[i].type == EventType::mark &&
          program.str(static_cast<uint32_t>(program.events[i].bytes)) == "forward_end")
        at = i;
    REQUIRE(at > 0);
    const LiveBytes live = live_bytes_at_mark(program, "forward_end");
    const double timeline_layers =
        static_cast<double>(t.by_kind[at][int(TensorKind::activation)]) -
        static_cast<double>(live.outside[int(TensorKind::activation)]);
    CHECK(timeline_layers >= 96 * (checks[0].expected + checks[0].extra));
    CHECK(timeline_layers < 96 * (checks[0].expected + checks[0].extra) + 512);
  }
  CHECK(checks[0].extra == 16.0 * 2048);                  // two LayerNorms' mean + invvar
  CHECK(checks[1].extra == 16.0 * 2048 + 4.0 * 96 * 2048 + 16);  // + lse + RNG state
}

TEST_CASE("ZeRO accounting: mixed-precision Adam keeps 16 B/param with master weights, 12 without",
          "[megatron]") {
  for (const FormulaCheck& c : model_state_checks()) {
    print(c);
    CHECK(c.simulated == c.expected);
  }
}

TEST_CASE("Megatron layer accounting: every layer keeps the same bytes, outside terms are known",
          "[megatron]") {
  Scenario s = gpt3();
  s.model.layers = 4;
  s.step.kind = StepKind::forward;
  s.step.warmup_steps = 0;
  const Program program = build_megatron_program(s);
  const LiveBytes live = live_bytes_at_mark(program, "forward_end");
  REQUIRE(live.found_mark);
  REQUIRE(live.by_layer.size() == 4);
  const graph::MegatronShape shape = megatron_shape(s);
  const uint64_t per_layer = graph::megatron_layer_saved_bytes(shape).total();
  for (const auto& l : live.by_layer) CHECK(l[int(TensorKind::activation)] == per_layer);
  // Outside the layers at forward_end: the embedding's dropout output (layer 0's LN1
  // input, 2sbh) and mask (sbh), the final LayerNorm's output (2sbh) and stats (8sb), the
  // CE's fp32 softmax (4sbV), target mask (sb) and masked target (8sb), and the 4-byte
  // loss the step will backpropagate. (The loss mask the mul saved is an input.)
  const uint64_t sb = 2048, sbh = sb * 12288, V = 50257;
  const uint64_t outside = 2 * sbh + sbh + 2 * sbh + 8 * sb + 4 * sb * V + sb + 8 * sb + 4;
  CHECK(live.outside[int(TensorKind::activation)] == outside);
}

TEST_CASE("memsim run scenarios/gpt3-175b.yaml: one A100 80GB runs out of memory at setup",
          "[megatron]") {
  const Scenario s = gpt3();
  const Program program = build_program(s);
  SimulatedDevice device(s.device.capacity, s.device.cuda_context);
  const Timeline t = execute(program, s.allocator, device);
  REQUIRE(t.oom.has_value());
  CHECK(program.events[t.oom->event_index].phase == Phase::setup);  // the weights: 350 GB
}

TEST_CASE("megatron: a small model trains end to end and frees what it should", "[megatron]") {
  Scenario s = gpt3();
  s.model.layers = 2;
  s.model.d_model = 256;
  s.model.heads = 4;
  s.model.kv_heads = 4;
  s.model.d_ff = 1024;
  s.model.vocab = 1000;
  s.model.context_length = 128;
  s.batch.seq_len = 128;
  s.batch.micro_batch = 2;
  for (AttentionImpl a : {AttentionImpl::eager, AttentionImpl::flash}) {
    s.model.attention = a;
    const Program program = build_program(s);
    SimulatedDevice device(s.device.capacity, s.device.cuda_context);
    const Timeline t = execute(program, s.allocator, device);
    REQUIRE_FALSE(t.oom.has_value());
    // After backward no activation of the step is left.
    const LiveBytes after = live_bytes_at_mark(program, "backward_end");
    REQUIRE(after.found_mark);
    CHECK(after.by_kind[int(TensorKind::activation)] == 0);
    CHECK(after.by_kind[int(TensorKind::temporary)] == 0);
    // Every parameter grad went through the DDP hook into main_grad (fp32 for bf16):
    // the buffer is the only gradient left.
    const uint64_t P = static_cast<uint64_t>(graph::megatron_parameter_count(megatron_shape(s)));
    CHECK(after.by_kind[int(TensorKind::gradient)] == 4 * P);
    CHECK(after.by_kind[int(TensorKind::parameter)] == 2 * P);
  }
}

TEST_CASE("megatron: forward-only and no-grad steps leave nothing behind", "[megatron]") {
  Scenario s = gpt3();
  s.model.layers = 2;
  s.model.d_model = 128;
  s.model.heads = 2;
  s.model.kv_heads = 2;
  s.model.d_ff = 512;
  s.model.vocab = 500;
  s.model.context_length = 64;
  s.batch.seq_len = 64;
  for (StepKind k : {StepKind::forward, StepKind::forward_no_grad, StepKind::forward_backward}) {
    s.step.kind = k;
    const Program program = build_program(s);
    const LiveBytes end = live_bytes_at_mark(program, "");  // the whole program
    CHECK(end.by_kind[int(TensorKind::activation)] == 0);
    CHECK(end.by_kind[int(TensorKind::temporary)] == 0);
    CHECK(end.by_kind[int(TensorKind::input)] == 0);
  }
}
