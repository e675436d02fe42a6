// Acceptance for issue #6's NiuHuangxiaozi snapshots: memsim's cs336 family with
// model.softmax: exp-twice and model.sdpa: masked-fill against the four recorded forward
// runs (fp32 S100/150/200 and bf16 autocast S200): peak allocated within 1%, peak
// reserved within 3% (memsim: within 0.07% and exact). The measured numbers are
// tests/support/real_runs_niu.cpp's copy of `memsim replay`; when shared/ is checked out the
// snapshots are replayed again and compared with it and with manifest.json.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "real_run_test_support.h"
#include "allocator/caching_allocator.h"
#include "allocator/snapshot/snapshot.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "tests/support/real_runs_niu.h"
#include "replay/replay.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string& kShared = memsim_test::shared_snapshots_dir();

using memsim_test::rel;

const ReplayPeaks& measured(const std::string& snapshot) {
  return memsim_test::find_measured(niu_measured(), snapshot);
}

}  // namespace

TEST_CASE("niu runs: measured peaks are the replay of the shared snapshots", "[niu][accuracy]") {
  REQUIRE(niu_measured().size() == 8);
  if (!memsim_test::shared_snapshots_present("the replay of the 8 NiuHuangxiaozi snapshots"))
    return;
  std::ifstream manifest_in(kShared + "manifest.json");
  nlohmann::json manifest;
  manifest_in >> manifest;
  for (const ReplayPeaks& m : niu_measured()) {
    INFO(m.snapshot);
    const ReplayReport r = replay_snapshot(read_snapshot_file(kShared + m.snapshot));
    CHECK(r.mismatches == 0);
    CHECK(r.peak_allocated_bytes == m.peak_allocated);
    CHECK(r.peak_reserved_bytes == m.peak_reserved);
    CHECK(r.peak_requested_bytes == m.peak_requested);
    bool found = false;
    for (const auto& e : manifest) {
      if (e["file"] != m.snapshot) continue;
      found = true;
      CHECK(e["peak_requested_in_trace"].get<uint64_t>() == m.peak_requested);
      CHECK(e["peak_reserved_in_trace"].get<uint64_t>() == m.peak_reserved);
    }
    CHECK(found);
  }
}

using memsim_test::print_comparison_header;
using memsim_test::print_comparison_row;

TEST_CASE("niu runs: predicted forward peaks match the snapshots", "[niu][accuracy]") {
  const std::vector<RealRun> runs = niu_forward_runs();
  REQUIRE(runs.size() == 4);
  print_comparison_header();
  for (const RealRun& run : runs) {
    INFO(run.id);
    const ReplayPeaks& real = measured(run.snapshot);
    const MeasuredStep p = predict_measured_step(run.scenario, run.script);
    const double ea = rel(p.peak_allocated, real.peak_allocated);
    const double er = rel(p.peak_reserved, real.peak_reserved);
    print_comparison_row(run.id, p.peak_allocated, real.peak_allocated, p.peak_reserved,
                         real.peak_reserved);
    CHECK(std::fabs(ea) < 0.01);
    // The peak is the lm_head einsum output (logits) at the end of a forward.
    CHECK(p.peak_op == "einsum");
    CHECK(p.peak_phase == Phase::forward);
    CHECK(std::fabs(er) < 0.03);
  }
}

TEST_CASE("niu runs: the staff softmax and masking miss them", "[niu][accuracy]") {
  // Without model.softmax: exp-twice each layer keeps one exp output fewer: about 4 layers
  // x B*H*S*S*4 bytes (102.4 MB at S 200) below the real peak, -11.6%. Without
  // model.sdpa: masked-fill the attention frees its raw scores early (where() instead of
  // an in-place masked_fill_ on kept locals): the peak allocated barely moves, but the
  // cache is laid out differently (S 100: reserved -4.5%).
  RealRun run = niu_forward_runs()[2];  // fp32 S200
  const uint64_t real = measured(run.snapshot).peak_allocated;
  const MeasuredStep both = predict_measured_step(run.scenario, run.script);
  run.scenario.model.softmax = SoftmaxImpl::staff;
  const MeasuredStep staff_softmax = predict_measured_step(run.scenario, run.script);
  const double exp_bytes = 10.0 * 16 * 200 * 200 * 4;
  CHECK(std::fabs((both.peak_allocated - staff_softmax.peak_allocated) / (4 * exp_bytes) - 1) < 0.01);
  CHECK(rel(staff_softmax.peak_allocated, real) < -0.10);

  RealRun r100 = niu_forward_runs()[0];  // fp32 S100
  r100.scenario.model.sdpa = SdpaImpl::staff;
  const MeasuredStep staff_sdpa = predict_measured_step(r100.scenario, r100.script);
  CHECK(rel(staff_sdpa.peak_reserved, measured(r100.snapshot).peak_reserved) < -0.03);
}

TEST_CASE("niu runs: the shipped scenario file reproduces all four forward runs",
          "[niu][accuracy][scenarios]") {
  // scenarios/groundtruth/niu-forward-s200.yaml (one forward from an empty allocator: the
  // script drops each output, so every forward peaks alike) with the CLI's --set.
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/groundtruth/niu-forward-s200.yaml";
  const std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, size_t>> cases = {
      {{{"batch.seq_len", "100"}}, 0},
      {{{"batch.seq_len", "150"}}, 1},
      {{}, 2},
      {{{"precision.autocast", "bf16"}}, 3}};
  for (const auto& [overrides, index] : cases) {
    const ReplayPeaks& real = niu_measured()[index];
    INFO(real.snapshot);
    const Scenario s = load_scenario(file, overrides);
    const Program p = build_program(s);
    SimulatedDevice device(s.device.capacity, s.device.cuda_context);
    const Analysis a = analyze(p, execute(p, s.allocator, device));
    CHECK(std::fabs(rel(a.peak_allocated, real.peak_allocated)) < 0.01);
    CHECK(std::fabs(rel(a.peak_reserved, real.peak_reserved)) < 0.03);
  }
}

TEST_CASE("niu runs: model.softmax and model.sdpa are validated", "[niu][scenario]") {
  const std::string base =
      "model: { family: cs336, layers: 1, d_model: 64, heads: 4, d_ff: 128, vocab: 100 }\n"
      "batch: { micro_batch: 1, seq_len: 16 }\n";
  CHECK_NOTHROW(load_scenario_text(base, "ok.yaml", {{"model.softmax", "exp-twice"},
                                                      {"model.sdpa", "masked-fill"}}));
  try {
    load_scenario_text(base, "bad.yaml", {{"model.softmax", "twice"}});
    FAIL("accepted model.softmax: twice");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).find("model.softmax") != std::string::npos);
  }
  try {
    load_scenario_text(base, "bad.yaml", {{"model.sdpa", "where"}});
    FAIL("accepted model.sdpa: where");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).find("model.sdpa") != std::string::npos);
  }
  const std::string llama =
      "model: { preset: llama2-7b, layers: 1 }\nbatch: { micro_batch: 1, seq_len: 16 }\n";
  for (const char* key : {"model.softmax", "model.sdpa"}) {
    INFO(key);
    const char* value = std::string(key) == "model.softmax" ? "exp-twice" : "masked-fill";
    try {
      build_program(load_scenario_text(llama, "llama.yaml", {{key, value}}));
      FAIL("hf-llama accepted " << key);
    } catch (const std::exception& e) {
      CHECK(std::string(e.what()).find(key) != std::string::npos);
      CHECK(std::string(e.what()).find("cs336-family option") != std::string::npos);
    }
  }
}

TEST_CASE("niu runs: masked-fill attention trains (backward runs, one grad per masked_fill)",
          "[niu][scenario]") {
  // The in-place masked_fill_ node's backward allocates the grad and no 0-d tensor.
  const std::string text =
      "model: { family: cs336, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 100, "
      "softmax: exp-twice, sdpa: masked-fill }\n"
      "batch: { micro_batch: 2, seq_len: 16 }\noptimizer: { type: adamw }\n"
      "step: { kind: train, warmup_steps: 1 }\n";
  const Scenario s = load_scenario_text(text, "train.yaml");
  const Program p = build_program(s);
  size_t zero_byte = 0;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && e.bytes == 0) ++zero_byte;
  CHECK(zero_byte == 0);
  SimulatedDevice device(80ull << 30, 0);
  const Analysis a = analyze(p, execute(p, s.allocator, device));
  CHECK(a.peak_allocated > 0);
}

// ---------------------------------------------------------------- forward_and_backward

namespace {

struct WholeRun {
  uint64_t peak_allocated = 0, peak_reserved = 0;
  std::string peak_op;  // op of the first event at the allocated maximum
};

// The runs record from before the model is built: max_memory_allocated / reserved over
// the whole program.
WholeRun predict_whole_run(const Scenario& s, const TrainingScript& script) {
  const Program p = build_program(s, script);
  SimulatedDevice device(s.device.capacity, s.device.cuda_context);
  const Timeline t = execute(p, s.allocator, device);
  WholeRun w;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t.allocated[i] > w.peak_allocated) {
      w.peak_allocated = t.allocated[i];
      w.peak_op = std::string(p.str(p.events[i].op));
    }
    w.peak_reserved = std::max(w.peak_reserved, t.reserved[i]);
  }
  return w;
}

// Allocations by `op` whose size is one of `sizes`.
size_t count_allocs(const Program& p, const std::string& op, std::vector<uint64_t> sizes) {
  size_t n = 0;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && p.str(e.op) == op &&
        std::find(sizes.begin(), sizes.end(), e.bytes) != sizes.end())
      ++n;
  return n;
}

}  // namespace

TEST_CASE("niu runs: predicted forward_and_backward peaks match the snapshots",
          "[niu][accuracy]") {
  // loss.impl one-hot + loss.positions last (NIUCrossEntropyLoss on logits[:, -1, :]),
  // optimizer.impl out-of-place (NIUAdam), bf16: autocast_region whole-run. Target: 1%
  // allocated, 3% reserved (memsim: within 0.2%, reserved exact).
  const std::vector<RealRun> runs = niu_train_runs();
  REQUIRE(runs.size() == 4);
  print_comparison_header();
  for (const RealRun& run : runs) {
    INFO(run.id);
    const ReplayPeaks& real = measured(run.snapshot);
    const WholeRun p = predict_whole_run(run.scenario, run.script);
    const double ea = rel(p.peak_allocated, real.peak_allocated);
    const double er = rel(p.peak_reserved, real.peak_reserved);
    print_comparison_row(run.id, p.peak_allocated, real.peak_allocated, p.peak_reserved,
                         real.peak_reserved);
    CHECK(std::fabs(ea) < 0.01);
    CHECK(std::fabs(er) < 0.03);
    // fp32: the peak is SliceBackward0's (B, S, V) zeros while SelectBackward0's is alive
    // (trace: the second of the two logits-sized allocations). bf16: the exp-twice
    // softmax's DivBackward0 in the last layer (the two B*S*V bf16 grads are half-size).
    if (!run.scenario.precision.autocast) CHECK(p.peak_op == "SliceBackward0");
  }
}

TEST_CASE("niu runs: each forward_and_backward key is needed", "[niu][accuracy]") {
  const std::vector<RealRun> runs = niu_train_runs();
  const RealRun& fp32 = runs[2];  // S200
  const ReplayPeaks& real = measured(fp32.snapshot);
  auto off = [&](const RealRun& r, auto edit) {
    RealRun changed = r;
    edit(changed.scenario);
    changed.script = default_script(changed.scenario);
    return predict_whole_run(changed.scenario, changed.script);
  };
  // The loss over all positions keeps (B*S, V) tensors alive: +13% allocated with the
  // one-hot loss, +6.5% with F.cross_entropy.
  const WholeRun all = off(fp32, [](Scenario& s) { s.loss.positions = LossPositions::all; });
  CHECK(rel(all.peak_allocated, real.peak_allocated) > 0.10);
  const WholeRun torch_all = off(fp32, [](Scenario& s) {
    s.loss.positions = LossPositions::all;
    s.loss.impl = LossFunction::torch;
  });
  CHECK(rel(torch_all.peak_allocated, real.peak_allocated) > 0.05);
  // torch.optim's in-place Adam keeps the parameters' blocks: -3.9% reserved.
  const WholeRun in_place = off(fp32, [](Scenario& s) {
    s.optimizer.impl = OptimizerImpl::for_loop;
  });
  CHECK(rel(in_place.peak_reserved, real.peak_reserved) < -0.03);
  // bf16: with the same in-place Adam the reserved memory is 6.6% low.
  const RealRun& bf16 = runs[3];
  const WholeRun bf16_in_place = off(bf16, [](Scenario& s) {
    s.optimizer.impl = OptimizerImpl::for_loop;
  });
  CHECK(rel(bf16_in_place.peak_reserved, measured(bf16.snapshot).peak_reserved) < -0.05);
}

TEST_CASE("niu runs: whole-run autocast casts each weight once for the whole loop",
          "[niu][autocast]") {
  // The trace casts the 16 attention 512x512 weights once in three iterations (16
  // `_to_copy` allocations of 524,288 B, 48 BmmBackward0 weight grads of that size) and
  // lm_head.weight once (trace entry 823). whole-step recasts them every step.
  RealRun run = niu_train_runs()[3];
  const Program whole_run = build_program(run.scenario, run.script);
  // bf16 copies of the 512x512, 1344x512 and 10000x512 weights (no activation has
  // these sizes at B 10, S 200).
  const std::vector<uint64_t> low = {512 * 512 * 2, 1344 * 512 * 2, 10000 * 512 * 2};
  const std::vector<uint64_t> fp32 = {512 * 512 * 4, 1344 * 512 * 4, 10000 * 512 * 4};
  const size_t casts_per_run = count_allocs(whole_run, "_to_copy", low);
  run.scenario.precision.autocast_region = AutocastRegion::whole_step;
  const Program whole_step = build_program(run.scenario, run.script);
  CHECK(casts_per_run == 4 * 7 + 1);  // q, k, v, o, w1, w2, w3 per layer + lm_head
  CHECK(count_allocs(whole_step, "_to_copy", low) == 3 * casts_per_run);
  // Every step's backward still reaches every weight through the reused cast's
  // ToCopyBackward0: one fp32 weight grad per cast weight per step.
  CHECK(count_allocs(whole_run, "ToCopyBackward0", fp32) == 3 * casts_per_run);
  CHECK(count_allocs(whole_step, "ToCopyBackward0", fp32) == 3 * casts_per_run);
}

TEST_CASE("niu runs: a reused weight cast's backward runs after the new graph's nodes",
          "[niu][autocast]") {
  // torch reuses the cached copy's ToCopyBackward0 from the first iteration, with its old
  // sequence number: in iterations 2 and 3 the engine casts every weight grad to fp32
  // only after all other nodes (trace: from entry 6850 on, after the embedding's
  // backward), so the bf16 grads, not fp32 ones, are alive at the peak (14.9 MB less at
  // S 200 than in iteration 1). In the first iteration each cast runs after its einsum.
  const RealRun run = niu_train_runs()[3];
  const Program p = build_program(run.scenario, run.script);
  const std::vector<uint64_t> fp32 = {512 * 512 * 4, 1344 * 512 * 4, 10000 * 512 * 4};
  auto is_weight_cast = [&](const MemoryEvent& e) {
    return e.type == EventType::alloc && p.str(e.op) == "ToCopyBackward0" &&
           std::find(fp32.begin(), fp32.end(), e.bytes) != fp32.end();
  };
  // [first weight cast, last other backward alloc] per step, steps split by their
  // forward's first allocation after a backward.
  std::vector<std::pair<size_t, size_t>> steps;
  Phase prev = Phase::setup;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type != EventType::alloc) continue;
    if (e.phase == Phase::backward && prev != Phase::backward) steps.push_back({SIZE_MAX, 0});
    prev = e.phase;
    if (e.phase != Phase::backward) continue;
    if (is_weight_cast(e)) steps.back().first = std::min(steps.back().first, i);
    else if (p.str(e.op) != "AccumulateGrad") steps.back().second = i;
  }
  REQUIRE(steps.size() == 3);
  CHECK(steps[0].first < steps[0].second);  // iteration 1: interleaved
  CHECK(steps[1].first > steps[1].second);  // iterations 2, 3: all at the end
  CHECK(steps[2].first > steps[2].second);
}

TEST_CASE("niu runs: the shipped scenario file reproduces the forward_and_backward runs",
          "[niu][accuracy][scenarios]") {
  // scenarios/groundtruth/niu-train-s200.yaml runs the script's three iterations with
  // step.measure: whole-run (the run records from before the model is built).
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/groundtruth/niu-train-s200.yaml";
  const std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, size_t>> cases = {
      {{{"batch.seq_len", "100"}}, 4},
      {{{"batch.seq_len", "150"}}, 5},
      {{}, 6},
      {{{"precision.autocast", "bf16"}, {"precision.autocast_region", "whole-run"}}, 7}};
  for (const auto& [overrides, index] : cases) {
    const ReplayPeaks& real = niu_measured()[index];
    INFO(real.snapshot);
    const Scenario s = load_scenario(file, overrides);
    const WholeRun w = predict_whole_run(s, default_script(s));
    CHECK(std::fabs(rel(w.peak_allocated, real.peak_allocated)) < 0.01);
    CHECK(std::fabs(rel(w.peak_reserved, real.peak_reserved)) < 0.03);
    // step.measure: whole-run: what `memsim run` reports is the whole program's peak.
    const Program p = build_program(s);
    SimulatedDevice device(s.device.capacity, s.device.cuda_context);
    const Analysis a = analyze(p, execute(p, s.allocator, device));
    CHECK(a.peak_allocated == w.peak_allocated);
    CHECK(a.peak_reserved == w.peak_reserved);
  }
}
