// step.keep_output: model-loss (scenario/step_output_key.h): `outputs = model(ids,
// labels=labels); loss = outputs.loss` bound at loop level, the loop of
// tools/gpu/measure_cuda.py's transformers runs (run_one: `logits = forward(model, ids,
// labels)` with forward = m(input_ids=ids, labels=labels, use_cache=False), then
// `loss = loss_fn(logits, labels)` = out.loss). The model computes the loss before it
// returns, so the previous step's output dies at the rebinding, after that loss: every
// tf_arch_* H200 trace (tests/data/h100/arch/snapshots.tar.xz) frees the previous logits
// at run_one's `logits = forward(...)` line, after fixed_cross_entropy's allocations.
// With step.keep_output: true memsim freed them when the new logits existed, before the
// loss.
#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "allocator/snapshot/snapshot.h"
#include "scenario/scenario.h"
#include "sim/step/loss_placement.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kSnapshots = MEMSIM_H100_ARCH_SNAPSHOTS;

// The large-pool (> 1 MiB) allocations and frees in order, as "A<bytes>" / "F<bytes>"
// (a free names the size of the block it frees), and the index of the free of the first
// allocation of `output_bytes` (the warm-up step's logits, the first block of that size):
// where the previous output dies.
struct LargeEvents {
  std::vector<std::string> tokens;
  size_t previous_output_free = 0;
};

LargeEvents large_events(const Snapshot& snap, uint64_t output_bytes) {
  LargeEvents out;
  std::map<uint64_t, std::pair<uint64_t, bool>> live;  // address -> (size, first output)
  bool seen = false;
  for (const SnapshotTraceEntry& e : snap.device_traces.at(0)) {
    if (e.action == TraceAction::alloc && e.size > (1u << 20)) {
      const bool first = !seen && e.size == output_bytes;
      seen = seen || first;
      live[e.address] = {e.size, first};
      out.tokens.push_back("A" + std::to_string(e.size));
    } else if (e.action == TraceAction::free_requested) {
      const auto it = live.find(e.address);
      if (it == live.end()) continue;
      if (it->second.second) out.previous_output_free = out.tokens.size();
      out.tokens.push_back("F" + std::to_string(it->second.first));
      live.erase(it);
    }
  }
  return out;
}

LargeEvents large_events(const Program& p, uint64_t output_bytes) {
  LargeEvents out;
  std::map<uint32_t, std::pair<uint64_t, bool>> live;  // tensor id -> (size, first output)
  bool seen = false;
  for (const MemoryEvent& e : p.events) {
    const uint64_t rounded = (e.bytes + 511) / 512 * 512;
    if (e.type == EventType::alloc && rounded > (1u << 20)) {
      const bool first = !seen && rounded == output_bytes;
      seen = seen || first;
      live[e.tensor] = {rounded, first};
      out.tokens.push_back("A" + std::to_string(rounded));
    } else if (e.type == EventType::free) {
      const auto it = live.find(e.tensor);
      if (it == live.end()) continue;
      if (it->second.second) out.previous_output_free = out.tokens.size();
      out.tokens.push_back("F" + std::to_string(it->second.first));
      live.erase(it);
    }
  }
  return out;
}

// The events around the previous output's free: `before` of them, the free, `after`.
std::vector<std::string> around_free(const LargeEvents& e, size_t before, size_t after) {
  const size_t at = e.previous_output_free;
  REQUIRE(at >= before);
  REQUIRE(at + after < e.tokens.size());
  return {e.tokens.begin() + static_cast<std::ptrdiff_t>(at - before),
          e.tokens.begin() + static_cast<std::ptrdiff_t>(at + after + 1)};
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

Scenario arch_run(const std::string& name, const std::string& keep_output) {
  return load_scenario(MEMSIM_SOURCE_DIR + "/tests/data/h100/arch/" + name + ".yaml",
                       {{"model.transformers", "5"}, {"step.keep_output", keep_output}});
}

}  // namespace

TEST_CASE("step.keep_output model-loss: the key", "[keep_output]") {
  const std::string base =
      "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 256, context_length: 64}\n"
      "batch: {micro_batch: 2, seq_len: 16}\n";
  const Scenario s = load_scenario_text(base + "step: {keep_output: model-loss}\n", "t.yaml");
  CHECK(s.step.keep_output);
  CHECK(s.step.model_computes_loss);
  CHECK_FALSE(s.step.output_dies_after_loss);
  CHECK(loss_in_model_forward(s));
  CHECK(default_script(s).rebind_output_after_loss);
  const Scenario plain = load_scenario_text(base, "t.yaml");
  CHECK_FALSE(plain.step.model_computes_loss);
  CHECK_FALSE(default_script(plain).rebind_output_after_loss);

  auto refused = [](const std::string& yaml, const std::string& needle) {
    try {
      (void)build_program(load_scenario_text(yaml, "t.yaml"));
    } catch (const std::exception& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
      return;
    }
    FAIL("accepted: " << yaml);
  };
  refused(base + "step: {kind: forward, keep_output: model-loss}\n", "t.yaml:3: step.keep_output");
  refused(base + "step: {keep_output: model-loss}\nloss: {impl: torch}\n", "step.keep_output");
  refused(base + "step: {keep_output: model-loss, compile: true}\n", "step.keep_output");
  refused("model: {family: cs336, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 256}\n"
          "batch: {micro_batch: 2, seq_len: 16}\nstep: {keep_output: model-loss}\n",
          "t.yaml:3: step.keep_output");
  refused(base + "step: {keep_output: outputs}\n", "expected true, false, loss or model-loss");
}

TEST_CASE("step.keep_output model-loss: the previous output dies after the in-forward loss, as in the H200 traces",
          "[keep_output][h100][arch][transformers5]") {
  // The large events around the free of the warm-up step's logits (B x S x V, the first
  // block of that size): in the trace and with model-loss, after the new logits and the
  // loss's log_softmax output (fixed_cross_entropy); with keep_output true right after the
  // new logits. Phi-3 on transformers 5.17 (every large allocation of the program is the
  // trace's, in order: tests/test_h100_arch_runs.cpp); bf16 logits: an fp32 log_softmax.
  struct Run {
    const char* name;
    uint64_t logits;
  };
  for (const Run& r : {Run{"tf_arch_phi3_l4_d1024_s1024_b4_fp32", 4ull * 1024 * 32064 * 4},
                       Run{"tf_arch_phi3_l4_d1024_s1024_b4_bf16", 4ull * 1024 * 32064 * 2}}) {
    INFO(r.name);
    const LargeEvents real =
        large_events(read_snapshot_file(kSnapshots + "/" + std::string(r.name) + ".pickle"), r.logits);
    const LargeEvents in = large_events(build_program(arch_run(r.name, "model-loss")), r.logits);
    const LargeEvents out = large_events(build_program(arch_run(r.name, "true")), r.logits);
    const std::vector<std::string> w_real = around_free(real, 4, 2), w_in = around_free(in, 4, 2),
                                   w_out = around_free(out, 4, 2);
    std::printf("%s around the previous logits' free:\n  trace       %s\n  model-loss  %s\n  true        %s\n",
                r.name, joined(w_real).c_str(), joined(w_in).c_str(), joined(w_out).c_str());
    CHECK(w_in == w_real);
    CHECK(w_out != w_real);
    // Everything before the free is the same sequence of large allocations as the trace's.
    auto allocs_before = [](const LargeEvents& e) {
      size_t n = 0;
      for (size_t i = 0; i < e.previous_output_free; ++i) n += e.tokens[i][0] == 'A';
      return n;
    };
    CHECK(allocs_before(in) == allocs_before(real));
    CHECK(allocs_before(out) < allocs_before(real));
  }
}

TEST_CASE("step.keep_output model-loss under FSDP2: the root's post-forward after the loss, "
          "then the previous logits die", "[keep_output][fsdp2-loss][fsdp2]") {
  // 2-layer hf-llama, fp32, FSDP2 over 4 ranks (tests/test_fsdp2_loss_in_forward.cpp's
  // model): the root's hooks placed as for keep_output: loss (the loss is one of the root's
  // outputs), the previous outputs dropped when model(...) has returned.
  const std::string y =
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n"
      "  d_ff: 1000\n  vocab: 1001\n  context_length: 64\n"
      "batch:\n  micro_batch: 2\n  seq_len: 64\n"
      "optimizer:\n  type: adamw\n  impl: foreach\n"
      "step:\n  kind: train\n  warmup_steps: 1\n  keep_output: model-loss\n"
      "parallel:\n  data: 4\n  sharding: fsdp2\n"
      "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  const Scenario s = load_scenario_text(y, "fsdp2_model_loss.yaml");
  REQUIRE(loss_in_model_forward(s));
  const Program p = build_program(s);
  size_t begin = 0;
  for (size_t i = 0; i < p.events.size(); ++i)
    if (p.events[i].type == EventType::mark && p.str(p.events[i].bytes) == "measured_step_begin") begin = i;
  REQUIRE(begin > 0);
  // The warm-up step's logits: the first alloc of B x S x V fp32 bytes.
  const uint64_t logits = 2ull * 64 * 1001 * 4;
  uint32_t previous = UINT32_MAX;
  for (size_t i = 0; i < begin && previous == UINT32_MAX; ++i)
    if (p.events[i].type == EventType::alloc && p.events[i].bytes == logits) previous = p.events[i].tensor;
  REQUIRE(previous != UINT32_MAX);
  const size_t npos = static_cast<size_t>(-1);
  size_t last_loss = npos, last_ag_free = npos, previous_free = npos, first_backward = npos;
  uint32_t forward_ag = UINT32_MAX;
  for (size_t i = begin; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::mark) continue;
    const bool ag = p.str(p.tensors[e.tensor].name).rfind("FSDP2 all-gather output (flat)", 0) == 0;
    if (e.type == EventType::alloc && ag && e.phase == Phase::forward) forward_ag = e.tensor;
    if (e.type == EventType::free && e.tensor == forward_ag && previous_free == npos) last_ag_free = i;
    if (e.type == EventType::free && e.tensor == previous) previous_free = i;
    if (e.type == EventType::alloc && e.phase == Phase::loss) last_loss = i;
    if (e.type == EventType::alloc && e.phase == Phase::backward && first_backward == npos) first_backward = i;
  }
  REQUIRE(previous_free != npos);
  REQUIRE(last_ag_free != npos);
  REQUIRE(first_backward != npos);
  CHECK(last_loss < last_ag_free);       // the root's post-forward after the loss
  CHECK(last_ag_free < previous_free);   // then `outputs = ` drops the previous outputs
  CHECK(previous_free < first_backward);
}
