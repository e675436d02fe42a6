// FSDP CPUOffload(offload_params=True) (parallel.cpu_offload, sim/parallel/fsdp.h): what stays on
// the GPU, event by event, and the model states against the ZeRO / ZeRO-Offload accounting.
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

Scenario offload_scenario(const std::string& family, int64_t d, const std::string& extra = "",
                          const std::string& optimizer = "adamw", int64_t grad_accum = 1) {
  std::string y = "model:\n  family: " + family +
                  "\n  layers: 4\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n  d_ff: 1024\n"
                  "  vocab: 1000\n  context_length: 64\n";
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n  grad_accum: " + std::to_string(grad_accum) + "\n";
  y += "optimizer:\n  type: " + optimizer + "\n  impl: foreach\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "parallel:\n  data: " + std::to_string(d) + "\n  sharding: fsdp\n" + extra;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "offload.yaml");
}

using memsim_test::live;

bool named(const Program& p, uint32_t tensor, const std::string& name) {
  return role_of(p.str(p.tensors[tensor].name)) == name;
}

// Largest number of tensors named `name` alive at once.
int max_live_named(const Program& p, const std::string& name) {
  int n = 0, best = 0;
  for (const MemoryEvent& e : p.events) {
    if (!named(p, e.tensor, name)) continue;
    if (e.type == EventType::alloc) best = std::max(best, ++n);
    if (e.type == EventType::free) --n;
  }
  return best;
}

// Peak of the live bytes of one kind over the training steps (setup left out: there the
// model is built whole on the GPU before FSDP wraps it).
uint64_t peak_of_kind(const Program& p, TensorKind k) {
  uint64_t live = 0, peak = 0;
  for (const MemoryEvent& e : p.events) {
    if (p.tensors[e.tensor].kind != k) continue;
    if (e.type == EventType::alloc) live += e.bytes;
    if (e.type == EventType::free) live -= p.tensors[e.tensor].bytes;
    if (e.phase != Phase::setup) peak = std::max(peak, live);
  }
  return peak;
}

const std::string kGathered = "FSDP all-gather";
const std::string kStaged = "FSDP shard copied to GPU (flat_param_to(device))";
const std::string kShardGrad = "FSDP sharded grad";

}  // namespace

TEST_CASE("FSDP cpu_offload: no optimizer state or temporaries on the GPU", "[fsdp][offload]") {
  for (const char* family : {"hf-llama", "hf-gpt2", "cs336"}) {
    for (const char* opt : {"adamw", "sgd"}) {
      INFO(family << " " << opt);
      const Program p = build_program(offload_scenario(family, 4, "  cpu_offload: true\n", opt));
      for (const MemoryEvent& e : p.events) {
        CHECK(p.tensors[e.tensor].kind != TensorKind::optimizer_state);
        if (e.type == EventType::alloc) CHECK(e.phase != Phase::optimizer);
      }
      // After the step the GPU holds no model state at all: shards, their gradients and
      // AdamW's moments are CPU tensors; every unit was resharded by the final callback.
      CHECK(live(p, "optimizer_end", TensorKind::parameter) == 0);
      CHECK(live(p, "optimizer_end", TensorKind::gradient) == 0);
      CHECK(live(p, "backward_end", TensorKind::gradient) == 0);
    }
  }
}

TEST_CASE("FSDP cpu_offload: each all-gather stages its CPU shard on the GPU first",
          "[fsdp][offload]") {
  const Scenario s = offload_scenario("hf-llama", 4, "  cpu_offload: true\n");
  const Program p = build_program(s);
  size_t gathers = 0;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type != EventType::alloc || !named(p, e.tensor, kGathered)) continue;
    ++gathers;
    // alloc(staged shard), alloc(gathered), free(staged shard): in that order.
    REQUIRE(i >= 1);
    REQUIRE(i + 1 < p.events.size());
    const MemoryEvent& before = p.events[i - 1];
    const MemoryEvent& after = p.events[i + 1];
    CHECK(before.type == EventType::alloc);
    CHECK(named(p, before.tensor, kStaged));
    CHECK(before.bytes * 4 == e.bytes);  // one shard of d = 4
    CHECK(after.type == EventType::free);
    CHECK(after.tensor == before.tensor);
  }
  CHECK(gathers > 0);
  CHECK(max_live_named(p, kStaged) == 1);
  // Without offload the shard is already on the GPU: nothing is staged.
  const Program on_gpu = build_program(offload_scenario("hf-llama", 4));
  CHECK(max_live_named(on_gpu, kStaged) == 0);
}

TEST_CASE("FSDP cpu_offload: shard gradients stay on the GPU until the backward ends",
          "[fsdp][offload]") {
  for (int64_t accum : {1, 2}) {
    INFO("grad_accum " << accum);
    const Scenario s = offload_scenario("hf-llama", 4, "  cpu_offload: true\n", "adamw", accum);
    const Program p = build_program(s);
    // _saved_grad_shard of every unit (4 layers + root) is alive at the final callback,
    // then deleted; with accumulation each micro-batch makes new ones.
    CHECK(max_live_named(p, kShardGrad) == 5);
    int live = 0;
    for (const MemoryEvent& e : p.events) {
      if (!named(p, e.tensor, kShardGrad)) continue;
      if (e.type == EventType::alloc) {
        ++live;
        CHECK(e.phase == Phase::backward);
      } else if (e.type == EventType::free) {
        --live;
      }
    }
    CHECK(live == 0);
  }
}

TEST_CASE("FSDP cpu_offload against the ZeRO / ZeRO-Offload model-state accounting",
          "[fsdp][offload][zero]") {
  // ZeRO stage 3 keeps 16/d bytes per fp32 parameter with Adam on each GPU for good; the
  // offloaded variant (ZeRO-Offload / ZeRO-Infinity: optimizer state, fp32 parameters
  // and gradients on the CPU) keeps none: the GPU only holds the parameters of the
  // units in flight. memsim's FSDP adds what torch allocates on top of that: the GPU copy
  // of a shard while it is all-gathered and the shard gradients until the final
  // backward callback (at most 4/d bytes per parameter).
  const int64_t d = 8;
  const Scenario off = offload_scenario("hf-llama", d, "  cpu_offload: true\n");
  const Scenario on = offload_scenario("hf-llama", d);
  const Program p_off = build_program(off);
  const Program p_on = build_program(on);
  Scenario single = on;
  single.parallel = ParallelConfig{};
  const Program p_single = build_program(single);
  const double P = static_cast<double>(live(p_single, "optimizer_end", TensorKind::parameter));
  ModelStateBytes unsharded;
  unsharded.parameters = P;
  unsharded.gradients = P;
  unsharded.optimizer_state = 2 * P;
  const ModelStateBytes z3 = zero_stage_model_states(unsharded, 3, d);
  auto states = [](const Program& p) {
    return static_cast<double>(live(p, "optimizer_end", TensorKind::parameter) +
                               live(p, "optimizer_end", TensorKind::gradient) +
                               live(p, "optimizer_end", TensorKind::optimizer_state));
  };
  CHECK(states(p_on) / z3.total() == Approx(1.0).epsilon(1e-3));
  CHECK(states(p_off) == 0.0);
  // Parameters on the GPU at any time: the root and two layers gathered, plus one staged
  // shard; gradients: the per-parameter gradients of the layers in the backward, the
  // flat gradient being reduce-scattered, and the shard gradients (<= P / d).
  const uint64_t param_peak = peak_of_kind(p_off, TensorKind::parameter);
  const uint64_t param_peak_on = peak_of_kind(p_on, TensorKind::parameter);
  // Offload holds no shards on the GPU: its parameter peak is the in-flight working set,
  // lower than with shards resident by about P / d (the staged shard is at most one unit's).
  CHECK(param_peak < param_peak_on);
  CHECK(static_cast<double>(param_peak_on - param_peak) > 0.5 * P / d);
  CHECK(static_cast<double>(param_peak) < 0.6 * P);  // root (emb + head) + 2 layers
  // The whole step's peak allocation drops by at least the sharded optimizer state.
  CHECK(static_cast<double>(peak_of_kind(p_on, TensorKind::optimizer_state)) ==
        Approx(z3.optimizer_state).epsilon(1e-3));
}

TEST_CASE("FSDP cpu_offload keys are validated and refused outside FSDP", "[fsdp][offload][scenario]") {
  const Scenario s = offload_scenario("hf-llama", 2, "  cpu_offload: true\n");
  CHECK(s.parallel.cpu_offload);
  CHECK_FALSE(offload_scenario("hf-llama", 2).parallel.cpu_offload);
  CHECK_THROWS_WITH(offload_scenario("hf-llama", 2, "  cpu_offload: yes please\n"),
                    Catch::Contains("parallel.cpu_offload"));
  const std::string base = "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n"
                           "  d_ff: 128\n  vocab: 100\nbatch:\n  seq_len: 16\nparallel:\n  data: 2\n";
  CHECK_THROWS_WITH(load_scenario_text(base + "  cpu_offload: true\n", "x.yaml"),
                    Catch::Contains("parallel.cpu_offload: only applies with parallel.sharding: fsdp"));
  CHECK_THROWS_WITH(build_program(offload_scenario("hf-llama", 2, "  cpu_offload: true\n", "adamw8bit")),
                    Catch::StartsWith("offload.yaml: optimizer.type: bitsandbytes 8-bit"));
}

TEST_CASE("memsim run on llama2-7b-fsdp-offload-8xa100: no model state on the GPU after the step",
          "[fsdp][offload][cli][scenarios]") {
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-fsdp-offload-8xa100.yaml' --json - 2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["rank"]["world_size"] == 8);
  CHECK(j["rank"]["why"].get<std::string>().find("CPUOffload") != std::string::npos);
  // The same model without offload keeps the shards and AdamW state: 16/8 B/param.
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-fsdp-offload-8xa100.yaml");
  const Program p = build_program(s);
  const LiveBytes l = live_bytes_at_mark(p, "optimizer_end");
  REQUIRE(l.found_mark);
  CHECK(l.by_kind[int(TensorKind::parameter)] + l.by_kind[int(TensorKind::gradient)] +
            l.by_kind[int(TensorKind::optimizer_state)] == 0);
  Scenario plain = s;
  plain.parallel.cpu_offload = false;
  const Program q = build_program(plain);
  const LiveBytes m = live_bytes_at_mark(q, "optimizer_end");
  const double P = 6738415616.0;
  CHECK(static_cast<double>(m.by_kind[int(TensorKind::parameter)] +
                            m.by_kind[int(TensorKind::gradient)] +
                            m.by_kind[int(TensorKind::optimizer_state)]) / P ==
        Approx(16.0 / 8).epsilon(1e-6));
}
