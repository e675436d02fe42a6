// torchtitan's own Llama code under its apply_fsdp (sim/parallel/fsdp2_layout.h,
// sim/parallel/fsdp2.h "torchtitan's layout", scenario/torchtitan_fsdp2_keys.h). No GPU and
// no CPU FSDP2 back these numbers: the group sizes and buffer counts are hand arithmetic
// from torchtitan 5077be6e's apply_fsdp and torch's _fully_shard rules
// (docs/implementations.md "torchtitan under FSDP2"), and the structural checks tie the
// sharded run to the single-device torchtitan run.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "live_at_mark_test_support.h"
#include "cli_test_support.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/parallel/fsdp2.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// A 2-layer torchtitan Llama: D 256, 4 heads of 64, 2 KV heads, F 512, vocab 1024,
// micro-batch 2 x 64, full checkpointing, fused AdamW; torchtitan's mixed precision
// (fp32 parameters, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)) unless
// `params` says otherwise.
std::string titan_yaml(const std::string& parallel, const std::string& params = "fp32") {
  return "model:\n  family: hf-llama\n  implementation: torchtitan\n  attention: flash\n"
         "  layers: 2\n  d_model: 256\n  heads: 4\n  kv_heads: 2\n  d_ff: 512\n  vocab: 1024\n"
         "  context_length: 64\n"
         "batch:\n  micro_batch: 2\n  seq_len: 64\n"
         "precision:\n  params: " + params + "\n  autocast: none\n"
         "optimizer:\n  type: adamw\n  impl: fused\n"
         "step:\n  kind: train\n  warmup_steps: 1\n"
         "checkpoint:\n  policy: full\n" +
         parallel + "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
}
const std::string kMixed = "parallel:\n  data: 4\n  sharding: fsdp2\n  fsdp_mixed_precision: bf16\n"
                           "  reduce_dtype: fp32\n";
const std::string kPlain = "parallel:\n  data: 4\n  sharding: fsdp2\n";

Scenario titan(const std::vector<std::pair<std::string, std::string>>& over = {},
               const std::string& parallel = kMixed, const std::string& params = "fp32") {
  return load_scenario_text(titan_yaml(parallel, params), "titan.yaml", over);
}

std::string load_error(const std::vector<std::pair<std::string, std::string>>& over) {
  try {
    titan(over);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

// Hand arithmetic, shard group 4 (every dim 0 divides: no padding). Per block, elements:
// wq, wo 256 x 256 = 65536 each; wk, wv 128 x 256 = 32768 each; w1, w3 512 x 256 and w2
// 256 x 512 = 131072 each; attention_norm, ffn_norm 256 each: 590336, 147584 per shard.
constexpr uint64_t kBlock = 2 * 65536 + 2 * 32768 + 3 * 131072 + 2 * 256;
constexpr uint64_t kEmb = 1024 * 256;        // tok_embeddings
constexpr uint64_t kNormOut = 256 + 1024 * 256;  // fully_shard([norm, output])
constexpr uint64_t kWs = 4;

std::vector<const MemoryEvent*> allocs(const Program& p, const std::string& name) {
  std::vector<const MemoryEvent*> out;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && p.str(p.tensors[e.tensor].name) == name) out.push_back(&e);
  return out;
}

using memsim_test::kind;
using memsim_test::live_at;

// Per group label: bytes -> count of the named FSDP2 buffer over the whole program.
std::map<std::string, std::map<uint64_t, int>> per_group(const Program& p, const std::string& what) {
  std::map<std::string, std::map<uint64_t, int>> out;
  for (const char* g : {"block 0", "block 1", "tok_embeddings", "output", "the root"})
    for (const MemoryEvent* e : allocs(p, what + " of " + g)) ++out[g][e->bytes];
  return out;
}

}  // namespace

TEST_CASE("torchtitan + FSDP2: apply_fsdp's groups are tok_embeddings, each block, [norm, "
          "output] and a root without parameters", "[fsdp2][torchtitan]") {
  const Scenario s = titan();
  CHECK(s.parallel.fsdp_init_on_cpu);  // built on the meta device
  const Program p = build_program(s);
  // Sharded fp32 state after the step: the shards, their fp32 grads, AdamW's two moments
  // (+ fused AdamW's 0-d fp32 steps: 9 per block, tok_embeddings, norm, output).
  const uint64_t shards = (2 * kBlock + kEmb + kNormOut) / kWs * 4;
  const auto end = live_at(p, "optimizer_end");
  CHECK(kind(end, TensorKind::parameter) == shards);
  CHECK(kind(end, TensorKind::gradient) == shards);
  CHECK(kind(end, TensorKind::optimizer_state) == 2 * shards + 21 * 4);
  // All-gathers in param_dtype (bf16), the flat output = the group's full elements x 2 B.
  // Per step: each block and tok_embeddings once in forward and once in backward
  // (resharded after forward); [norm, output] only in forward (reshard_after_forward False
  // for it under the "default" policy: its backward finds it gathered); the root none.
  // Two steps (warm-up and measured).
  auto ag = per_group(p, "FSDP2 all-gather output (flat)");
  CHECK(ag["block 0"][kBlock * 2] == 4);
  CHECK(ag["block 1"][kBlock * 2] == 4);
  CHECK(ag["tok_embeddings"][kEmb * 2] == 4);
  CHECK(ag["output"][kNormOut * 2] == 2);
  CHECK(ag["the root"].empty());
  CHECK(allocs(p, "FSDP2 unsharded norm.weight (all_gather_outputs)").size() == 2);
  CHECK(allocs(p, "FSDP2 unsharded output.weight (all_gather_outputs)").size() == 2);
  // The flat all-gather input: the group's shards cast to bf16 (flat_foreach_copy_input).
  std::map<uint64_t, int> flat_in;
  for (const MemoryEvent* e : allocs(p, "FSDP2 all-gather input (flat_foreach_copy_input, param_dtype)"))
    ++flat_in[e->bytes];
  CHECK(flat_in[kBlock / kWs * 2] == 8);
  CHECK(flat_in[kEmb / kWs * 2] == 4);
  CHECK(flat_in[kNormOut / kWs * 2] == 2);
  // Reduce-scatter once per group per step, in reduce_dtype fp32: input full x 4 B.
  auto rs = per_group(p, "FSDP2 reduce-scatter input (chunk_cat)");
  CHECK(rs["block 0"][kBlock * 4] == 2);
  CHECK(rs["block 1"][kBlock * 4] == 2);
  CHECK(rs["tok_embeddings"][kEmb * 4] == 2);
  CHECK(rs["output"][kNormOut * 4] == 2);
  CHECK(rs["the root"].empty());
}

TEST_CASE("torchtitan + FSDP2: the activations are the single-device torchtitan run's, and "
          "only [norm, output] stays gathered at forward end", "[fsdp2][torchtitan]") {
  // bf16 parameters without a MixedPrecisionPolicy: the same compute dtype on both sides.
  const Program one = build_program(titan({}, "", "bf16"));
  const Program sharded = build_program(titan({}, kPlain, "bf16"));
  const auto a = live_at(one, "forward_end"), b = live_at(sharded, "forward_end");
  for (TensorKind k : {TensorKind::activation, TensorKind::temporary, TensorKind::input})
    CHECK(kind(a, k) == kind(b, k));
  // Parameters at forward end: single device, the model (and the complex64 freqs_cis
  // buffer, the same on both sides); FSDP2, the shards plus [norm, output] gathered.
  const uint64_t full = (2 * kBlock + kEmb + kNormOut) * 2;
  const uint64_t one_params = kind(a, TensorKind::parameter);
  const uint64_t buffers = one_params - full;
  CHECK(kind(b, TensorKind::parameter) == buffers + full / kWs + kNormOut * 2);
  // fsdp_reshard_after_forward "never" (false): every group gathered until its backward.
  const Program keep = build_program(titan({{"parallel.reshard_after_forward", "false"}}, kPlain, "bf16"));
  CHECK(kind(live_at(keep, "forward_end"), TensorKind::parameter) == buffers + full / kWs + full);
  CHECK(kind(live_at(keep, "forward_end"), TensorKind::activation) == kind(a, TensorKind::activation));
  // Each group gathered once per step.
  auto ag = per_group(keep, "FSDP2 all-gather output (flat)");
  CHECK(ag["block 0"][kBlock * 2] == 2);
  CHECK(ag["tok_embeddings"][kEmb * 2] == 2);
  CHECK(ag["output"][kNormOut * 2] == 2);
}

TEST_CASE("torchtitan + FSDP2: what apply_fsdp does not do, and what is not modelled, is "
          "refused by key", "[fsdp2][torchtitan][scenario]") {
  CHECK(load_error({}).empty());
  CHECK(load_error({{"parallel.cpu_offload", "true"}}).empty());
  CHECK(load_error({{"parallel.replicate", "2"}}).empty());  // HSDP: dp_replicate x dp_shard
  const std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, std::string>> refused = {
      {{{"parallel.reshard_after_forward", "2"}}, "parallel.reshard_after_forward: torchtitan's fsdp_reshard_after_forward is a policy"},
      {{{"parallel.fsdp_init", "gpu"}}, "parallel.fsdp_init: torchtitan builds the model on the meta device"},
      {{{"parallel.context", "2"}}, "parallel.context"},
      {{{"parallel.custom_sharded_layers", "output"}}, "parallel.custom_sharded_layers: torchtune's custom_sharded_layers: only with"},
      // per-block compile is modelled (tests/test_compile_torchtitan.cpp); the whole model is not
      {{{"step.compile", "true"}}, "step.compile_scope: torchtitan compiles each TransformerBlock"},
      {{{"lora.rank", "8"}, {"lora.targets", "[q_proj, v_proj]"}}, "lora.rank: torchtitan has no LoRA"},
  };
  for (const auto& [over, message] : refused) {
    INFO(message);
    const std::string err = load_error(over);
    CHECK(err.find(message) != std::string::npos);
  }
  // FSDP1 over torchtitan's code is refused by parallel.sharding.
  try {
    load_scenario_text(titan_yaml("parallel:\n  data: 4\n  sharding: fsdp\n", "bf16"), "titan.yaml");
    FAIL("accepted");
  } catch (const ScenarioError& e) {
    CHECK(std::string(e.what()).find("parallel.sharding: torchtitan shards with FSDP2 (fully_shard): use "
                                     "parallel.sharding: fsdp2") != std::string::npos);
  }
}

TEST_CASE("torchtitan + FSDP2 with its default activation checkpointing, sac-op: each block "
          "caches wq, wv, w1, w2 and the SDPA outputs", "[fsdp2][torchtitan][sac]") {
  // Hand arithmetic, bf16, B x S = 2 x 64 = 128 rows: wq 128 x 256, wv 128 x 128 (2 KV
  // heads of 64), w1 128 x 512, w2 128 x 256 (the 1st, 3rd, 5th, 7th mm of wq, wk, wv, wo,
  // w1, w3, w2), the flash output 128 x 256 and its fp32 logsumexp 2 x 4 heads x 64.
  constexpr uint64_t kCached = (128 * 256 + 128 * 128 + 128 * 512 + 128 * 256 + 128 * 256) * 2 +
                               2 * 4 * 64 * 4;
  const auto act = [](const Program& p) {
    return kind(live_at(p, "forward_end"), TensorKind::activation);
  };
  for (const std::string& parallel : {std::string(), kPlain}) {
    INFO(parallel);
    const Program full = build_program(titan({}, parallel, "bf16"));
    const Program op = build_program(titan({{"checkpoint.policy", "sac-op"}}, parallel, "bf16"));
    CHECK(act(op) == act(full) + 2 * kCached);
  }
  // Sharded or not, the same activations under sac-op and sac-layer:2.
  for (const char* policy : {"sac-op", "sac-layer:2"}) {
    INFO(policy);
    const Program one = build_program(titan({{"checkpoint.policy", policy}}, "", "bf16"));
    const Program sharded = build_program(titan({{"checkpoint.policy", policy}}, kPlain, "bf16"));
    CHECK(act(one) == act(sharded));
  }
}

TEST_CASE("memsim run on llama3-8b-torchtitan-fsdp2-8xh100 (llama3_8b.toml at 5077be6e)",
          "[fsdp2][torchtitan][cli][scenarios]") {
  const std::string path = MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-torchtitan-fsdp2-8xh100.yaml";
  const nlohmann::json j = memsim_test::run_json(path);
  CHECK(j["fits"] == true);
  CHECK(j["rank"]["world_size"] == 8);
  const Scenario s = load_scenario(path);
  CHECK(s.model.arch.impl == graph::ModelImpl::torchtitan);
  const Program p = build_program(s);
  // fp32 shards, fp32 gradients (reduce_dtype fp32), AdamW's two fp32 moments:
  // 8,030,261,248 parameters / 8 ranks (every dim 0 divides by 8) x 4 B each; 291 steps.
  const auto end = live_at(p, "optimizer_end");
  CHECK(kind(end, TensorKind::parameter) == 8030261248ull / 8 * 4);
  CHECK(kind(end, TensorKind::gradient) == 8030261248ull / 8 * 4);
  CHECK(kind(end, TensorKind::optimizer_state) == 8030261248ull / 8 * 8 + 291 * 4);
  // [norm, output] is gathered once per step in forward (bf16: (4096 + 128256 x 4096) x 2 B).
  const auto out_ag = allocs(p, "FSDP2 all-gather output (flat) of output");
  REQUIRE(out_ag.size() == 2);
  CHECK(out_ag[0]->bytes == (4096ull + 128256ull * 4096) * 2);
}
