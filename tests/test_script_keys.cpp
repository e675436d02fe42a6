// The hand-written-script keys (scenario/script_keys.h): loss.impl, loss.positions,
// optimizer.impl out-of-place and precision.autocast_region whole-run — what each emits
// on a small cs336 model, and the refusals. Their accuracy against real snapshots is in
// tests/test_niu_runs.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

const std::string kBase =
    "model: { family: cs336, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 1000 }\n"
    "batch: { micro_batch: 2, seq_len: 16 }\n"
    "step: { kind: train, warmup_steps: 2 }\n";

Scenario load(const std::vector<std::pair<std::string, std::string>>& overrides) {
  return load_scenario_text(kBase, "keys.yaml", overrides);
}

size_t count(const Program& p, EventType type, const std::string& op, uint64_t bytes = 0) {
  size_t n = 0;
  for (const MemoryEvent& e : p.events)
    if (e.type == type && (bytes == 0 || e.bytes == bytes) &&
        (type != EventType::alloc || p.str(e.op) == op))
      ++n;
  return n;
}

std::string error_of(const std::vector<std::pair<std::string, std::string>>& overrides,
                     const std::string& text = kBase) {
  try {
    const Scenario s = load_scenario_text(text, "bad.yaml", overrides);
    (void)build_program(s);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("script keys: loss.positions last selects the last position", "[script-keys][loss]") {
  // logits[:, -1, :]: SliceBackward0 (B, V), then SelectBackward0 and SliceBackward0, each
  // a zero-filled (B, S, V) tensor, once per step; the targets are (B,) int64.
  const uint64_t BSV = 2 * 16 * 1000 * 4, BV = 2 * 1000 * 4;
  for (const char* impl : {"one-hot", "cs336"}) {
    INFO(impl);
    const Scenario s = load({{"loss.impl", impl}, {"loss.positions", "last"},
                             {"optimizer.type", "adamw"}, {"optimizer.impl", "for-loop"}});
    const Program p = build_program(s);
    CHECK(count(p, EventType::alloc, "SelectBackward0", BSV) == 3);
    CHECK(count(p, EventType::alloc, "SliceBackward0", BSV) == 3);
    CHECK(count(p, EventType::alloc, "SliceBackward0", BV) == 3);
    size_t targets = 0;
    for (const MemoryEvent& e : p.events)
      if (e.type == EventType::alloc && e.kind == TensorKind::input && e.bytes == 2 * 8) ++targets;
    CHECK(targets == 1);
  }
  // All positions: no select, no slice.
  const Program all = build_program(load({{"loss.impl", "one-hot"}}));
  CHECK(count(all, EventType::alloc, "SelectBackward0") == 0);
}

TEST_CASE("script keys: the one-hot loss's forward and backward", "[script-keys][loss]") {
  // On (rows, V) = (2, 1000) fp32 scores: max values/indices, two x - max, exp, sum, log,
  // the log-softmax, zeros_like (the one-hot), the product, then three 4-byte results.
  const Scenario s = load({{"loss.impl", "one-hot"}, {"loss.positions", "last"},
                           {"step.warmup_steps", "0"}});
  const Program p = build_program(s);
  const uint64_t BV = 2 * 1000 * 4;
  CHECK(count(p, EventType::alloc, "sub", BV) == 3);
  CHECK(count(p, EventType::alloc, "exp", BV) == 1);
  CHECK(count(p, EventType::alloc, "other", BV) == 1);  // zeros_like(log_softmax_x)
  CHECK(count(p, EventType::alloc, "mul", BV) >= 1);
  CHECK(count(p, EventType::alloc, "MaxBackward0", BV) == 1);
  CHECK(count(p, EventType::alloc, "SubBackward0", BV) == 3);  // -grad of each broadcast sub
}

TEST_CASE("script keys: out-of-place Adam moves parameters and moments every step",
          "[script-keys][optimizer]") {
  for (const char* type : {"adamw", "adam"}) {
    INFO(type);
    const Scenario s = load({{"optimizer.type", type}, {"optimizer.impl", "out-of-place"}});
    const Program p = build_program(s);
    size_t params = 0, state_at_setup = 0, new_params = 0, new_state = 0, freed_params = 0;
    for (const MemoryEvent& e : p.events) {
      if (e.type == EventType::alloc && e.kind == TensorKind::parameter && e.phase == Phase::setup)
        ++params;
      if (e.type == EventType::alloc && e.kind == TensorKind::optimizer_state) {
        if (e.phase == Phase::setup) ++state_at_setup;
        else ++new_state;
      }
      if (e.type == EventType::alloc && e.kind == TensorKind::parameter && e.phase == Phase::optimizer)
        ++new_params;
      if (e.type == EventType::free && p.tensors[e.tensor].kind == TensorKind::parameter) ++freed_params;
    }
    const size_t updates = std::string(type) == "adamw" ? 2 : 1;  // + the decay statement
    CHECK(state_at_setup == 2 * params);      // m and v in __init__, before any step
    CHECK(new_state == 3 * 2 * params);       // new_m, new_v per parameter per step
    CHECK(new_params == 3 * updates * params);
    CHECK(freed_params == new_params);        // each p.data = ... frees the old storage
  }
  // The in-place torch.optim Adam creates its state lazily and keeps the parameters.
  const Program torch = build_program(load({{"optimizer.type", "adamw"}, {"optimizer.impl", "for-loop"}}));
  size_t torch_new_params = 0;
  for (const MemoryEvent& e : torch.events)
    if (e.type == EventType::alloc && e.kind == TensorKind::parameter && e.phase != Phase::setup)
      ++torch_new_params;
  CHECK(torch_new_params == 0);
}

TEST_CASE("script keys: whole-run autocast keeps the weight casts across steps",
          "[script-keys][autocast]") {
  // 2 layers x 7 einsum weights + lm_head, cast once (whole-run) or once per step.
  // (micro_batch 3: no activation cast has a weight's size.)
  auto casts = [](const char* region) {
    const Program p = build_program(load({{"batch.micro_batch", "3"}, {"precision.autocast", "bf16"},
                                          {"precision.autocast_region", region}}));
    size_t n = 0;
    for (const MemoryEvent& e : p.events)
      if (e.type == EventType::alloc && p.str(e.op) == "_to_copy" &&
          (e.bytes == 64 * 64 * 2 || e.bytes == 128 * 64 * 2 || e.bytes == 1000 * 64 * 2))
        ++n;
    return n;
  };
  CHECK(casts("whole-run") == 2 * 7 + 1);
  CHECK(casts("whole-step") == 3 * (2 * 7 + 1));
}

TEST_CASE("script keys: bad values and unmodelled combinations are refused by key",
          "[script-keys][scenario]") {
  auto has = [](const std::string& what, const std::string& needle) {
    INFO(what);
    CHECK(what.find(needle) != std::string::npos);
  };
  has(error_of({{"loss.impl", "onehot"}}), "loss.impl");
  has(error_of({{"loss.impl", "onehot"}}), "did you mean 'one-hot'");
  has(error_of({{"loss.positions", "first"}}), "loss.positions");
  has(error_of({{"optimizer.type", "sgd"}, {"optimizer.impl", "out-of-place"}}), "optimizer.impl");
  has(error_of({{"precision.autocast_region", "whole-loop"}}), "precision.autocast_region");
  // F.cross_entropy on the strided last-position view is not checked.
  has(error_of({{"loss.positions", "last"}}), "loss.positions");
  has(error_of({{"loss.positions", "last"}, {"loss.impl", "torch"}}), "loss.positions");
  has(error_of({{"precision.autocast", "bf16"}, {"precision.autocast_region", "whole-run"},
                {"checkpoint.policy", "full"}}),
      "precision.autocast_region");
  has(error_of({{"optimizer.type", "adam"}, {"optimizer.impl", "out-of-place"},
                {"parallel.data", "2"}}),
      "optimizer.impl");
  const std::string llama =
      "model: { preset: llama2-7b, layers: 1 }\nbatch: { micro_batch: 1, seq_len: 16 }\n";
  has(error_of({{"loss.impl", "one-hot"}}, llama), "cs336-family option");
  has(error_of({{"loss.positions", "last"}}, llama), "loss.positions");
}

TEST_CASE("script keys: step.measure whole-run measures from the program's start",
          "[script-keys][scenario]") {
  const Scenario last = load({{"optimizer.type", "adamw"}, {"optimizer.impl", "out-of-place"},
                              {"loss.impl", "one-hot"}, {"loss.positions", "last"}});
  Scenario whole = last;
  whole.step.measure_whole_run = true;
  const Program pl = build_program(last), pw = build_program(whole);
  SimulatedDevice d1(80ull << 30, 0), d2(80ull << 30, 0);
  const Timeline tl = execute(pl, last.allocator, d1), tw = execute(pw, whole.allocator, d2);
  // The same events; only the mark moves (to before the model's first parameter).
  size_t allocs_l = 0, allocs_w = 0, first_mark = SIZE_MAX;
  for (size_t i = 0; i < pw.events.size(); ++i) {
    if (pw.events[i].type == EventType::alloc) ++allocs_w;
    if (pw.events[i].type == EventType::mark && first_mark == SIZE_MAX) first_mark = i;
  }
  for (const MemoryEvent& e : pl.events)
    if (e.type == EventType::alloc) ++allocs_l;
  CHECK(allocs_l == allocs_w);
  CHECK(first_mark == 0);
  uint64_t max_alloc = 0;
  for (uint64_t a : tw.allocated) max_alloc = std::max(max_alloc, a);
  const Analysis a = analyze(pw, tw);
  CHECK(a.peak_allocated == max_alloc);
  CHECK(a.peak_allocated >= analyze(pl, tl).peak_allocated);
  // Bad values and megatron are refused by key.
  CHECK(error_of({{"step.measure", "all"}}).find("step.measure") != std::string::npos);
  const std::string megatron =
      "model: { family: megatron, layers: 2, d_model: 64, heads: 4, d_ff: 256, vocab: 1000 }\n"
      "batch: { micro_batch: 1, seq_len: 16 }\n";
  CHECK(error_of({{"step.measure", "whole-run"}}, megatron).find("step.measure") !=
        std::string::npos);
}
