// Autocast with torch DDP (and ZeRO-1): the composition is exact. A data-parallel rank
// runs the single-GPU autocast program event for event, plus DDP's gradient buckets
// (and, with ZeRO-1, only its partition's optimizer state): the weight-cast cache keys
// on fp32 leaf parameters, which DDP leaves alone, and DDP's hooks see fp32 gradients.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "sim/analysis/layer_bytes.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

Scenario tiny(const std::string& family, int64_t d, const std::string& extra = "") {
  std::string y = "model:\n  family: " + family +
                  "\n  layers: 3\n  d_model: 128\n  heads: 4\n  kv_heads: 4\n  d_ff: 512\n"
                  "  vocab: 1000\n  context_length: 64\n";
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n";
  y += "precision:\n  params: fp32\n  autocast: bf16\n";
  y += "optimizer:\n  type: adamw\n  impl: foreach\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "parallel:\n  data: " + std::to_string(d) + "\n" + extra;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "dp-autocast.yaml");
}

// What an event is, tensor ids left out (they shift by the buckets'). Frees carry their
// tensor's size and name.
using Key = std::tuple<int, int, int, int32_t, uint64_t, std::string, std::string>;
std::vector<Key> keys(const Program& p, bool drop_buckets) {
  std::vector<Key> out;
  for (const MemoryEvent& e : p.events) {
    const bool mark = e.type == EventType::mark;
    const std::string name = mark ? std::string() : std::string(p.str(p.tensors[e.tensor].name));
    if (drop_buckets && name == "ddp.reducer.bucket") continue;
    out.emplace_back(int(e.type), int(e.kind), int(e.phase), e.layer,
                     mark ? 0 : p.tensors[e.tensor].bytes, std::string(p.str(e.op)), name);
  }
  return out;
}

}  // namespace

TEST_CASE("autocast + DDP = the single-GPU autocast program + DDP's buckets", "[dp][autocast]") {
  for (const char* family : {"cs336", "hf-llama"}) {
    INFO(family);
    const Program one = build_program(tiny(family, 1));
    const Program ddp = build_program(tiny(family, 4));
    CHECK(ddp.rank.world_size == 4);
    CHECK(keys(ddp, true) == keys(one, false));
    // The buckets hold fp32 gradients: the parameters' bytes (one initial bucket, then
    // the rebuilt ones).
    uint64_t buckets = 0;
    for (const MemoryEvent& e : ddp.events)
      if (e.type == EventType::alloc && ddp.str(ddp.tensors[e.tensor].name) == "ddp.reducer.bucket")
        buckets += e.bytes;
    const uint64_t params = live_bytes_at_mark(one, "optimizer_end").by_kind[int(TensorKind::parameter)];
    CHECK(buckets == 2 * params);
  }
}

TEST_CASE("autocast + ZeRO-1: the DDP program with the partition's optimizer state", "[dp][autocast][zero]") {
  const Program ddp = build_program(tiny("hf-llama", 4));
  const Program z1 = build_program(tiny("hf-llama", 4, "  zero: 1\n"));
  // Forward and backward are the same; only the (warm-up step's) optimizer state differs.
  LiveBytes a = live_bytes_at_mark(ddp, "backward_end");
  LiveBytes b = live_bytes_at_mark(z1, "backward_end");
  REQUIRE(a.found_mark);
  REQUIRE(b.found_mark);
  CHECK(a.by_kind[int(TensorKind::optimizer_state)] > b.by_kind[int(TensorKind::optimizer_state)]);
  a.by_kind[int(TensorKind::optimizer_state)] = b.by_kind[int(TensorKind::optimizer_state)] = 0;
  CHECK(a.by_kind == b.by_kind);
  const uint64_t state_all = live_bytes_at_mark(ddp, "optimizer_end").by_kind[int(TensorKind::optimizer_state)];
  const uint64_t state_z1 = live_bytes_at_mark(z1, "optimizer_end").by_kind[int(TensorKind::optimizer_state)];
  CHECK(state_z1 < state_all / 3);
  CHECK(state_z1 >= state_all / 4);
}

TEST_CASE("autocast with FSDP's MixedPrecision outside Accelerate's step is refused by key",
          "[dp][autocast][fsdp]") {
  // Autocast under plain FSDP is modelled (tests/test_fsdp_autocast.cpp); with FSDP's
  // MixedPrecision as well only as Accelerate's FSDP1 bf16 path, in HF Trainer's step
  // (tests/test_fsdp1_accelerate.cpp).
  CHECK_NOTHROW(build_program(tiny("hf-llama", 4, "  sharding: fsdp\n")));
  CHECK_THROWS_WITH(
      build_program(tiny("hf-llama", 4, "  sharding: fsdp\n  fsdp_mixed_precision: bf16\n")),
      Catch::StartsWith("dp-autocast.yaml: step.keep_output: Accelerate's FSDP1 bf16 path is "
                        "modelled for HF Trainer's step"));
}
