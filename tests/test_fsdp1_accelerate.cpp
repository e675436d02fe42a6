// Accelerate's FSDP1 bf16 path (HF Trainer bf16=True with fsdp_version 1) and HF Trainer's
// FSDP1 defaults: precision.autocast + parallel.fsdp_mixed_precision bf16 under
// parallel.sharding: fsdp (sim/parallel/accelerate_amp.h), parallel.fsdp_backward_prefetch
// (sim/parallel/fsdp.h), parallel.fsdp_sync_module_states (sim/parallel/fsdp_sync_states.h);
// docs/fsdp-accelerate.md.
//
// What is proven here: autocast over MixedPrecision's bf16 views adds nothing to the model's
// program; the root's boundary adds exactly Accelerate's convert_outputs_to_fp32 copy, alive
// until Trainer drops the outputs (FSDP1 casts no output); buffer_dtype makes each rotary
// forward take an fp32 copy of the bf16 inv_freq; the three match torch 1.13 CPU stand-ins
// byte for byte (tools/fixtures/gen_accelerate_fsdp1_fixtures.py). no_prefetch gathers one
// block at a time in backward, and sync_module_states' broadcast buckets are torch's own
// (the fixture runs torch's C++ routine on a gloo group of one rank).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "fsdp2_accelerate_test_support.h"
#include "program/tensor_names.h"
#include "sim/parallel/fsdp_sync_states.h"
#include "sim/step/schedule.h"
#include "step_measure_test_support.h"

using namespace memsim;

namespace {

// docs/fsdp2.md's worked example (2 layers, D 256, F 1000, vocab 1001, ws 4, batch 2 x 64)
// in HF Trainer's loop under FSDP1, transformers 5.x, fp32 parameters.
std::string text(const std::string& precision, const std::string& parallel, const std::string& extra = "",
                 const std::string& version = "  transformers: 5\n") {
  return memsim_test::accelerate::worked_text(precision, parallel, version, extra, "fsdp");
}
Scenario worked(const std::string& precision, const std::string& parallel, const std::string& extra = "",
                const std::string& version = "  transformers: 5\n") {
  return load_scenario_text(text(precision, parallel, extra, version), "fsdp1acc.yaml");
}

const std::string kAutocast = "  autocast: bf16\n";
const std::string kMp = "  fsdp_mixed_precision: bf16\n";

using memsim_test::accelerate::Ev;
// The alloc / free events from the mark `from` on (empty: from the start).
std::vector<Ev> events(const Program& p, const std::string& from = "measured_step_begin") {
  return memsim_test::accelerate::measured(p, from);
}

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("Accelerate FSDP1 bf16: autocast over MixedPrecision's views adds only the fp32 logits copy",
          "[fsdp][autocast][accelerate]") {
  const uint64_t N = 2 * 64, V = 1001;
  const uint64_t fp32_logits = N * V * 4;  // 512,512 B: convert_outputs_to_fp32's copy
  const uint64_t bf16_logits = N * V * 2;  // 256,256 B: the model's logits
  const uint64_t inv_freq32 = 64 / 2 * 4;  // head_dim 64: inv_freq.float(), 128 B
  const Program acc = build_program(worked(kAutocast, kMp));
  const Program mp = build_program(worked("", kMp));  // MixedPrecision alone (llama-recipes' loop)
  const std::vector<Ev> a = events(acc), b = events(mp);
  // 1. Without the boundary's copy, the rotary buffer's fp32 copy and the bf16 logits (which
  //    die earlier with the wrapper), every event is MixedPrecision's, in order.
  auto strip = [&](const std::vector<Ev>& v, bool accelerate) {
    std::vector<std::pair<EventType, uint64_t>> r;
    bool skipped_rotary = false;
    for (const Ev& e : v) {
      if (has(e.name, "convert_outputs_to_fp32") || e.name == "logits") continue;
      if (accelerate && e.bytes == inv_freq32 && e.name == "rotary inv_freq.float()") {
        skipped_rotary = true;
        continue;
      }
      r.emplace_back(e.type, e.bytes);
    }
    if (accelerate) CHECK(skipped_rotary);
    return r;
  };
  CHECK(strip(a, true) == strip(b, false));
  // 2. The boundary: after the loss, the fp32 copy; the bf16 original dies with the wrapper's
  //    ModelOutput; FSDP1's root post-forward casts nothing; Trainer drops the fp32 copy.
  size_t i = 0;
  while (i < a.size() && !has(a[i].name, "convert_outputs_to_fp32")) ++i;
  REQUIRE(i + 2 < a.size());
  CHECK(a[i].type == EventType::alloc);
  CHECK(a[i].bytes == fp32_logits);
  CHECK(a[i + 1].type == EventType::free);
  CHECK(a[i + 1].bytes == bf16_logits);
  CHECK(a[i + 1].name == "logits");
  CHECK(a[i + 2].type == EventType::free);
  CHECK(a[i + 2].bytes == fp32_logits);
  CHECK(has(a[i + 2].name, "convert_outputs_to_fp32"));
  CHECK(a[i + 3].phase == Phase::backward);  // backward starts at the fp32 loss
  int casts = 0;
  for (const Ev& e : a) casts += has(e.name, "cast_forward_outputs");
  CHECK(casts == 0);
}

TEST_CASE("Accelerate FSDP1 bf16: buffer_dtype casts the rotary buffer once, at the root's lazy init",
          "[fsdp][autocast][accelerate]") {
  const std::vector<Ev> all = events(build_program(worked(kAutocast, kMp)), "");
  // The construction's fp32 inv_freq (32 x 4 B), then at the first forward a bf16 copy
  // (32 x 2 B) and the fp32 storage freed, before FSDP's lazy-init zeros.
  size_t i = 0;
  while (i < all.size() && all[i].name != "rotary inv_freq in FSDP buffer_dtype") ++i;
  REQUIRE(i + 2 < all.size());
  CHECK(all[i].type == EventType::alloc);
  CHECK(all[i].bytes == 64);
  CHECK(all[i].phase == Phase::forward);
  CHECK(all[i + 1].type == EventType::free);
  CHECK(all[i + 1].bytes == 128);
  CHECK(has(all[i + 2].name, "FSDP lazy init"));
  int copies = 0;  // one inv_freq.float() per rotary forward: one per step (model-level rotary)
  for (const Ev& e : events(build_program(worked(kAutocast, kMp))))
    copies += e.type == EventType::alloc && e.bytes == 128 && e.name == "rotary inv_freq.float()";
  CHECK(copies == 1);
}

TEST_CASE("Accelerate FSDP1 bf16: lifetimes equal the torch 1.13 CPU stand-ins'",
          "[fsdp][autocast][accelerate]") {
  const nlohmann::json fx = memsim_test::load_torch_cpu_fixture("accelerate_fsdp1.json");
  // (a) The boundary: live requested bytes, parameters excluded.
  nlohmann::json acc, plain;
  for (const nlohmann::json& r : fx["boundary"]["rows"]) (r["accelerate"] == true ? acc : plain) = r;
  REQUIRE(acc.is_object());
  REQUIRE(plain.is_object());
  REQUIRE(fx["boundary"]["config"]["vocab"] == 1001);
  REQUIRE(fx["boundary"]["config"]["batch"] == 2);
  REQUIRE(fx["boundary"]["config"]["seq"] == 64);
  CHECK(acc["loss_dtype"] == "torch.float32");  // no output cast: the loss stays fp32
  const nlohmann::json& pt = acc["points"];
  auto d = [&](const char* to, const char* from) { return pt[to].get<int64_t>() - pt[from].get<int64_t>(); };
  const Program p = build_program(worked(kAutocast, kMp));
  const memsim_test::accelerate::Live l = memsim_test::accelerate::live_activations(p);
  const std::vector<int64_t>& live = l.bytes;
  const std::vector<std::string>& what = l.what;
  size_t i = 0;
  while (i < what.size() && !has(what[i], "convert_outputs_to_fp32")) ++i;
  REQUIRE(i >= 1);
  REQUIRE(i + 2 < what.size());
  CHECK(live[i + 1] - live[i - 1] == d("after_call", "after_loss"));       // +256,256
  CHECK(live[i + 2] - live[i + 1] == d("outputs_dropped", "after_call"));  // -512,512
  CHECK(d("after_call", "after_loss") == 256256);
  CHECK(pt["after_backward"] == plain["points"]["after_backward"]);  // nothing else differs
  CHECK(pt["outputs_dropped"] == plain["points"]["outputs_dropped"]);

  // (b) The rotary forward: a bf16 buffer adds one fp32 copy of it, first, dead at return.
  nlohmann::json r32, r16;
  for (const nlohmann::json& r : fx["rotary"]["rows"]) (r["buffer_dtype"] == "torch.float32" ? r32 : r16) = r;
  const uint64_t n = r16["inv_freq_numel"].get<uint64_t>();
  std::vector<uint64_t> a32 = r32["allocs"].get<std::vector<uint64_t>>();
  std::vector<uint64_t> a16 = r16["allocs"].get<std::vector<uint64_t>>();
  REQUIRE(!a16.empty());
  CHECK(a16.front() == n * 4);
  CHECK(std::vector<uint64_t>(a16.begin() + 1, a16.end()) == a32);
  std::vector<uint64_t> f16 = r16["frees_at_return"].get<std::vector<uint64_t>>();
  std::vector<uint64_t> f32 = r32["frees_at_return"].get<std::vector<uint64_t>>();
  f32.push_back(n * 4);
  std::sort(f32.begin(), f32.end());
  CHECK(f16 == f32);
  // memsim's rope tables under the same model: the same extra allocation, first, of
  // head_dim / 2 x 4 bytes, freed before the table's other locals.
  const std::vector<Ev> ev = events(p);
  size_t k = 0;
  while (k < ev.size() && ev[k].name != "rotary inv_freq.float()") ++k;
  REQUIRE(k + 1 < ev.size());
  CHECK(ev[k].bytes == 64 / 2 * 4);
  CHECK(ev[k].type == EventType::alloc);

  // (c) sync_module_states' broadcast: torch's own bucketing, flattening and window.
  for (const nlohmann::json& c : fx["broadcast"]) {
    INFO(c["name"].get<std::string>());
    std::vector<uint64_t> bytes;
    for (const nlohmann::json& numel : c["numels"]) bytes.push_back(numel.get<uint64_t>() * 4);
    CHECK(sync_broadcast_events(bytes, c["bucket_bytes"].get<uint64_t>()) ==
          c["events"].get<std::vector<int64_t>>());
  }
}

TEST_CASE("FSDP1 backward prefetch: no_prefetch gathers one block at a time in backward",
          "[fsdp]") {
  // Each block's bf16 flat parameter: 1,030,656 elements (4 x 256 x 256 + 3 x 256 x 1000 +
  // 2 x 256, a multiple of 4) x 2 B.
  const uint64_t block = 1030656ull * 2;
  auto max_blocks_gathered = [&](const std::string& prefetch) {
    const std::vector<Ev> ev = events(build_program(worked("", kMp + prefetch)));
    int live = 0, peak = 0, gathers = 0;
    for (const Ev& e : ev) {
      if (!has(e.name, "FSDP all-gather of block")) continue;
      REQUIRE(e.bytes == block);
      live += e.type == EventType::alloc ? 1 : -1;
      gathers += e.type == EventType::alloc && e.phase == Phase::backward;
      if (e.phase == Phase::backward) peak = std::max(peak, live);
    }
    CHECK(gathers == 2);  // FULL_SHARD: every block is gathered again for its backward
    return peak;
  };
  CHECK(max_blocks_gathered("") == 2);  // BACKWARD_PRE (torch's default): block l and l - 1
  CHECK(max_blocks_gathered("  fsdp_backward_prefetch: backward_pre\n") == 2);
  CHECK(max_blocks_gathered("  fsdp_backward_prefetch: no_prefetch\n") == 1);
}

TEST_CASE("FSDP1 sync_module_states: each unit's buffers and parameters broadcast in 250 MiB buckets",
          "[fsdp]") {
  // By hand: sync_broadcast_events on the rule's corner cases.
  const uint64_t L = kFsdpSyncBucketBytes;
  CHECK(L == 262144000);
  CHECK(sync_broadcast_events({L}, L).empty());                       // one tensor: a view
  CHECK(sync_broadcast_events({10, 20}, L) == std::vector<int64_t>{30, -30});
  CHECK(sync_broadcast_events({256, L, 14336, L}, L) ==               // Qwen2.5-7B's root
        std::vector<int64_t>{static_cast<int64_t>(L + 256), static_cast<int64_t>(L + 14336),
                             -static_cast<int64_t>(L + 256), -static_cast<int64_t>(L + 14336)});
  // The worked model: every unit fits one bucket. Blocks: 1,030,656 fp32 elements; the root:
  // inv_freq (32 x 4 B, its only buffer) + embedding and head (1001 x 256 x 4 B each) + the
  // final norm (256 x 4 B).
  const std::vector<Ev> ev = events(build_program(worked("", kMp + "  fsdp_sync_module_states: true\n")), "");
  std::vector<std::pair<EventType, uint64_t>> buckets;
  for (const Ev& e : ev)
    if (has(e.name, "sync_module_states broadcast bucket")) buckets.emplace_back(e.type, e.bytes);
  const uint64_t blk = 1030656ull * 4, root = 128 + 2 * 1001 * 256 * 4 + 256 * 4;
  CHECK(buckets == std::vector<std::pair<EventType, uint64_t>>{{EventType::alloc, blk}, {EventType::free, blk},
                                                              {EventType::alloc, blk}, {EventType::free, blk},
                                                              {EventType::alloc, root}, {EventType::free, root}});
  // Mistral v4.45 has a rotary module (and its inv_freq buffer) in every attention: each
  // block's bucket starts with its own buffer, the root has none.
  const std::vector<Ev> mev = events(
      build_program(worked("", kMp + "  fsdp_sync_module_states: true\n", "", "  architecture: mistral\n")), "");
  std::vector<uint64_t> mbuckets;
  for (const Ev& e : mev)
    if (e.type == EventType::alloc && has(e.name, "sync_module_states broadcast bucket")) mbuckets.push_back(e.bytes);
  CHECK(mbuckets == std::vector<uint64_t>{blk + 128, blk + 128, root - 128});
  // Without the key: no broadcast.
  for (const Ev& e : events(build_program(worked("", kMp)), "")) CHECK_FALSE(has(e.name, "sync_module_states"));
}

TEST_CASE("Accelerate FSDP1 bf16: other combinations are refused by key",
          "[fsdp][autocast][accelerate][scenario]") {
  auto refused = [](const std::string& precision, const std::string& parallel, const char* key,
                    const std::string& extra = "") {
    INFO(key);
    CHECK_THROWS_WITH(build_program(worked(precision, parallel, extra)),
                      Catch::Contains(std::string("fsdp1acc.yaml: ") + key));
  };
  CHECK_NOTHROW(build_program(worked(kAutocast, kMp)));
  refused(kAutocast, "  fsdp_mixed_precision: fp16\n", "parallel.fsdp_mixed_precision");
  // fp16 is Accelerate's ShardedGradScaler path (tests/test_fsdp1_clip.cpp): without the scaler
  // it is not Accelerate's.
  refused("  autocast: fp16\n", "  fsdp_mixed_precision: fp16\n", "precision.grad_scaler");
  refused(kAutocast + "  autocast_region: forward\n", kMp, "precision.autocast_region");
  refused(kAutocast + "  autocast_cache: false\n", kMp, "precision.autocast_cache");
  refused(kAutocast, kMp + "  cpu_offload: true\n", "parallel.cpu_offload");
  Scenario loop = worked(kAutocast, kMp);
  loop.step.output_dies_after_loss = false;
  CHECK_THROWS_WITH(build_program(loop), Catch::Contains("fsdp1acc.yaml: step.keep_output"));
  Scenario gpt2 = worked(kAutocast, kMp);
  gpt2.model.family = ModelFamily::hf_gpt2;
  CHECK_THROWS_WITH(build_program(gpt2), Catch::Contains("fsdp1acc.yaml: model.family"));
  // transformers 4.x checkpoints around the FSDP-wrapped layer.
  Scenario v4 = load_scenario_text(
      text(kAutocast, kMp, "checkpoint:\n  policy: full\n  reentrant: false\n", ""), "fsdp1acc.yaml");
  CHECK_THROWS_WITH(build_program(v4), Catch::Contains("fsdp1acc.yaml: checkpoint.policy"));
  CHECK_NOTHROW(build_program(worked(kAutocast, kMp, "checkpoint:\n  policy: full\n  reentrant: false\n")));
  // The FSDP1 keys: backward_post refused; both keys only with sharding fsdp.
  CHECK_THROWS_WITH(worked("", kMp + "  fsdp_backward_prefetch: backward_post\n"),
                    Catch::Contains("parallel.fsdp_backward_prefetch"));
  std::string y2 = text("", "  fsdp_backward_prefetch: no_prefetch\n");
  y2.replace(y2.find("sharding: fsdp"), 14, "sharding: fsdp2");
  CHECK_THROWS_WITH(load_scenario_text(y2, "x.yaml"), Catch::Contains("parallel.fsdp_backward_prefetch"));
  std::string y3 = text("", "  fsdp_sync_module_states: true\n");
  y3.replace(y3.find("sharding: fsdp"), 14, "sharding: fsdp2");
  CHECK_THROWS_WITH(load_scenario_text(y3, "x.yaml"), Catch::Contains("parallel.fsdp_sync_module_states"));
  Scenario gpt2s = worked("", "  fsdp_sync_module_states: true\n");
  gpt2s.model.family = ModelFamily::hf_gpt2;
  CHECK_THROWS_WITH(build_program(gpt2s), Catch::Contains("parallel.fsdp_sync_module_states"));
}

TEST_CASE("memsim run: Qwen2.5-7B through HF Trainer + Accelerate FSDP1 bf16 on 8 H100",
          "[fsdp][autocast][accelerate][cli][scenarios]") {
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/qwen2.5-7b-hf-trainer-fsdp1-bf16-8xh100.yaml";
  auto run = [&](const std::string& set) { return memsim_test::run_json(file, set); };
  const nlohmann::json acc = run("");
  CHECK(acc["fits"] == true);
  // The boundary's fp32 logits copy (2048 x 152064 x 4 B) dies before backward: the peak,
  // at the root's post-backward, is MixedPrecision's.
  const nlohmann::json mp = run("--set precision.autocast=none");
  CHECK(acc["peak_allocated_bytes"] == mp["peak_allocated_bytes"]);
  CHECK(acc["peak_reserved_bytes"] == mp["peak_reserved_bytes"]);
  const Program p = build_program(load_scenario(file));
  const std::vector<Ev> ev = events(p, "");
  uint64_t fp32_copy = 0;
  std::vector<uint64_t> root_buckets;
  for (const Ev& e : ev) {
    if (e.type != EventType::alloc) continue;
    if (has(e.name, "convert_outputs_to_fp32")) fp32_copy = e.bytes;
    if (e.name == "sync_module_states broadcast bucket of the root") root_buckets.push_back(e.bytes);
  }
  CHECK(fp32_copy == 2048ull * 152064ull * 4ull);
  // sync_module_states at the root: [inv_freq (64 x 4 B), embed_tokens] and [norm, lm_head].
  const uint64_t table = 152064ull * 3584ull * 4ull;
  CHECK(root_buckets == std::vector<uint64_t>{256 + table, 3584 * 4 + table});
  // HF Trainer's NO_PREFETCH against torch's BACKWARD_PRE: the same peak (after the last
  // block), less reserved.
  const nlohmann::json pre = run("--set parallel.fsdp_backward_prefetch=backward_pre");
  CHECK(pre["peak_reserved_bytes"].get<uint64_t>() > acc["peak_reserved_bytes"].get<uint64_t>());
  // BACKWARD_POST is refused by key (exit 1).
  const memsim_test::CommandResult refused = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file +
      "' --set parallel.fsdp_backward_prefetch=backward_post 2>&1");
  CHECK(refused.status == 1);
  CHECK(refused.out.find("parallel.fsdp_backward_prefetch") != std::string::npos);
}
