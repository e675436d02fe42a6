// ZeRO stage 1 for cs336 / hf-* (sim/parallel/zero_redundancy.h): torch's ZeroRedundancyOptimizer
// partition and optimizer state checked against torch 1.13 (tests/data/zero/*.json from
// tools/fixtures/gen_zero_fixtures.py), the simulated rank, the ZeRO paper's P_os
// accounting, refusals, and the shipped scenario end to end.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "live_at_mark_test_support.h"
#include "json_test_support.h"
#include "cli_test_support.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/step/schedule.h"
#include "sim/parallel/zero_redundancy.h"
#include "sim/parallel/zero_sharding.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kZeroDir = MEMSIM_SOURCE_DIR + "/tests/data/zero";

using memsim_test::load_json;

// The fixture's model, DDP + ZeroRedundancyOptimizer(AdamW) on `world` ranks.
Scenario zero1_scenario(const nlohmann::json& f, const std::string& impl = "foreach") {
  const nlohmann::json& c = f["config"];
  const std::string family = f["family"];
  std::string y = "model:\n  family: " + family + "\n";
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += std::string("  tied_embeddings: ") + (family == "hf-gpt2" ? "true" : "false") + "\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "optimizer:\n  type: adamw\n  impl: " + impl + "\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "parallel:\n  data: " + std::to_string(f["world_size"].get<int>()) + "\n  zero: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "zero1.yaml");
}

using memsim_test::live;

}  // namespace

TEST_CASE("ZeroRedundancyOptimizer partition: largest first, to the first smallest rank",
          "[dp][zero]") {
  using V = std::vector<std::vector<int32_t>>;
  // 10 -> r0; 5 -> r1; 5 -> r1 (5 < 10); 3 -> r0 (tie at 10: the first); 2 -> r1.
  CHECK(zero_redundancy_partition({10, 5, 5, 3, 2}, 2) == V{{0, 3}, {1, 2, 4}});
  // Equal sizes keep registration order (Python's sorted is stable with reverse=True).
  CHECK(zero_redundancy_partition({5, 10, 5}, 2) == V{{1}, {0, 2}});
  CHECK(zero_redundancy_partition({7}, 3) == V{{0}, {}, {}});
  CHECK_THROWS(zero_redundancy_partition({1}, 0));
}

TEST_CASE("ZeRO-1 partitions and Adam state match torch 1.13's ZeroRedundancyOptimizer",
          "[dp][zero]") {
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kZeroDir)) {
    if (entry.path().extension() != ".json") continue;
    const nlohmann::json f = load_json(entry.path());
    INFO(entry.path().filename().string());
    const int64_t world = f["world_size"].get<int64_t>();
    std::vector<uint64_t> bytes, numel;
    for (const auto& q : f["parameters"]) {
      bytes.push_back(q["bytes"].get<uint64_t>());
      numel.push_back(bytes.back() / 4);
    }
    // Every rank's partition, in its local optimizer's order.
    const std::vector<std::vector<int32_t>> parts = zero_redundancy_partition(numel, world);
    REQUIRE(parts.size() == f["ranks"].size());
    int64_t worst = 0;
    uint64_t worst_bytes = 0;
    for (const auto& r : f["ranks"]) {
      const size_t rank = r["rank"].get<size_t>();
      CHECK(parts[rank] == r["owned"].get<std::vector<int32_t>>());
      uint64_t b = 0;
      for (int32_t i : parts[rank]) b += bytes[static_cast<size_t>(i)];
      CHECK(r["state_bytes"].get<uint64_t>() == 2 * b);  // exp_avg + exp_avg_sq, fp32
      if (r["state_bytes"].get<uint64_t>() > worst_bytes) {
        worst_bytes = r["state_bytes"].get<uint64_t>();
        worst = static_cast<int64_t>(rank);
      }
    }
    for (const char* impl : {"foreach", "for-loop", "fused"}) {
      INFO(impl);
      const Program p = build_program(zero1_scenario(f, impl));
      // Same parameters in the same order as torch's model.parameters().
      std::vector<uint64_t> params;
      for (const MemoryEvent& e : p.events)
        if (e.type == EventType::alloc && e.kind == TensorKind::parameter) params.push_back(e.bytes);
      REQUIRE(params == bytes);
      // The rank with the most state is simulated, and its state is torch's.
      CHECK(p.rank.index == worst);
      CHECK(p.rank.world_size == world);
      bool tie = true;
      for (const auto& r : f["ranks"]) tie = tie && r["state_bytes"].get<uint64_t>() == worst_bytes;
      CHECK(p.rank.why.find(tie ? std::string("rank 0 stands for all")
                                : "rank " + std::to_string(worst) + " has the largest") !=
            std::string::npos);
      // fused=True adds each parameter's `step`, a 0-d fp32 tensor on the device, first.
      const bool fused = std::string(impl) == "fused";
      const uint64_t steps = fused ? 4 * parts[static_cast<size_t>(worst)].size() : 0;
      CHECK(live(p, "optimizer_end", TensorKind::optimizer_state) == worst_bytes + steps);
      // Created lazily in the local optimizer's order: exp_avg, exp_avg_sq per parameter.
      std::vector<uint64_t> state_allocs, expect;
      for (const MemoryEvent& e : p.events)
        if (e.type == EventType::alloc && e.kind == TensorKind::optimizer_state)
          state_allocs.push_back(e.bytes);
      for (int32_t i : parts[static_cast<size_t>(worst)]) {
        if (fused) expect.push_back(4);
        expect.push_back(bytes[static_cast<size_t>(i)]);
        expect.push_back(bytes[static_cast<size_t>(i)]);
      }
      CHECK(state_allocs == expect);
      // foreach: one _foreach_sqrt result per owned parameter, all alive together.
      if (std::string(impl) == "foreach") {
        uint64_t temps = 0, peak = 0;
        for (const MemoryEvent& e : p.events) {
          if (e.phase != Phase::optimizer || p.tensors[e.tensor].kind != TensorKind::temporary) continue;
          if (e.type == EventType::alloc) temps += e.bytes;
          if (e.type == EventType::free) temps -= p.tensors[e.tensor].bytes;
          peak = std::max(peak, temps);
        }
        CHECK(2 * peak == worst_bytes);
      }
    }
    ++seen;
  }
  CHECK(seen == 4);
}

TEST_CASE("ZeRO-1 model states against the ZeRO paper's P_os accounting", "[dp][zero]") {
  // P_os: parameters and gradients whole on every rank, optimizer state divided by N_d.
  // memsim's torch run differs by (a) DDP's gradient buckets, a second copy of the
  // gradients (gradient_as_bucket_view=False), and (b) ZeroRedundancyOptimizer's whole-
  // parameter partition, whose largest share is a little above 1/N_d.
  const nlohmann::json f = load_json(std::string(kZeroDir) + "/llama_l4_d512_kv2_v8192_zero1_w4.json");
  const Scenario s = zero1_scenario(f);
  const Program p = build_program(s);
  Scenario ddp = s;
  ddp.parallel.zero = 0;
  const Program q = build_program(ddp);
  ModelStateBytes unsharded;
  unsharded.parameters = static_cast<double>(live(q, "optimizer_end", TensorKind::parameter));
  unsharded.gradients = unsharded.parameters;
  unsharded.optimizer_state = 2 * unsharded.parameters;
  const ModelStateBytes z1 = zero_stage_model_states(unsharded, 1, 4);
  CHECK(static_cast<double>(live(p, "optimizer_end", TensorKind::parameter)) == z1.parameters);
  // .grad plus the buckets: twice the paper's gradients.
  CHECK(static_cast<double>(live(p, "optimizer_end", TensorKind::gradient)) == 2 * z1.gradients);
  CHECK(live(p, "optimizer_end", TensorKind::gradient) == live(q, "optimizer_end", TensorKind::gradient));
  const double state = static_cast<double>(live(p, "optimizer_end", TensorKind::optimizer_state));
  CHECK(state >= z1.optimizer_state);
  CHECK(state / z1.optimizer_state == Approx(1.0).epsilon(0.01));
  // Plain DDP keeps the whole state.
  CHECK(static_cast<double>(live(q, "optimizer_end", TensorKind::optimizer_state)) ==
        unsharded.optimizer_state);
}

TEST_CASE("ZeRO-1 without FSDP: refusals by key", "[dp][zero][scenario]") {
  const nlohmann::json f = load_json(std::string(kZeroDir) + "/gpt2_l4_d512_v8192_zero1_w2.json");
  Scenario one = zero1_scenario(f);
  one.parallel.data = 1;
  CHECK_THROWS_WITH(build_program(one),
                    Catch::StartsWith("zero1.yaml: parallel.zero: ZeRO stage 1 on one GPU"));
  Scenario two = zero1_scenario(f);
  two.parallel.zero = 2;
  CHECK_THROWS_WITH(build_program(two), Catch::Contains("zero 1 is torch's ZeroRedundancyOptimizer"));
  // FSDP has no stage-1 strategy.
  const std::string base = "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n"
                           "  d_ff: 128\n  vocab: 100\nbatch:\n  seq_len: 16\nparallel:\n  data: 2\n";
  CHECK_THROWS_WITH(load_scenario_text(base + "  zero: 1\n  sharding: fsdp\n", "x.yaml"),
                    Catch::Contains("parallel.zero: FSDP shards"));
  CHECK_THROWS_WITH(load_scenario_text(base + "  zero: 1\n  cpu_offload: true\n", "x.yaml"),
                    Catch::Contains("parallel.cpu_offload: only applies"));
}

TEST_CASE("memsim run on gpt2-large-zero1-4xv100: fits with ZeRO-1, not with plain DDP",
          "[dp][zero][cli][scenarios]") {
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/gpt2-large-zero1-4xv100.yaml";
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --json - 2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["fits"] == true);
  CHECK(j["rank"]["world_size"] == 4);
  CHECK(j["rank"]["why"].get<std::string>().find("ZeroRedundancyOptimizer") != std::string::npos);
  const memsim_test::CommandResult ddp = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set parallel.zero=0 --json - 2>/dev/null");
  const nlohmann::json k = nlohmann::json::parse(ddp.out);
  CHECK(k["fits"] == false);
  // Model state after the step: the paper's 4 + 4 + 8/4 B/param plus DDP's buckets.
  const Program p = build_program(load_scenario(file));
  const double P = static_cast<double>(live(p, "optimizer_end", TensorKind::parameter)) / 4;
  const double states = static_cast<double>(live(p, "optimizer_end", TensorKind::parameter) +
                                            live(p, "optimizer_end", TensorKind::gradient) +
                                            live(p, "optimizer_end", TensorKind::optimizer_state));
  CHECK(states / P == Approx(4 + 4 + 4 + 8.0 / 4).epsilon(0.01));
}
