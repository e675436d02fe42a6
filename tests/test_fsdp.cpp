// FSDP (sim/parallel/fsdp.h) on the hf and cs336 families: what is sharded, what is gathered when,
// and the model states against the ZeRO-3 / ZeRO-2 accounting.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "live_at_mark_test_support.h"
#include "cli_test_support.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/parallel/zero_sharding.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// A buffer's role without the unit it belongs to: the reports name FSDP buffers
// "<role> of block 7" / "<role> of the root" (program/tensor_names.h).
std::string role_of(const std::string& name) {
  for (const char* unit : {" of block ", " of the root"}) {
    const size_t at = name.rfind(unit);
    if (at != std::string::npos) return name.substr(0, at);
  }
  return name;
}

Scenario fsdp_scenario(const std::string& family, int64_t d, const std::string& extra = "") {
  std::string y = "model:\n  family: " + family +
                  "\n  layers: 4\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n  d_ff: 1024\n"
                  "  vocab: 1000\n  context_length: 64\n";
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n";
  y += "optimizer:\n  type: adamw\n  impl: for-loop\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "parallel:\n  data: " + std::to_string(d) + "\n  sharding: fsdp\n" + extra;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "fsdp.yaml");
}

using memsim_test::live;

// Sum of a named tensor's live bytes at each event; returns the maximum count live.
int max_live_named(const Program& p, const std::string& name, Phase phase) {
  std::vector<char> is(p.tensors.size(), 0);
  for (size_t t = 0; t < p.tensors.size(); ++t) is[t] = role_of(p.str(p.tensors[t].name)) == name;
  int live = 0, best = 0;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc && is[e.tensor]) ++live;
    if (e.type == EventType::free && is[e.tensor]) --live;
    if (e.phase == phase) best = std::max(best, live);
  }
  return best;
}

uint64_t parameter_count_bytes(const Scenario& single) {
  Scenario s = single;
  s.parallel = ParallelConfig{};
  const Program p = build_program(s);
  return live(p, "optimizer_end", TensorKind::parameter);
}

}  // namespace

TEST_CASE("FSDP FULL_SHARD keeps 16/d bytes of model state per fp32 parameter", "[fsdp][zero]") {
  for (const char* family : {"hf-llama", "hf-gpt2", "cs336"}) {
    for (int64_t d : {2, 8}) {
      INFO(family << " d = " << d);
      const Scenario s = fsdp_scenario(family, d);
      REQUIRE(s.parallel.zero == 3);
      const double P = static_cast<double>(parameter_count_bytes(s)) / 4;  // fp32
      const Program p = build_program(s);
      const double params = static_cast<double>(live(p, "optimizer_end", TensorKind::parameter));
      const double grads = static_cast<double>(live(p, "optimizer_end", TensorKind::gradient));
      const double state =
          static_cast<double>(live(p, "optimizer_end", TensorKind::optimizer_state));
      // Shards are padded to a multiple of d per unit: at most d - 1 elements each.
      CHECK(params / P == Approx(4.0 / d).epsilon(1e-4));
      CHECK(grads / P == Approx(4.0 / d).epsilon(1e-4));
      CHECK(state / P == Approx(8.0 / d).epsilon(1e-4));
      CHECK(p.rank.data == d);
    }
  }
}

TEST_CASE("FSDP gathers one layer in forward and two in backward (prefetch)", "[fsdp]") {
  const Program full = build_program(fsdp_scenario("hf-llama", 4));
  const std::string gathered = "FSDP all-gather";
  // The root's unit stays gathered from its forward through its backward.
  CHECK(max_live_named(full, gathered, Phase::forward) == 2);   // root + the running layer
  CHECK(max_live_named(full, gathered, Phase::backward) == 3);  // root + layer + prefetched
  for (const char* family : {"hf-gpt2", "cs336"}) {
    INFO(family);
    const Program f = build_program(fsdp_scenario(family, 4));
    CHECK(max_live_named(f, gathered, Phase::forward) == 2);
    CHECK(max_live_named(f, gathered, Phase::backward) == 3);
  }
  // Recomputation inside the backward uses the units the backward gathered.
  const Program ckpt = build_program(fsdp_scenario("hf-llama", 4, "checkpoint:\n  policy: full\n"));
  CHECK(max_live_named(ckpt, gathered, Phase::backward) == 3);
  // SHARD_GRAD_OP keeps every layer gathered from its forward to its backward.
  const Program op = build_program(
      fsdp_scenario("hf-llama", 4, "  reshard_after_forward: false\n"));
  REQUIRE(op.events.size() > 0);
  CHECK(max_live_named(op, gathered, Phase::forward) == 5);
  // At forward_end: FULL_SHARD holds the shards and the root; SHARD_GRAD_OP every layer too.
  const uint64_t p_full = live(full, "forward_end", TensorKind::parameter);
  const uint64_t p_op = live(op, "forward_end", TensorKind::parameter);
  const uint64_t P = parameter_count_bytes(fsdp_scenario("hf-llama", 4));
  CHECK(p_op > p_full);
  CHECK(p_op < P + P / 4 + 4096);  // all gathered + the shards (+ padding)
  CHECK(p_op > P);
}

TEST_CASE("FSDP keys are validated and unmodelled combinations refused", "[fsdp][scenario]") {
  CHECK(fsdp_scenario("hf-llama", 2, "  zero: 2\n").parallel.reshard_after_forward == false);
  CHECK_THROWS_WITH(fsdp_scenario("hf-llama", 2, "  zero: 1\n"),
                    Catch::Contains("parallel.zero: FSDP shards"));
  CHECK_THROWS_WITH(fsdp_scenario("hf-llama", 2, "  zero: 3\n  reshard_after_forward: false\n"),
                    Catch::Contains("parallel.reshard_after_forward: disagrees"));
  CHECK_THROWS_WITH(fsdp_scenario("hf-llama", 2, "  reshard_after_forward: true\n  zero: 0\n"),
                    Catch::Contains("parallel.zero: FSDP shards"));
  const std::string base = "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n"
                           "  d_ff: 128\n  vocab: 100\nbatch:\n  seq_len: 16\n";
  CHECK_THROWS_WITH(load_scenario_text(base, "x.yaml", {{"parallel.reshard_after_forward", "true"}}),
                    Catch::Contains("parallel.reshard_after_forward: only applies"));
  CHECK_THROWS_WITH(load_scenario_text(base, "x.yaml", {{"parallel.sharding", "zero"}}),
                    Catch::Contains("parallel.sharding: expected one of none, fsdp, deepspeed"));
  CHECK_THROWS_WITH(build_program(load_scenario_text(base, "x.yaml", {{"parallel.zero", "3"}})),
                    Catch::StartsWith("x.yaml: parallel.zero: ZeRO stage 3 for 'hf-llama'"));
  Scenario ds = fsdp_scenario("hf-llama", 2);
  ds.parallel.sharding = Sharding::deepspeed;
  // DeepSpeed is modelled (tests/test_deepspeed.cpp), but not ZeRO-3 in fp32.
  CHECK_THROWS_WITH(build_program(ds), Catch::StartsWith("fsdp.yaml: precision.params: ZeRO-3 without bf16/fp16"));
  CHECK_THROWS_WITH(build_program(fsdp_scenario("hf-llama", 1)),
                    Catch::StartsWith("fsdp.yaml: parallel.sharding: FSDP on one GPU"));
}

TEST_CASE("llama2-7b-fsdp-8xa100: 16/8 bytes of model state per parameter on each GPU",
          "[fsdp][scenarios]") {
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-fsdp-8xa100.yaml");
  const Program p = build_program(s);
  const double P = 6738415616.0;  // LlamaForCausalLM 7B (untied LM head)
  const LiveBytes l = live_bytes_at_mark(p, "optimizer_end");
  REQUIRE(l.found_mark);
  const double states = static_cast<double>(l.by_kind[int(TensorKind::parameter)] +
                                            l.by_kind[int(TensorKind::gradient)] +
                                            l.by_kind[int(TensorKind::optimizer_state)]);
  CHECK(states / P == Approx(16.0 / 8).epsilon(1e-6));
  CHECK(p.rank.world_size == 8);
}

TEST_CASE("memsim run --json reports the simulated rank of an FSDP job", "[fsdp][cli]") {
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-fsdp-8xa100.yaml' --json - 2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["rank"]["world_size"] == 8);
  CHECK(j["rank"]["data_parallel"] == 8);
  CHECK(j["rank"]["index"] == 0);
  CHECK(j["rank"]["why"].get<std::string>().find("FSDP stage 3") != std::string::npos);
}

TEST_CASE("FSDP fsdp_init: cpu moves the model to the GPU one unit at a time", "[fsdp]") {
  auto setup_peak = [](const Program& p) {
    uint64_t live = 0, peak = 0;
    for (const MemoryEvent& e : p.events) {
      if (e.phase != Phase::setup) continue;
      if (e.type == EventType::alloc) live += e.bytes;
      if (e.type == EventType::free) live -= p.tensors[e.tensor].bytes;
      peak = std::max(peak, live);
    }
    return peak;
  };
  const Scenario gpu = fsdp_scenario("hf-llama", 8);
  const Scenario cpu = fsdp_scenario("hf-llama", 8, "  fsdp_init: cpu\n");
  REQUIRE(cpu.parallel.fsdp_init_on_cpu);
  const uint64_t P = parameter_count_bytes(gpu);
  const Program on_gpu = build_program(gpu);
  const Program on_cpu = build_program(cpu);
  CHECK(setup_peak(on_gpu) > P);  // the whole model, then each flat copy
  // The root (embedding + LM head) is the largest unit: it and its flat copy, plus the
  // layer shards already made.
  CHECK(setup_peak(on_cpu) < P * 3 / 4);
  // After setup both hold the same shards, and the training step is the same.
  CHECK(live(on_gpu, "optimizer_end", TensorKind::parameter) ==
        live(on_cpu, "optimizer_end", TensorKind::parameter));
  CHECK_THROWS_WITH(load_scenario_text("model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n"
                                       "  heads: 4\n  d_ff: 128\n  vocab: 100\nbatch:\n"
                                       "  seq_len: 16\nparallel:\n  fsdp_init: cpu\n",
                                       "x.yaml"),
                    Catch::Contains("parallel.fsdp_init: only applies"));
}
