// torch.compile on LitGPT's model code (model.implementation: litgpt with step.compile;
// docs/compile.md "LitGPT"). LitGPT v0.5.13 (26857050) compiles in pretrain.py
// only: `model = torch.compile(model)` before fabric.setup, which re-applies the compile
// around the set-up module, so GPT.forward from the embedding to lm_head's logits is one
// graph (CompileScope::model); Fabric's fp32 cast of the logits and chunked_cross_entropy
// (unshifted: pretrain's targets are the next tokens already) run after it, eagerly.
//  - the whole model's partition against functorch 1.13's min-cut on the CPU stand-in
//    (tests/data/compile/partition_litgpt_{fp32,bf16}.json,
//    tools/fixtures/gen_compile_litgpt_fixture.py), memsim's 1.13 rule set;
//  - the torch 2.x rules: what one compiled layer keeps, by hand;
//  - pretrain's setup and loss against finetune/full.py's; whole steps; refusals by key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "compile_test_support.h"
#include "graph/compile.h"
#include "graph/models/decoder.h"
#include "json_test_support.h"
#include "scenario/hf_family.h"
#include "scenario/scenario.h"
#include "scenario_error_test_support.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// The fixtures' model: 2 layers, D 64, 4 heads of 16, 2 KV heads, F 160, vocab 128,
// block 32, 2 x `seq` tokens; bf16 runs flash, fp32 mem-efficient (the kernels SDPA picks).
// `compile`: pretrain.py's run (the optimizer and clipping it uses); else finetune/full.py's.
std::string yaml(bool compile, const std::string& params = "bf16", const std::string& rest = "",
                 int seq = 32) {
  std::string y = "model:\n  family: hf-llama\n  implementation: litgpt\n";
  y += std::string("  attention: ") + (params == "fp32" ? "mem-efficient" : "flash") + "\n";
  y += "  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 160\n  vocab: 128\n"
       "  context_length: 32\n"
       "batch:\n  micro_batch: 2\n  seq_len: " + std::to_string(seq) + "\n"
       "precision:\n  params: " + params + "\n  autocast: none\n"
       "optimizer:\n  type: adamw\n  impl: fused\n";
  y += "  max_grad_norm: 1.0\n  clip_error_if_nonfinite: true\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  if (compile) y += "  compile: true\n";
  y += rest;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return y;
}

Program build(const std::string& y) { return build_program(load_scenario_text(y, "t.yaml")); }

std::string error_of(const std::string& y) { return memsim_test::refusal_of([&] { build(y); }); }

// One forward of the scenario's model with `v`'s rules, GPT.forward compiled as one region
// (no step schedule): the region's statistics.
graph::CompiledRegionStats compiled_model(const std::string& params, graph::PartitionerVersion v) {
  const std::vector<graph::CompiledRegionStats> regions = memsim_test::compiled_forward_regions(
      load_scenario_text(yaml(false, params), "t.yaml"), graph::CompileScope::model, v);
  REQUIRE(regions.size() == 1);
  return regions[0];
}

}  // namespace

TEST_CASE("compile + litgpt: the whole GPT saves what AOTAutograd's min-cut saves (torch 1.13 CPU)",
          "[compile][litgpt][fixtures]") {
  for (const char* dtype : {"fp32", "bf16"}) {
    INFO(dtype);
    const nlohmann::json fx = memsim_test::load_json(std::filesystem::path(
        MEMSIM_SOURCE_DIR + "/tests/data/compile/partition_litgpt_" + dtype + ".json"));
    const nlohmann::json& c = fx["config"];
    REQUIRE(c["layers"] == 2);
    REQUIRE(c["d_model"] == 64);
    REQUIRE(c["heads"] == 4);
    REQUIRE(c["kv_heads"] == 2);
    REQUIRE(c["d_ff"] == 160);
    REQUIRE(c["vocab"] == 128);
    REQUIRE(c["context"] == 32);
    REQUIRE(c["batch"] == 2);
    REQUIRE(c["seq"] == 32);
    const auto r = compiled_model(dtype, graph::PartitionerVersion::torch113_inductor);
    for (size_t i = 0; i < r.saved_values.size(); ++i)
      UNSCOPED_INFO(i << ": op " << static_cast<int>(r.saved_values[i].op) << " bytes "
                      << r.saved_values[i].bytes << " input " << r.saved_values[i].input);
    // Eager autograd's saved set of the same graph (storages once, parameters and the
    // cos / sin buffers left out): the region memsim partitions is the fixture's.
    CHECK(r.eager_saved_bytes == fx["eager_saved_bytes"].get<uint64_t>());
    // The partition: the same bytes in the same number of storages.
    CHECK(r.saved_bytes == fx["saved_bytes"].get<uint64_t>());
    CHECK(r.saved == fx["saved_storages"].get<uint32_t>());
    // Storage by storage: the same sizes (memsim keeps one vertex per storage).
    std::vector<uint64_t> real, sim;
    std::vector<int> seen;
    for (const nlohmann::json& row : fx["saved"]) {
      if (row["parameter"].get<bool>()) continue;
      const int id = row["storage"].get<int>();
      if (std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
      seen.push_back(id);
      real.push_back(row["storage_bytes"].get<uint64_t>());
    }
    for (const auto& v : r.saved_values) sim.push_back(v.bytes);
    std::sort(real.begin(), real.end());
    std::sort(sim.begin(), sim.end());
    CHECK(sim == real);
  }
}


TEST_CASE("compile + litgpt: what the compiled GPT saves under the torch 2.x rules, by hand",
          "[compile][litgpt]") {
  for (const uint64_t e : {uint64_t{2}, uint64_t{4}}) {
    INFO(e);
    const uint64_t rows = 64, D = 64, F = 160, B = 2, H = 4, S = 32;
    const uint64_t act = rows * D * e, rstd = rows * 4, lse = B * H * S * 4, ff = rows * F * e;
    using graph::OpKind;
    // The min-cut by hand (docs/compile.md "LitGPT"). The region's primal the ids (int64,
    // the embedding's backward reads them); the embedding's output (layer 0's input: the
    // fp32 copy norm_1's backward needs is recomputed from it). Per layer: norm's rsqrt
    // (the mean before it is a banned reduction) and its output (16-bit: the .to(dtype)
    // copy; fp32: x_normed * weight), which qkv's / fc's mms read (materialised in the
    // backward); q after the RoPE (the cat of an empty slice, Inductor's clone; SDPA reads
    // it); the repeated k and v (repeat_interleave's clone); SDPA's output and logsumexp;
    // with flash the reshape's copy of the output (attn.proj reads it); attn.proj's output
    // (the residual sum is recomputed from it and the layer input); norm_2's; fc_1's and
    // fc_2's outputs and silu(fc_1) * fc_2 (proj's input); the MLP proj's output (the
    // next layer's input, or ln_f's, is recomputed from it). Then ln_f's rsqrt and output
    // (lm_head's input). Never allocated: RMSNorm's fp32 chain, weight.float(), k's
    // RoPE (fused into the GQA copy), silu.
    std::vector<std::pair<OpKind, uint64_t>> want = {{OpKind::other, B * S * 8},
                                                     {OpKind::embedding_nn, act}};
    const OpKind norm_out = e == 4 ? OpKind::mul : OpKind::to_copy;
    const OpKind sdpa = e == 4 ? OpKind::sdpa_efficient : OpKind::sdpa_flash;
    for (int l = 0; l < 2; ++l) {
      for (const auto& v : std::vector<std::pair<OpKind, uint64_t>>{
               {OpKind::rsqrt, rstd}, {norm_out, act}, {OpKind::rope_litgpt, act},
               {OpKind::expand_clone, act}, {OpKind::expand_clone, act}, {sdpa, act}, {sdpa, lse}})
        want.push_back(v);
      if (e == 2) want.push_back({OpKind::clone, act});  // flash: y.reshape copies
      for (const auto& v : std::vector<std::pair<OpKind, uint64_t>>{
               {OpKind::mm_linear, act}, {OpKind::rsqrt, rstd}, {norm_out, act},
               {OpKind::mm_linear, ff}, {OpKind::mm_linear, ff}, {OpKind::mul, ff},
               {OpKind::mm_linear, act}})
        want.push_back(v);
    }
    want.push_back({OpKind::rsqrt, rstd});
    want.push_back({norm_out, act});
    uint64_t total = 0;
    for (const auto& w : want) total += w.second;
    const auto r = compiled_model(e == 2 ? "bf16" : "fp32", graph::PartitionerVersion::torch25);
    memsim_test::check_saved_values(r, want);
    // The 2.x rules reach the 1.13 fixture's bytes (the materialised-backward ban where
    // 1.13 had its unlisted views and unlisted cat).
    CHECK(r.saved_bytes == (e == 2 ? 290560u : 544512u));
    if (e == 2) {
      // Eager saves per RMSNorm the fp32 x.float() and x_normed (rows x D x 4 each) and
      // weight.float() (D x 4), per layer silu(fc_1), but not the embedding's output nor
      // attn.proj's and the MLP proj's outputs (their readers save nothing).
      const uint64_t norm = 2 * rows * D * 4 + D * 4;
      CHECK(r.eager_saved_bytes == total + 5 * norm + 2 * ff - act - 2 * 2 * act);
    }
  }
}

TEST_CASE("compile + litgpt: pretrain's setup and unshifted loss, the step against eager",
          "[compile][litgpt]") {
  // step.compile with litgpt is pretrain.py's run: the rope cache is rebuilt by
  // initialize_weights (and at max_seq_length) before fabric.setup casts it, and the loss
  // is chunked_cross_entropy(logits, targets): B*S rows, no slice copy, no SliceBackward0.
  const Program comp = build(yaml(true));
  const Program eager = build(yaml(false));
  const memsim_test::Trace tc = memsim_test::trace(comp), te = memsim_test::trace(eager);
  CHECK(tc.ok);
  CHECK(te.ok);
  CHECK(tc.end == te.end);
  // The forward's end differs by exactly what the compiled GPT does not save: eager's
  // saved set minus the partition's (the by-hand test above, 455,680 - 290,560 B); the
  // loss runs after the mark.
  CHECK(te.forward_end - tc.forward_end == 455680u - 290560u);
  CHECK(tc.peak < te.peak);
  // Setup: pretrain builds the fp32 cache (32 x 16 x 4 B each of cos and sin) twice, then
  // the bf16 cast; full.py (seq == block size) once, then the cast.
  const uint64_t cache = 32 * 16 * 4;
  auto setup_allocs = [&](const Program& p) {
    int n = 0;
    for (const MemoryEvent& ev : p.events)
      if (ev.type == EventType::alloc && ev.phase == Phase::setup &&
          p.tensors[ev.tensor].kind == TensorKind::other && ev.bytes == cache)
        ++n;
    return n;
  };
  CHECK(setup_allocs(comp) == 2 * setup_allocs(eager));
  // The loss: full.py's copies the sliced (B, S-1, V) fp32 logits and, in backward,
  // SliceBackward0 makes a (B, S, V) zeros; pretrain's neither.
  const uint64_t V = 128, full = 2 * 32 * V * 4, sliced = 2 * 31 * V * 4;
  auto count = [](const Program& p, Phase ph, uint64_t bytes) {
    int n = 0;
    for (const MemoryEvent& ev : p.events)
      if (ev.type == EventType::alloc && ev.phase == ph && ev.bytes == bytes) ++n;
    return n;
  };
  CHECK(count(eager, Phase::loss, sliced) > 0);
  CHECK(count(comp, Phase::loss, sliced) == 0);
  CHECK(count(comp, Phase::backward, sliced) == 0);
  // Backward, per step (warm-up and measured): the one 128-row chunk's nll zeros and
  // log-softmax grad, then SplitBackward0's cat, which is the logits' grad: B*S rows
  // pretrain (3 x 2 of `full`), B*(S-1) full.py (3 x 2 of `sliced`), whose SliceBackward0
  // then makes the (B, S, V) zeros (2 of `full`).
  CHECK(count(comp, Phase::backward, full) == 6);
  CHECK(count(eager, Phase::backward, sliced) == 6);
  CHECK(count(eager, Phase::backward, full) == 2);
  // Fabric 32-true (fp32, mem-efficient attention): the same, 708,352 - 544,512 B.
  const memsim_test::Trace c32 = memsim_test::trace(build(yaml(true, "fp32")));
  const memsim_test::Trace e32 = memsim_test::trace(build(yaml(false, "fp32")));
  CHECK(c32.ok);
  CHECK(c32.end == e32.end);
  CHECK(e32.forward_end - c32.forward_end == 708352u - 544512u);
}

TEST_CASE("compile + litgpt: a shorter max_seq_length is rebuilt before fabric.setup's cast",
          "[compile][litgpt]") {
  // pretrain.py sets model.max_seq_length = train.max_seq_length before torch.compile and
  // fabric.setup: the cache is rebuilt (fp32) at that length, then cast with the model, so
  // RoPE runs in the model's dtype; full.py sets it after setup and keeps fp32 buffers.
  const Program comp = build(yaml(true, "bf16", "", 16));
  const Program eager = build(yaml(false, "bf16", "", 16));
  auto live_buffers = [](const Program& p) {
    std::vector<uint64_t> live;
    std::vector<uint8_t> on(p.tensors.size(), 0);
    for (const MemoryEvent& ev : p.events) {
      if (ev.phase != Phase::setup || p.tensors[ev.tensor].kind != TensorKind::other) continue;
      if (ev.type == EventType::alloc) on[ev.tensor] = 1;
      if (ev.type == EventType::free) on[ev.tensor] = 0;
    }
    for (size_t t = 0; t < on.size(); ++t)
      if (on[t]) live.push_back(p.tensors[t].bytes);
    return live;
  };
  // cos and sin: (16, 16) bf16 compiled (pretrain), (16, 16) fp32 eager (full.py).
  CHECK(live_buffers(comp) == std::vector<uint64_t>{16 * 16 * 2, 16 * 16 * 2});
  CHECK(live_buffers(eager) == std::vector<uint64_t>{16 * 16 * 4, 16 * 16 * 4});
  CHECK(memsim_test::trace(comp).ok);
}

TEST_CASE("compile + litgpt: what is not modelled is refused by key", "[compile][litgpt]") {
  // finetune/full.py's loop with compile: not a LitGPT run, but pretrain's is what runs;
  // its fixed settings are refused when they differ.
  std::string err = error_of(yaml(true, "bf16", "  compile_scope: block\n"));
  CHECK(err.find("step.compile_scope") != std::string::npos);
  CHECK(err.find("t.yaml") != std::string::npos);
  std::string y = yaml(true);
  y.replace(y.find("impl: fused"), 11, "impl: foreach");
  err = error_of(y);
  CHECK(err.find("optimizer.impl") != std::string::npos);
  y = yaml(true);
  y.replace(y.find("  max_grad_norm: 1.0\n"), 21, "");
  y.replace(y.find("  clip_error_if_nonfinite: true\n"), 32, "");
  err = error_of(y);
  CHECK(err.find("optimizer.max_grad_norm") != std::string::npos);
  y = yaml(true);
  y.replace(y.find("clip_error_if_nonfinite: true"), 29, "clip_error_if_nonfinite: false");
  err = error_of(y);
  CHECK(err.find("optimizer.clip_error_if_nonfinite") != std::string::npos);
  err = error_of(yaml(true, "bf16", "lora:\n  rank: 8\n  targets: [o_proj]\n"));
  CHECK(err.find("lora.rank") != std::string::npos);
  err = error_of(yaml(true, "bf16", "parallel:\n  data: 2\n  sharding: fsdp2\n"));
  CHECK(err.find("parallel.sharding") != std::string::npos);
  err = error_of(yaml(true, "bf16", "checkpoint:\n  policy: full\n"));
  CHECK(err.find("checkpoint.policy") != std::string::npos);
  y = yaml(true);
  y.replace(y.find("autocast: none"), 14, "autocast: bf16");
  y.replace(y.find("params: bf16"), 12, "params: fp32");
  err = error_of(y);
  CHECK(err.find("precision.autocast") != std::string::npos);
  // Eager litgpt is unchanged: finetune/full.py's run builds without the pretrain keys.
  CHECK(error_of(yaml(false)).empty());
}
