// Accelerate's FSDP1 path over a model loaded in bf16 (precision.params bf16 with
// precision.autocast and parallel.fsdp_mixed_precision bf16 under parallel.sharding fsdp;
// sim/parallel/accelerate_amp.h accelerate_fsdp1_upcast, sim/parallel/fsdp.h "Accelerate's
// upcast", docs/fsdp-accelerate.md "A model loaded in bf16").
//
// What is proven here: the model is built, synced and flattened in bf16, with the fp32
// rotary buffer in a broadcast bucket of its own (torch's per-dtype buckets, checked against
// torch 1.13's _broadcast_coalesced on mixed-dtype tensors: tests/data/torch_cpu/
// accelerate_fsdp1.json "broadcast_mixed"); after wrapping each unit, root first, gets an
// fp32 copy of its shard, and the bf16 shard goes at once (use_orig_params=False) or at the
// unit's first post-forward (use_orig_params=True: the original parameters view it); the
// measured step is then event for event the fp32-loaded model's. Sizes by hand.
#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "program/tensor_names.h"
#include "sim/parallel/fsdp_sync_states.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// docs/fsdp2.md's worked example (2 layers, D 256, F 1000, vocab 1001, ws 4, batch 2 x 64),
// HF Trainer's loop on Accelerate's FSDP1 bf16 path, transformers 5.x.
Scenario worked(const std::string& params, const std::string& parallel,
                const std::string& autocast = "  autocast: bf16\n") {
  std::string y =
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n"
      "  d_ff: 1000\n  vocab: 1001\n  context_length: 64\n  transformers: 5\n";
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n";
  y += "precision:\n  params: " + params + "\n" + autocast;
  y += "optimizer:\n  type: adamw\n  impl: foreach\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n  keep_output: loss\n";
  y += "parallel:\n  data: 4\n  sharding: fsdp\n  fsdp_mixed_precision: bf16\n" + parallel;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "upcast.yaml");
}

struct Ev {
  EventType type;
  uint64_t bytes;
  Phase phase;
  std::string name;
  bool operator==(const Ev& o) const {
    return type == o.type && bytes == o.bytes && phase == o.phase && name == o.name;
  }
};

// The alloc / free events from the mark `from` on (empty: from the start).
std::vector<Ev> events(const Program& p, const std::string& from = "measured_step_begin") {
  const TensorNames names(p);
  std::vector<Ev> out;
  bool on = from.empty();
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == from) on = true;
    if (!on || (e.type != EventType::alloc && e.type != EventType::free)) continue;
    out.push_back({e.type, p.tensors[e.tensor].bytes, e.phase, names.name(e.tensor)});
  }
  return out;
}

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// Flat numels: a block 4 x 256 x 256 + 3 x 256 x 1000 + 2 x 256 = 1,030,656; the root
// embedding and head 1001 x 256 each + the final norm 256 = 512,768 (both multiples of
// 8 elements per parameter and of ws 4: no padding). Shards: a quarter.
constexpr uint64_t kBlock = 1030656, kRoot = 512768;

}  // namespace

TEST_CASE("FSDP1 sync_module_states: tensors of several dtypes bucket per dtype as torch does",
          "[fsdp][accelerate]") {
  std::ifstream in(MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu/accelerate_fsdp1.json");
  REQUIRE(in.good());
  const nlohmann::json fx = nlohmann::json::parse(in);
  REQUIRE(fx["broadcast_mixed"].size() == 3);
  for (const nlohmann::json& c : fx["broadcast_mixed"]) {
    INFO(c["name"].get<std::string>());
    std::vector<uint64_t> bytes;
    std::vector<int> dtypes;
    for (size_t i = 0; i < c["numels"].size(); ++i) {
      const int elem = c["dtypes"][i] == "fp32" ? 4 : 2;  // fp16 stands in for bf16
      bytes.push_back(c["numels"][i].get<uint64_t>() * static_cast<uint64_t>(elem));
      dtypes.push_back(elem);
    }
    CHECK(sync_broadcast_events(bytes, c["bucket_bytes"].get<uint64_t>(), dtypes) ==
          c["events"].get<std::vector<int64_t>>());
  }
  // By hand: one dtype is unchanged; the interleaved case's fp16 bucket [0, 2, 4] closes
  // after the fp32 one [1, 3] but sorts first.
  CHECK(sync_broadcast_events({10, 20}, 1000, {4, 4}) == sync_broadcast_events({10, 20}, 1000));
  CHECK(sync_broadcast_events({200, 400, 400, 800, 600}, 1000, {2, 4, 2, 4, 2}) ==
        std::vector<int64_t>{1200, 1200, -1200, -1200});
}

TEST_CASE("Accelerate FSDP1 upcast: a bf16-loaded model is flattened in bf16, its shards upcast",
          "[fsdp][autocast][accelerate]") {
  for (const bool orig : {false, true}) {
    INFO("use_orig_params " << orig);
    const std::string parallel = std::string("  use_orig_params: ") + (orig ? "true" : "false") +
                                 "\n  fsdp_sync_module_states: true\n";
    const Program p16 = build_program(worked("bf16", parallel));
    const Program p32 = build_program(worked("fp32", parallel));
    const std::vector<Ev> all = events(p16, "");
    // Setup: the flat parameters in bf16, the shards cloned in bf16.
    std::vector<uint64_t> flats, buckets, upcast;
    std::vector<std::pair<EventType, std::string>> loaded;  // the bf16 shards' alloc / free
    for (const Ev& e : all) {
      if (e.type == EventType::alloc && has(e.name, "FlatParameter (wrap)")) flats.push_back(e.bytes);
      if (e.type == EventType::alloc && has(e.name, "sync_module_states broadcast bucket"))
        buckets.push_back(e.bytes);
    }
    CHECK(flats == std::vector<uint64_t>{kBlock * 2, kBlock * 2, kRoot * 2});
    // Broadcast: each block's bf16 parameters in one bucket; the root's fp32 inv_freq (32 x 4
    // B) is a bucket of its own (a view), its bf16 embedding, norm and head another.
    CHECK(buckets == std::vector<uint64_t>{kBlock * 2, kBlock * 2, kRoot * 2});
    // The upcast, after the last wrap (the root's), root first: an fp32 shard each, and
    // (use_orig_params=False) the bf16 shard freed at once.
    size_t k = 0;
    while (k < all.size() && !(all[k].type == EventType::alloc && all[k].phase == Phase::setup &&
                               has(all[k].name, "FSDP flat_param shard of the root") &&
                               all[k].bytes == kRoot / 4 * 4))
      ++k;
    REQUIRE(k < all.size());
    std::vector<Ev> expect;
    const char* units[3] = {"the root", "block 0", "block 1"};
    const uint64_t shard[3] = {kRoot / 4, kBlock / 4, kBlock / 4};
    for (int u = 0; u < 3; ++u) {
      expect.push_back({EventType::alloc, shard[u] * 4, Phase::setup,
                        std::string("FSDP flat_param shard of ") + units[u]});
      if (!orig)
        expect.push_back({EventType::free, shard[u] * 2, Phase::setup,
                          std::string("FSDP flat_param shard of ") + units[u]});
    }
    CHECK(std::vector<Ev>(all.begin() + static_cast<long>(k),
                          all.begin() + static_cast<long>(k + expect.size())) == expect);
    // use_orig_params=True: the bf16 shards live until each unit's first post-forward
    // (block 0 when block 1 starts, block 1 when the head starts, the root after the model
    // call), in the warm-up forward.
    std::vector<std::string> freed;
    for (const Ev& e : all)
      if (e.type == EventType::free && has(e.name, "FSDP bf16 shard viewed by the original parameters")) {
        CHECK(e.bytes == (has(e.name, "root") ? kRoot / 4 * 2 : kBlock / 4 * 2));
        CHECK(e.phase != Phase::setup);
        freed.push_back(e.name);
      }
    if (orig)
      CHECK(freed == std::vector<std::string>{
                         "FSDP bf16 shard viewed by the original parameters of block 0",
                         "FSDP bf16 shard viewed by the original parameters of block 1",
                         "FSDP bf16 shard viewed by the original parameters of the root"});
    else
      CHECK(freed.empty());
    // The measured step: event for event the fp32-loaded model's.
    CHECK(events(p16) == events(p32));
  }
}

TEST_CASE("Accelerate FSDP1 upcast: what is not modelled is refused by key", "[fsdp][accelerate][scenario]") {
  auto refused = [](const Scenario& s, const char* key) {
    INFO(key);
    CHECK_THROWS_WITH(build_program(s), Catch::Contains(std::string("upcast.yaml: ") + key));
  };
  refused(worked("fp16", ""), "precision.params");
  refused(worked("bf16", "  use_orig_params: true\n  reshard_after_forward: false\n"),
          "parallel.reshard_after_forward");
  CHECK_NOTHROW(build_program(worked("bf16", "  reshard_after_forward: false\n")));
  // MixedPrecision without Accelerate's autocast is not Accelerate's path: no upcast.
  refused(worked("bf16", "", ""), "parallel.fsdp_mixed_precision");
}

TEST_CASE("memsim run: Qwen2.5-7B loaded in bf16 through HF Trainer + Accelerate FSDP1",
          "[fsdp][accelerate][cli][scenarios]") {
  const std::string dir = MEMSIM_SOURCE_DIR + "/scenarios/";
  const nlohmann::json b16 = memsim_test::run_json(dir + "qwen2.5-7b-hf-trainer-fsdp1-bf16-load-bf16-8xh100.yaml");
  const nlohmann::json f32 = memsim_test::run_json(dir + "qwen2.5-7b-hf-trainer-fsdp1-bf16-8xh100.yaml");
  CHECK(b16["fits"] == true);
  // The measured step requests the same bytes; the allocator's blocks differ with the setup's
  // segments (a bf16 setup), so allocated and reserved may differ.
  CHECK(b16["peak_requested_bytes"] == f32["peak_requested_bytes"]);
  // (+1,024 B since the scenario clips as Trainer does: FSDP's _zero_scalar and the bound
  // _grad_norm, two 512-B blocks; tests/test_fsdp1_clip.cpp)
  CHECK(b16["peak_allocated_bytes"].get<uint64_t>() == 21299250688ull);
  CHECK(b16["peak_reserved_bytes"].get<uint64_t>() == 23379050496ull);
  // The root's shard: embedding and head (152,064 x 3,584 each) + the final norm (3,584) =
  // 1,089,998,336 elements / 8 ranks = 136,249,792: cloned in bf16 at wrap, then its fp32
  // copy (the upcast), in setup.
  const Program p = build_program(load_scenario(dir + "qwen2.5-7b-hf-trainer-fsdp1-bf16-load-bf16-8xh100.yaml"));
  std::vector<uint64_t> root;
  for (const Ev& e : events(p, ""))
    if (e.type == EventType::alloc && e.phase == Phase::setup &&
        (e.name == "FSDP flat_param shard of the root" ||  // use_orig_params: the bf16 one renamed
         e.name == "FSDP bf16 shard viewed by the original parameters of the root"))
      root.push_back(e.bytes);
  CHECK(root == std::vector<uint64_t>{136249792ull * 2, 136249792ull * 4});
}
