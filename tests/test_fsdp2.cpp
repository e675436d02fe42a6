// FSDP2 (sim/parallel/fsdp2.h): the event structure and byte counts of fully_shard on a
// small model, checked against hand arithmetic from the rules of torch's
// _fully_shard/ sources (docs/fsdp2.md). No GPU run backs these numbers: they are the
// source's rules applied by hand, so a change in the emitter that breaks a rule fails here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "live_at_mark_test_support.h"
#include "cli_test_support.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/parallel/fsdp2.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// A buffer's role without the unit it belongs to: the reports name FSDP buffers
// "<role> of block 7" / "<role> of the root" (program/tensor_names.h).
// Per-parameter buffers name their parameter ("FSDP2 shard of model.layers.0.mlp.up_proj.weight
// (padded chunk 0)"): P stands for it here.
std::string role_of(const std::string& name) {
  for (const char* per_param : {"FSDP2 shard of ", "FSDP2 unsharded ", "FSDP2 post-forward shard of "}) {
    const std::string prefix = per_param;
    const size_t end = name.find(" (", prefix.size());
    if (name.rfind(prefix, 0) == 0 && end != std::string::npos) return prefix + "P" + name.substr(end);
  }
  for (const char* unit : {" of block ", " of the root"}) {
    const size_t at = name.rfind(unit);
    if (at != std::string::npos) return name.substr(0, at);
  }
  return name;
}

// Tensor t's own name, without its unit; "" for a tensor named after a parameter it
// derives from (TensorInfo::role: the exp_avg of a sharded param is not that param).
std::string own_name(const Program& p, size_t t) {
  if (p.tensors[t].role != NameRole::none) return std::string();
  return role_of(p.str(p.tensors[t].name));
}

// 2-layer hf-llama: D 256, F 1000, vocab 1001 (its rows pad: ceil(1001 / 4) = 251).
Scenario fsdp2_scenario(const std::string& extra = "", const std::string& family = "hf-llama",
                        int64_t data = 4, const std::string& sharding = "fsdp2") {
  std::string y = "model:\n  family: " + family +
                  "\n  layers: 2\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n  d_ff: 1000\n"
                  "  vocab: 1001\n  context_length: 64\n";
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n";
  y += "optimizer:\n  type: adamw\n  impl: foreach\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "parallel:\n  data: " + std::to_string(data) + "\n  sharding: " + sharding + "\n" + extra;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "fsdp2.yaml");
}

// Hand arithmetic, fp32 (e = 4), ws = 4. Per block: q, k, v, o (256 x 256): 64 rows x 256
// = 16384 each; gate, up (1000 x 256): 250 x 256 = 64000 each; down (256 x 1000): 64 x
// 1000 = 64000; two norms (256): 64 each.
constexpr uint64_t kBlockShardNumel = 4 * 16384 + 3 * 64000 + 2 * 64;  // 257664
// Root: embed_tokens and lm_head (1001 x 256): ceil(1001 / 4) = 251 rows x 256 = 64256
// each; the final norm 64.
constexpr uint64_t kRootShardNumel = 2 * 64256 + 64;  // 128576

std::vector<const MemoryEvent*> allocs_named(const Program& p, const std::string& name) {
  std::vector<const MemoryEvent*> out;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && own_name(p, e.tensor) == name) out.push_back(&e);
  return out;
}

// Maximum live bytes of the tensors named `name` over the events of `phase`.
uint64_t max_live_named(const Program& p, const std::string& name, Phase phase) {
  std::vector<char> is(p.tensors.size(), 0);
  for (size_t t = 0; t < p.tensors.size(); ++t) is[t] = own_name(p, t) == name;
  uint64_t live = 0, best = 0;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc && is[e.tensor]) live += e.bytes;
    if (e.type == EventType::free && is[e.tensor]) live -= p.tensors[e.tensor].bytes;
    if (e.phase == phase) best = std::max(best, live);
  }
  return best;
}

using memsim_test::live;

const std::string kAgOut = "FSDP2 all-gather output (flat)";
const std::string kUnsharded = "FSDP2 unsharded P (all_gather_outputs)";
const std::string kRsIn = "FSDP2 reduce-scatter input (chunk_cat)";
const std::string kRsOut = "FSDP2 reduce-scatter output";

}  // namespace

TEST_CASE("FSDP2 shards each parameter on dim 0 (padded chunk 0) and keeps only shards",
          "[fsdp2]") {
  const Scenario s = fsdp2_scenario();
  REQUIRE(s.parallel.sharding == Sharding::fsdp2);
  const Program p = build_program(s);
  const uint64_t shards = (2 * kBlockShardNumel + kRootShardNumel) * 4;  // 2575616 B
  // After the step: the shards, their gradients (the reduce-scatter outputs the shard
  // .grads view) and AdamW's two moments per shard; nothing unsharded stays.
  CHECK(live(p, "optimizer_end", TensorKind::parameter) == shards);
  CHECK(live(p, "optimizer_end", TensorKind::gradient) == shards);
  CHECK(live(p, "optimizer_end", TensorKind::optimizer_state) == 2 * shards);
  // The sharded parameters are allocated once each, in setup.
  const auto sharded = allocs_named(p, "FSDP2 shard of P (padded chunk 0)");
  uint64_t total = 0;
  for (const MemoryEvent* e : sharded) {
    CHECK(e->phase == Phase::setup);
    CHECK(e->stream == 0);
    total += e->bytes;
  }
  CHECK(total == shards);
  CHECK(p.rank.data == 4);
}

TEST_CASE("FSDP2 all-gathers into one flat buffer on the copy-in stream and copies out per "
          "parameter on the default stream", "[fsdp2]") {
  const Program p = build_program(fsdp2_scenario());
  const uint64_t block_full = kBlockShardNumel * 4 * 4, root_full = kRootShardNumel * 4 * 4;
  std::map<uint64_t, int> ag_sizes;
  for (const MemoryEvent* e : allocs_named(p, kAgOut)) {
    CHECK(e->stream == kAllGatherStream);
    ++ag_sizes[e->bytes];
  }
  // Two steps (warm-up + measured): forward root + 2 blocks, backward 2 blocks.
  CHECK(ag_sizes[block_full] == 8);
  CHECK(ag_sizes[root_full] == 2);
  CHECK(ag_sizes.size() == 2);
  // Copy-out: one unsharded tensor per parameter (9 per block, 3 in the root), padded
  // full size, on the default stream.
  const auto unsharded = allocs_named(p, kUnsharded);
  CHECK(unsharded.size() == 2 * (2 * 2 * 9 + 3));
  for (const MemoryEvent* e : unsharded) CHECK(e->stream == 0);
  // fp32 without mixed precision: no all-gather input copies.
  CHECK(allocs_named(p, "FSDP2 all-gather input (flat_foreach_copy_input, param_dtype)").empty());
  // Forward: the root and one block are unsharded at a time; two flat outputs overlap
  // (the previous one is kept in all_gather_state until the next copy-out).
  CHECK(max_live_named(p, kUnsharded, Phase::forward) == root_full + block_full);
  CHECK(max_live_named(p, kAgOut, Phase::forward) == 2 * block_full);
  // Backward: the root, the block being differentiated, and the next block's flat
  // output (prefetched one group ahead, copied out at its pre-backward).
  CHECK(max_live_named(p, kUnsharded, Phase::backward) == root_full + block_full);
  CHECK(max_live_named(p, kAgOut, Phase::backward) == block_full);
}

TEST_CASE("FSDP2 reduce-scatters from a padded default-stream input into an output on the "
          "reduce-scatter stream", "[fsdp2]") {
  const Program p = build_program(fsdp2_scenario());
  std::map<uint64_t, int> in_sizes, out_sizes;
  for (const MemoryEvent* e : allocs_named(p, kRsIn)) {
    CHECK(e->stream == 0);
    ++in_sizes[e->bytes];
  }
  for (const MemoryEvent* e : allocs_named(p, kRsOut)) {
    CHECK(e->stream == kReduceScatterStream);
    ++out_sizes[e->bytes];
  }
  CHECK(in_sizes[kBlockShardNumel * 4 * 4] == 4);  // padded full, fp32, 2 blocks x 2 steps
  CHECK(in_sizes[kRootShardNumel * 4 * 4] == 2);
  CHECK(out_sizes[kBlockShardNumel * 4] == 4);
  CHECK(out_sizes[kRootShardNumel * 4] == 2);
  // The input stays in reduce_scatter_states until the next group's post-backward,
  // which frees it before its own foreach_reduce: one input live at a time.
  CHECK(max_live_named(p, kRsIn, Phase::backward) == kBlockShardNumel * 16);
}

TEST_CASE("FSDP2's separate streams are separate allocator pools: on the 2-layer model the "
          "program reserves more than the same program on one stream", "[fsdp2]") {
  const Scenario s = fsdp2_scenario();
  const Program p = build_program(s);
  Program one = p;
  for (MemoryEvent& e : one.events) e.stream = 0;
  auto run = [&s](const Program& prog) {
    SimulatedDevice device(s.device.capacity, s.device.cuda_context);
    std::vector<SegmentInfo> segments;
    ExecuteOptions o;
    o.final_segments = &segments;
    Timeline t = execute(prog, s.allocator, device, o);
    return std::make_pair(t, segments);
  };
  const auto [t, segs] = run(p);
  const auto [t1, segs1] = run(one);
  // Same tensors: the same allocated bytes after every event.
  CHECK(t.allocated == t1.allocated);
  // Each stream has its own segments; a block freed on the default stream cannot serve
  // the all-gather stream, so more is reserved.
  bool has[4] = {false, false, false, false};
  for (const SegmentInfo& seg : segs) if (seg.stream < 4) has[seg.stream] = true;
  CHECK(has[0]);
  CHECK(has[kAllGatherStream]);
  CHECK(has[kReduceScatterStream]);
  for (const SegmentInfo& seg : segs1) CHECK(seg.stream == 0);
  CHECK(t.final_stats.reserved_bytes.all.peak > t1.final_stats.reserved_bytes.all.peak);
}

TEST_CASE("FSDP2 mixed precision: a flat param_dtype copy-in, bf16 unsharded parameters, "
          "the bf16 reduce-scatter output cast to an fp32 shard gradient", "[fsdp2]") {
  const Program p = build_program(fsdp2_scenario("  fsdp_mixed_precision: bf16\n"));
  const uint64_t block_shard = kBlockShardNumel, root_shard = kRootShardNumel;
  // MixedPrecisionPolicy(param_dtype=bf16): the flat input (shard numel x 2 B) precedes
  // the flat output (x ws) on the copy-in stream.
  std::map<uint64_t, int> in_sizes;
  for (const MemoryEvent* e :
       allocs_named(p, "FSDP2 all-gather input (flat_foreach_copy_input, param_dtype)")) {
    CHECK(e->stream == kAllGatherStream);
    ++in_sizes[e->bytes];
  }
  CHECK(in_sizes[block_shard * 2] == 8);
  CHECK(in_sizes[root_shard * 2] == 2);
  for (const MemoryEvent* e : allocs_named(p, kAgOut))
    CHECK((e->bytes == block_shard * 2 * 4 || e->bytes == root_shard * 2 * 4));
  // reduce_dtype None = the bf16 gradients: bf16 input and output, then the fp32 cast
  // (orig dtype) on the reduce-scatter stream, which the shards' .grad view.
  for (const MemoryEvent* e : allocs_named(p, kRsIn))
    CHECK((e->bytes == block_shard * 4 * 2 || e->bytes == root_shard * 4 * 2));
  for (const MemoryEvent* e : allocs_named(p, kRsOut)) CHECK(e->stream == kReduceScatterStream);
  const auto casts = allocs_named(p, "FSDP2 sharded grad (cast to the param dtype)");
  CHECK(casts.size() == 6);
  for (const MemoryEvent* e : casts) CHECK(e->stream == kReduceScatterStream);
  // The module is still fp32 at rest: shards, gradients and AdamW state as without it.
  const uint64_t shards = (2 * block_shard + root_shard) * 4;
  CHECK(live(p, "optimizer_end", TensorKind::parameter) == shards);
  CHECK(live(p, "optimizer_end", TensorKind::gradient) == shards);

  // reduce_dtype fp32: chunk_cat widens into an fp32 input, no cast after the output.
  const Program q = build_program(fsdp2_scenario("  fsdp_mixed_precision: bf16\n  reduce_dtype: fp32\n"));
  CHECK(allocs_named(q, "FSDP2 sharded grad (cast to the param dtype)").empty());
  for (const MemoryEvent* e : allocs_named(q, kRsIn))
    CHECK((e->bytes == block_shard * 4 * 4 || e->bytes == root_shard * 4 * 4));
  // fp32 gradients reduced in bf16: a narrowing cast goes through an fp32 buffer first.
  const Program n = build_program(fsdp2_scenario("  reduce_dtype: bf16\n"));
  CHECK(allocs_named(n, "FSDP2 reduce-scatter grad buffer (narrowing cast)").size() == 6);
  CHECK(allocs_named(n, "FSDP2 sharded grad (cast to the param dtype)").size() == 6);
}

TEST_CASE("FSDP2 reshard_after_forward: false keeps every block, N keeps a 1/N slice",
          "[fsdp2]") {
  const uint64_t block_full = kBlockShardNumel * 16, root_full = kRootShardNumel * 16;
  const Program keep = build_program(fsdp2_scenario("  reshard_after_forward: false\n"));
  CHECK(max_live_named(keep, kUnsharded, Phase::forward) == root_full + 2 * block_full);
  // Nothing to all-gather again in backward: 2 block gathers per step (forward only).
  CHECK(allocs_named(keep, kAgOut).size() == 2 * 3);

  const Scenario s2 = fsdp2_scenario("  reshard_after_forward: 2\n");
  CHECK(s2.parallel.reshard_after_forward_ranks == 2);
  const Program half = build_program(s2);
  const std::string post = "FSDP2 post-forward shard of P (reshard_after_forward N)";
  // Each block keeps padded full / 2 per parameter from its post-forward until its
  // backward copy-out: both blocks at the end of forward.
  CHECK(max_live_named(half, post, Phase::forward) == 2 * block_full / 2);
  CHECK(allocs_named(half, post).size() == 2 * 2 * 9);
  // The backward all-gather is over 2 ranks of half slices: the same flat output size.
  for (const MemoryEvent* e : allocs_named(half, kAgOut))
    CHECK((e->bytes == block_full || e->bytes == root_full));
  // 1 is false and the whole shard group (4) is true, as torch reads them.
  CHECK_FALSE(fsdp2_scenario("  reshard_after_forward: 1\n").parallel.reshard_after_forward);
  const Scenario s4 = fsdp2_scenario("  reshard_after_forward: 4\n");
  CHECK(s4.parallel.reshard_after_forward);
  CHECK(s4.parallel.reshard_after_forward_ranks == 0);
}

TEST_CASE("FSDP2 HSDP shards over data / replicate and keeps the reduce-dtype buffers of "
          "every group until the end of backward", "[fsdp2]") {
  // data 4, replicate 2: shard groups of 2. Per block: q, k, v, o 128 x 256; gate, up
  // 500 x 256; down 128 x 1000; norms 128. Root: 501 x 256 twice, 128.
  const uint64_t block = 4 * 32768 + 3 * 128000 + 2 * 128, root = 2 * 501 * 256 + 128;
  const Scenario s = fsdp2_scenario("  replicate: 2\n  fsdp_mixed_precision: bf16\n");
  const Program p = build_program(s);
  CHECK(live(p, "optimizer_end", TensorKind::parameter) == (2 * block + root) * 4);
  // The cast to fp32 happens on the all-reduce stream.
  for (const MemoryEvent* e : allocs_named(p, "FSDP2 sharded grad (cast to the param dtype)"))
    CHECK(e->stream == kAllReduceStream);
  // _all_reduce_state: each group's bf16 output stays until finalize_backward.
  CHECK(max_live_named(p, kRsOut, Phase::backward) == (2 * block + root) * 2);
  CHECK(p.rank.why.find("HSDP") != std::string::npos);
}

TEST_CASE("FSDP2 CPUOffloadPolicy: no model state on the GPU, a GPU copy of each shard per "
          "all-gather", "[fsdp2]") {
  const Program p = build_program(fsdp2_scenario("  cpu_offload: true\n"));
  CHECK(live(p, "optimizer_end", TensorKind::parameter) == 0);
  CHECK(live(p, "optimizer_end", TensorKind::gradient) == 0);
  CHECK(live(p, "optimizer_end", TensorKind::optimizer_state) == 0);
  const auto copies = allocs_named(p, "FSDP2 all-gather input (CPU shard .to(device))");
  CHECK(copies.size() == 2 * (4 * 9 + 3));  // per parameter and all-gather
  for (const MemoryEvent* e : copies) CHECK(e->stream == kAllGatherStream);
}

TEST_CASE("FSDP2 meta-device init allocates only the shards", "[fsdp2]") {
  const Program p = build_program(fsdp2_scenario("  fsdp_init: cpu\n"));
  uint64_t largest = 0;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && e.kind == TensorKind::parameter && e.phase == Phase::setup)
      largest = std::max(largest, e.bytes);
  CHECK(largest == 64256 * 4);  // the embedding's (or lm_head's) shard
}

TEST_CASE("FSDP2 with LoRA: frozen base weights are gathered but get no gradient", "[fsdp2][lora]") {
  const Scenario s = fsdp2_scenario(
      "lora:\n  rank: 8\n  alpha: 16\n  targets: [q_proj, v_proj]\n");
  const Program p = build_program(s);
  // lora_A (8 x 256): 2 rows x 256; lora_B (256 x 8): 64 rows x 8; fp32 adapters, two
  // per block: 4 x 512 elements per block.
  const uint64_t adapters = 2 * 4 * 512 * 4;
  CHECK(live(p, "optimizer_end", TensorKind::gradient) == adapters);
  CHECK(live(p, "optimizer_end", TensorKind::optimizer_state) == 2 * adapters);
  // The reduce-scatter carries the adapters only (padded full, fp32): none for the root.
  for (const MemoryEvent* e : allocs_named(p, kRsIn)) CHECK(e->bytes == 4 * 512 * 4 * 4);
  // The all-gather carries base weights and adapters.
  for (const MemoryEvent* e : allocs_named(p, kAgOut))
    CHECK((e->bytes == (kBlockShardNumel + 4 * 512) * 16 || e->bytes == kRootShardNumel * 16));
}

TEST_CASE("FSDP2 bad input names the keys", "[fsdp2][scenario]") {
  CHECK_THROWS_WITH(fsdp2_scenario("  reshard_after_forward: 3\n"),
                    Catch::Contains("parallel.reshard_after_forward: 3 does not divide"));
  CHECK_THROWS_WITH(fsdp2_scenario("  replicate: 3\n"),
                    Catch::Contains("parallel.replicate: 3 replicas do not divide"));
  CHECK_THROWS_WITH(fsdp2_scenario("  replicate: 2\n  reshard_after_forward: 4\n"),
                    Catch::Contains("parallel.reshard_after_forward"));
  CHECK_THROWS_WITH(fsdp2_scenario("  zero: 3\n"), Catch::Contains("fsdp2.yaml:22: parallel.zero"));
  CHECK_THROWS_WITH(fsdp2_scenario("  replicate: 2\n", "hf-llama", 4, "fsdp"),
                    Catch::Contains("parallel.replicate: only applies with parallel.sharding: fsdp2"));
  CHECK_THROWS_WITH(fsdp2_scenario("  reduce_dtype: bf16\n", "hf-llama", 4, "none"),
                    Catch::Contains("parallel.reduce_dtype"));
  CHECK_THROWS_WITH(build_program(fsdp2_scenario("", "hf-llama", 1)),
                    Catch::Contains("parallel.sharding: FSDP2 on one GPU"));
  CHECK_THROWS_WITH(build_program(fsdp2_scenario("  replicate: 4\n")),
                    Catch::Contains("parallel.replicate"));
  // Autocast over fp32 unsharded parameters is modelled (tests/test_fsdp2_autocast.cpp);
  // over MixedPrecisionPolicy's bf16 ones only as Accelerate's policy
  // (tests/test_fsdp2_accelerate.cpp): without reduce_dtype bf16 it is refused.
  CHECK_THROWS_WITH(build_program(fsdp2_scenario(
                        "  fsdp_mixed_precision: bf16\nprecision:\n  autocast: bf16\n")),
                    Catch::Contains("parallel.reduce_dtype"));
  CHECK_THROWS_WITH(build_program(fsdp2_scenario(
                        "  fsdp_mixed_precision: bf16\nlora:\n  rank: 8\n  targets: [q_proj]\n")),
                    Catch::Contains("parallel.fsdp_mixed_precision"));
}

TEST_CASE("FSDP2 runs on the cs336 and hf-gpt2 families too", "[fsdp2]") {
  for (const char* family : {"cs336", "hf-gpt2"}) {
    INFO(family);
    const Scenario s = fsdp2_scenario("", family);
    const Program p = build_program(s);
    // Model state after the step: shards, their gradients, two AdamW moments.
    const uint64_t params = live(p, "optimizer_end", TensorKind::parameter);
    CHECK(params > 0);
    CHECK(live(p, "optimizer_end", TensorKind::gradient) == params);
    CHECK(live(p, "optimizer_end", TensorKind::optimizer_state) == 2 * params);
    CHECK_FALSE(allocs_named(p, kAgOut).empty());
  }
}

TEST_CASE("FSDP2 and FSDP1 hold the same model state when no padding differs", "[fsdp2][fsdp]") {
  // d_ff 1024 and vocab 1000: every dim 0 and every FSDP1 unit divide by 4, so FSDP1's
  // flat padding and FSDP2's per-parameter padding are both zero.
  auto with = [](const std::string& sharding) {
    std::string y = "model:\n  family: hf-llama\n  layers: 2\n  d_model: 256\n  heads: 4\n"
                    "  kv_heads: 4\n  d_ff: 1024\n  vocab: 1000\n  context_length: 64\n"
                    "batch:\n  micro_batch: 2\n  seq_len: 64\noptimizer:\n  type: adamw\n"
                    "  impl: foreach\nparallel:\n  data: 4\n  sharding: " + sharding + "\n"
                    "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
    return build_program(load_scenario_text(y, "cmp.yaml"));
  };
  const Program one = with("fsdp"), two = with("fsdp2");
  for (TensorKind k : {TensorKind::parameter, TensorKind::gradient, TensorKind::optimizer_state}) {
    INFO(to_string(k));
    CHECK(live(one, "optimizer_end", k) == live(two, "optimizer_end", k));
  }
  // Unsharded bytes per gathered block are the same too (FSDP1's flat parameter, FSDP2's
  // per-parameter tensors): (4 x 256 x 256 + 3 x 1024 x 256 + 2 x 256) x 4 B.
  const uint64_t block = (4 * 65536 + 3 * 262144 + 512) * 4;
  CHECK(max_live_named(two, kUnsharded, Phase::backward) ==
        block + (2 * 1000 * 256 + 256) * 4);
}

TEST_CASE("memsim run on llama3-8b-fsdp2-8xh100 reports the FSDP2 rank", "[fsdp2][cli][scenarios]") {
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-fsdp2-8xh100.yaml' --json - 2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["fits"] == true);
  CHECK(j["rank"]["world_size"] == 8);
  CHECK(j["rank"]["why"].get<std::string>().find("FSDP2") != std::string::npos);
  // Meta-device init: no full-size parameter ever reaches the GPU; the largest
  // parameter allocation of the setup is lm_head's (or the embedding's) fp32 shard:
  // 128256 / 8 = 16032 rows x 4096 x 4 B.
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-fsdp2-8xh100.yaml");
  const Program p = build_program(s);
  uint64_t largest = 0;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && e.kind == TensorKind::parameter && e.phase == Phase::setup)
      largest = std::max(largest, e.bytes);
  CHECK(largest == 16032ull * 4096 * 4);
  // Model state after the step: 16 B/param / 8 (ZeRO-3 accounting), 8.03e9 parameters.
  const LiveBytes l = live_bytes_at_mark(p, "optimizer_end");
  REQUIRE(l.found_mark);
  const uint64_t state = l.by_kind[int(TensorKind::parameter)] + l.by_kind[int(TensorKind::gradient)] +
                         l.by_kind[int(TensorKind::optimizer_state)];
  CHECK(static_cast<double>(state) / 2 == Approx(8030261248.0).epsilon(1e-6));
  // The side streams' pools: the same Program on one stream reserves a different amount
  // (here more: the default pool then also has to hold what the side streams cached in
  // blocks sized for them); allocated is the same event by event.
  Program one = p;
  for (MemoryEvent& e : one.events) e.stream = 0;
  auto reserved_peak = [&s](const Program& prog) {
    SimulatedDevice device(s.device.capacity, s.device.cuda_context);
    return execute(prog, s.allocator, device, ExecuteOptions{}).final_stats.reserved_bytes.all.peak;
  };
  const int64_t streams = reserved_peak(p), single = reserved_peak(one);
  CHECK(streams != single);
}

namespace {
// Bytes of tensors whose name starts with "FSDP2 " and is one of FSDP2's transient
// buffers, live at the first `mark`.
uint64_t transient_live_at(const Program& p, const char* mark) {
  const std::string names[] = {kAgOut, kUnsharded, kRsIn, kRsOut,
                               "FSDP2 all-gather input (flat_foreach_copy_input, param_dtype)",
                               "FSDP2 all-gather input (CPU shard .to(device))",
                               "FSDP2 post-forward shard of P (reshard_after_forward N)",
                               "FSDP2 reduce-scatter grad buffer (narrowing cast)"};
  std::vector<char> is(p.tensors.size(), 0);
  for (size_t t = 0; t < p.tensors.size(); ++t)
    for (const std::string& n : names) is[t] = is[t] || own_name(p, t) == n;
  std::vector<char> alive(p.tensors.size(), 0);
  uint64_t live = 0;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == mark) return live;
    if (e.type == EventType::alloc && is[e.tensor]) live += e.bytes;
    if (e.type == EventType::free && is[e.tensor]) live -= p.tensors[e.tensor].bytes;
  }
  FAIL("no mark " << mark);
  return 0;
}
}  // namespace

TEST_CASE("FSDP2 leaves no gathered parameter or collective buffer behind after backward, "
          "whatever the options", "[fsdp2]") {
  // (The reduce-scatter output is the shards' .grad unless it was cast: then it is gone
  // too. Without a cast it stays as the gradient, so those runs leave it out.)
  const std::vector<std::string> extras = {
      "checkpoint:\n  policy: full\n",
      "batch:\n  grad_accum: 2\n",
      "  reshard_after_forward: false\n  fsdp_mixed_precision: bf16\n",
      "  reshard_after_forward: 2\n  fsdp_mixed_precision: bf16\n",
      "  replicate: 2\n  fsdp_mixed_precision: bf16\n",
      "  cpu_offload: true\n  fsdp_mixed_precision: bf16\n  reshard_after_forward: 2\n",
      "  fsdp_init: cpu\n  reduce_dtype: bf16\n",
      "lora:\n  rank: 4\n  targets: [all-linear]\ncheckpoint:\n  policy: full\n",
  };
  for (const char* family : {"hf-llama", "hf-gpt2", "cs336"}) {
    for (const std::string& extra : extras) {
      if (std::string(family) == "cs336" && extra.find("lora") != std::string::npos) continue;
      std::string e = extra;
      // grad_accum lives in the batch section the scenario already has.
      const bool accum = e.find("grad_accum") != std::string::npos;
      if (accum) e = "";
      INFO(family << "\n" << extra);
      Scenario s = fsdp2_scenario(e, family);
      if (accum) s.batch.grad_accum = 2;
      const Program p = build_program(s);
      const bool cast = extra.find("bf16") != std::string::npos;
      uint64_t left = transient_live_at(p, "backward_end");
      if (!cast) {
        // Remove the reduce-scatter outputs that are the gradients: they equal the
        // gradient bytes live at the mark.
        left -= std::min(left, live(p, "backward_end", TensorKind::gradient));
      }
      if (extra.find("cpu_offload") != std::string::npos) left = transient_live_at(p, "backward_end");
      CHECK(left == 0);
      const uint64_t params = live(p, "optimizer_end", TensorKind::parameter);
      if (extra.find("cpu_offload") != std::string::npos) {
        CHECK(params == 0);
      } else if (extra.find("lora") == std::string::npos) {
        CHECK(live(p, "optimizer_end", TensorKind::gradient) == params);
        CHECK(live(p, "optimizer_end", TensorKind::optimizer_state) == 2 * params);
      }
    }
  }
}
