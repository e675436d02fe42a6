// FSDP MixedPrecision (parallel.fsdp_mixed_precision, sim/parallel/fsdp.h): fp32 shards and
// optimizer, low-precision gathered parameters, activations and gradients, the
// reduce-scattered shard cast back to fp32.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "sim/analysis/layer_bytes.h"
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

Scenario mp_scenario(const std::string& family, int64_t d, const std::string& extra = "",
                     const std::string& precision = "fp32") {
  std::string y = "model:\n  family: " + family +
                  "\n  layers: 4\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n  d_ff: 1024\n"
                  "  vocab: 1000\n  context_length: 64\n";
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n";
  y += "precision:\n  params: " + precision + "\n";
  y += "optimizer:\n  type: adamw\n  impl: foreach\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  if (d > 1) y += "parallel:\n  data: " + std::to_string(d) + "\n  sharding: fsdp\n" + extra;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "mp.yaml");
}

LiveBytes at(const Program& p, const char* mark) {
  const LiveBytes l = live_bytes_at_mark(p, mark);
  REQUIRE(l.found_mark);
  return l;
}
uint64_t kind(const LiveBytes& l, TensorKind k) { return l.by_kind[static_cast<int>(k)]; }

bool named(const Program& p, uint32_t t, const std::string& name) {
  return role_of(p.str(p.tensors[t].name)) == name;
}

const std::string kGathered = "FSDP all-gather";
const std::string kMpShard = "FSDP _mp_shard (low-precision shard)";
const std::string kStaged = "FSDP shard copied to GPU (flat_param_to(device))";
const std::string kShardGrad = "FSDP sharded grad";

}  // namespace

TEST_CASE("FSDP MixedPrecision bf16: fp32 model state, bf16 compute", "[fsdp][mixed]") {
  for (const char* family : {"hf-llama", "hf-gpt2", "cs336"}) {
    INFO(family);
    const Program fp32 = build_program(mp_scenario(family, 4));
    const Program mp = build_program(mp_scenario(family, 4, "  fsdp_mixed_precision: bf16\n"));
    // Shards, sharded gradients and AdamW state are fp32 either way: 16/d B/param.
    for (TensorKind k : {TensorKind::parameter, TensorKind::gradient, TensorKind::optimizer_state})
      CHECK(kind(at(mp, "optimizer_end"), k) == kind(at(fp32, "optimizer_end"), k));
    // The forward computes exactly what a bf16 model on one GPU computes: FSDP changes
    // where the parameters come from, not the activations.
    const Program bf16 = build_program(mp_scenario(family, 1, "", "bf16"));
    const Program one = build_program(mp_scenario(family, 1));
    CHECK(kind(at(mp, "forward_end"), TensorKind::activation) ==
          kind(at(bf16, "forward_end"), TensorKind::activation));
    CHECK(kind(at(fp32, "forward_end"), TensorKind::activation) ==
          kind(at(one, "forward_end"), TensorKind::activation));
    // The module is built in fp32 before it is wrapped (setup allocations as without MP).
    uint64_t setup_mp = 0, setup_fp32 = 0;
    for (const MemoryEvent& e : mp.events)
      if (e.type == EventType::alloc && e.phase == Phase::setup) setup_mp += e.bytes;
    for (const MemoryEvent& e : fp32.events)
      if (e.type == EventType::alloc && e.phase == Phase::setup) setup_fp32 += e.bytes;
    // (Except GPT-2's 0-d masked_bias buffers, left in the compute dtype: 2 B per layer,
    // both sizes round to one 512 B block.)
    CHECK(setup_fp32 - setup_mp == (std::string(family) == "hf-gpt2" ? 4u * 2u : 0u));
  }
}

TEST_CASE("FSDP MixedPrecision: _mp_shard before each all-gather, bf16 gathered parameters",
          "[fsdp][mixed]") {
  for (const char* extra : {"", "  cpu_offload: true\n"}) {
    const bool offload = std::string(extra).size() > 0;
    INFO("offload " << offload);
    const Program p = build_program(
        mp_scenario("hf-llama", 4, std::string("  fsdp_mixed_precision: bf16\n") + extra));
    const Program fp32 = build_program(mp_scenario("hf-llama", 4, extra));
    std::vector<uint64_t> gathered, gathered_fp32;
    for (const MemoryEvent& e : fp32.events)
      if (e.type == EventType::alloc && named(fp32, e.tensor, kGathered)) gathered_fp32.push_back(e.bytes);
    const size_t pre = offload ? 3 : 1;  // events between _mp_shard's alloc and the gather
    for (size_t i = 0; i < p.events.size(); ++i) {
      const MemoryEvent& e = p.events[i];
      if (e.type != EventType::alloc || !named(p, e.tensor, kGathered)) continue;
      gathered.push_back(e.bytes);
      REQUIRE(i >= pre);
      const MemoryEvent& mp = p.events[i - pre];
      CHECK(mp.type == EventType::alloc);
      CHECK(named(p, mp.tensor, kMpShard));
      CHECK(mp.bytes * 4 == e.bytes);  // one shard of d = 4, same dtype as the gather
      if (offload) {  // local_shard.to(device): an fp32 copy, freed once cast
        CHECK(named(p, p.events[i - 2].tensor, kStaged));
        CHECK(p.events[i - 2].bytes == 2 * mp.bytes);
        CHECK(p.events[i - 1].type == EventType::free);
        CHECK(p.events[i - 1].tensor == p.events[i - 2].tensor);
      }
      REQUIRE(i + 1 < p.events.size());
      CHECK(p.events[i + 1].type == EventType::free);  // post_unshard frees _mp_shard
      CHECK(p.events[i + 1].tensor == mp.tensor);
    }
    REQUIRE(gathered.size() == gathered_fp32.size());
    for (size_t k = 0; k < gathered.size(); ++k) CHECK(2 * gathered[k] == gathered_fp32[k]);
  }
}

TEST_CASE("FSDP MixedPrecision: the bf16 reduce-scatter output is cast to an fp32 shard",
          "[fsdp][mixed]") {
  const Program p = build_program(mp_scenario("hf-llama", 4, "  fsdp_mixed_precision: bf16\n"));
  size_t casts = 0;
  for (size_t i = 0; i + 2 < p.events.size(); ++i) {
    const MemoryEvent& a = p.events[i];
    if (a.type != EventType::alloc || !named(p, a.tensor, kShardGrad)) continue;
    const MemoryEvent& b = p.events[i + 1];
    if (b.type == EventType::alloc && named(p, b.tensor, kShardGrad)) {
      CHECK(b.bytes == 2 * a.bytes);         // fp32 copy of the bf16 shard
      CHECK(p.events[i + 2].type == EventType::free);
      CHECK(p.events[i + 2].tensor == a.tensor);
      ++casts;
    }
  }
  CHECK(casts == 2 * 5);  // two steps, five units each
}

TEST_CASE("FSDP MixedPrecision keys are validated", "[fsdp][mixed][scenario]") {
  CHECK(mp_scenario("hf-llama", 2, "  fsdp_mixed_precision: bf16\n").parallel.fsdp_mixed_precision ==
        DType::bf16);
  CHECK_FALSE(mp_scenario("hf-llama", 2, "  fsdp_mixed_precision: none\n")
                  .parallel.fsdp_mixed_precision.has_value());
  CHECK_THROWS_WITH(mp_scenario("hf-llama", 2, "  fsdp_mixed_precision: fp8\n"),
                    Catch::Contains("parallel.fsdp_mixed_precision: expected one of none, bf16, fp16"));
  const std::string base = "model:\n  family: hf-llama\n  layers: 2\n  d_model: 64\n  heads: 4\n"
                           "  d_ff: 128\n  vocab: 100\nbatch:\n  seq_len: 16\nparallel:\n  data: 2\n";
  CHECK_THROWS_WITH(load_scenario_text(base + "  fsdp_mixed_precision: bf16\n", "x.yaml"),
                    Catch::Contains("parallel.fsdp_mixed_precision: only applies"));
  CHECK_THROWS_WITH(
      build_program(mp_scenario("hf-llama", 2, "  fsdp_mixed_precision: bf16\n", "bf16")),
      Catch::StartsWith("mp.yaml: parallel.fsdp_mixed_precision: FSDP MixedPrecision casts fp32"));
}

TEST_CASE("llama2-7b-fsdp-bf16-8xa100: 16/8 B/param of fp32 state, bf16 activations",
          "[fsdp][mixed][scenarios]") {
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-fsdp-bf16-8xa100.yaml");
  REQUIRE(s.parallel.fsdp_mixed_precision == DType::bf16);
  const Program p = build_program(s);
  const double P = 6738415616.0;
  const LiveBytes l = at(p, "optimizer_end");
  CHECK(static_cast<double>(kind(l, TensorKind::parameter) + kind(l, TensorKind::gradient) +
                            kind(l, TensorKind::optimizer_state)) / P ==
        Approx(16.0 / 8).epsilon(1e-6));
  Scenario fp32 = s;
  fp32.parallel.fsdp_mixed_precision.reset();
  const Program q = build_program(fp32);
  const double ratio = static_cast<double>(kind(at(p, "forward_end"), TensorKind::activation)) /
                       static_cast<double>(kind(at(q, "forward_end"), TensorKind::activation));
  CHECK(ratio > 0.5);   // the fp32 logits copy for the loss stays fp32
  CHECK(ratio < 0.6);
}

TEST_CASE("FSDP lazy init: each handle's buffers are made and freed at the first forward",
          "[fsdp][mixed]") {
  const std::string lazy = "FSDP lazy init (zeros, storage freed at once)";
  for (const char* extra : {"", "  fsdp_mixed_precision: bf16\n"}) {
    const bool mp = std::string(extra).size() > 0;
    INFO("mixed precision " << mp);
    const Program p = build_program(mp_scenario("hf-llama", 4, extra));
    std::vector<uint64_t> sizes;
    bool seen_gather = false;
    for (size_t i = 0; i < p.events.size(); ++i) {
      const MemoryEvent& e = p.events[i];
      if (e.type == EventType::alloc && named(p, e.tensor, kGathered)) seen_gather = true;
      if (e.type != EventType::alloc || !named(p, e.tensor, lazy)) continue;
      CHECK_FALSE(seen_gather);  // before the root's first all-gather
      CHECK(e.phase == Phase::forward);
      REQUIRE(i + 1 < p.events.size());
      CHECK(p.events[i + 1].type == EventType::free);
      CHECK(p.events[i + 1].tensor == e.tensor);
      sizes.push_back(e.bytes);
    }
    CHECK(sizes.size() == (mp ? 3u : 1u) * 5u);  // root + 4 layers
    if (mp) {  // _mp_shard (bf16 shard), _full_param_padded (bf16), fp32 padded
      for (size_t k = 0; k + 2 < sizes.size(); k += 3) {
        CHECK(sizes[k] * 4 == sizes[k + 1]);
        CHECK(sizes[k + 1] * 2 == sizes[k + 2]);
      }
    }
  }
}
