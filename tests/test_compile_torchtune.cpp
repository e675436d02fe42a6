// torch.compile on torchtune's model code (model.implementation: torchtune; docs/compile.md
// "torchtune's code"). torchtune v0.6.1's recipes with `compile: True` (a6290a5b
// recipes/full_finetune_single_device.py, full_finetune_distributed.py) call
// training.compile_model, which compiles each TransformerSelfAttentionLayer in place
// (block scope), and training.compile_loss, which compiles CEWithChunkedOutputLoss's
// compute_cross_entropy alone (torchtune/training/_compile.py): each of the 8 output
// chunks' upcast + cross-entropy is its own graph (CompileScope::loss). The partition of
// one layer and of one loss chunk is checked here by hand against the min-cut rules
// (no torch.compile on the fixtures' CPU torch 1.13, no GPU this session); FSDP2 is
// checked structurally as for torchtitan; what is not modelled is refused by key.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <utility>
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

// A 2-layer torchtune Llama: D 64, 4 heads of 16, 2 KV heads, F 160, vocab 128,
// micro-batch 2 x 16, flash attention.
std::string yaml(bool compile, const std::string& params = "bf16", const std::string& rest = "") {
  std::string y =
      "model:\n  family: hf-llama\n  implementation: torchtune\n  attention: flash\n"
      "  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 160\n  vocab: 128\n"
      "  context_length: 16\n"
      "batch:\n  micro_batch: 2\n  seq_len: 16\n"
      "precision:\n  params: " + params + "\n  autocast: none\n"
      "optimizer:\n  type: adamw\n  impl: fused\n"
      "step:\n  kind: train\n  warmup_steps: 1\n";
  if (compile) y += "  compile: true\n  compile_scope: block\n";
  y += rest;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return y;
}

Program build(const std::string& y) { return build_program(load_scenario_text(y, "t.yaml")); }

// The compiled regions of one forward and loss: the 2 layers, then the 8 loss chunks.
std::vector<graph::CompiledRegionStats> compiled_forward_loss(const std::string& params,
                                                              const std::string& rest = "") {
  const Scenario s = load_scenario_text(yaml(false, params, rest), "t.yaml");
  Program program;
  graph::Runtime rt(program);
  graph::CompileOptions o;
  o.scope = graph::CompileScope::block;
  o.compile_loss = true;  // what the schedule sets for torchtune
  graph::CompileEngine engine(rt, o);
  graph::DecoderModel model(rt, hf_shape(s));
  model.construct();
  const uint64_t tokens = s.batch.micro_batch * s.batch.seq_len;
  graph::Tensor ids = rt.alloc(tokens * 8, TensorKind::input, graph::OpKind::other);
  graph::Tensor labels = rt.alloc(tokens * 8, TensorKind::input, graph::OpKind::other);
  rt.ctx.phase = Phase::forward;
  rt.begin_graph();
  graph::Tensor logits = model.forward(ids);
  graph::Tensor loss = model.loss(logits, labels);
  rt.freeze();
  return engine.regions();
}

std::string error_of(const std::string& y) { return memsim_test::refusal_of([&] { build(y); }); }

using memsim_test::Trace;
using memsim_test::trace;

}  // namespace

TEST_CASE("compile + torchtune: what one compiled layer saves, by hand", "[compile][torchtune]") {
  for (const uint64_t e : {uint64_t{2}, uint64_t{4}}) {
    INFO(e);
    const uint64_t rows = 32, D = 64, F = 160, B = 2, H = 4, S = 16;
    const uint64_t act = rows * D * e;  // a hidden-sized tensor; q, and k / v repeated
    const uint64_t rstd = rows * 4, lse = B * H * S * 4, ff = rows * F * e;
    using graph::OpKind;
    // The min-cut by hand (docs/compile.md "torchtune's code"). Saved: the layer input
    // (primal); sa_norm's rsqrt (the mean before it is a banned reduction; the rsqrt is
    // the cheaper of the two equal cuts nearer the backward) and its output (x_normed *
    // scale: q/k/v's mms read it, materialised in the backward); q after the RoPE (SDPA's
    // backward reads it; 16-bit: its .type_as copy, fp32: the stack); the repeated k and
    // v (expand + clone; SDPA reads them); SDPA's output and logsumexp; output_proj's
    // output (the residual sum is recomputed from it and the input for mlp_norm's
    // backward); mlp_norm's rsqrt and output; w1's and w3's outputs; silu(w1) * w3
    // (w2's input). Not allocated at all: RMSNorm's fp32 chain (x.float(), pow, mean's
    // add, the product, type_as), k's RoPE (fused into the GQA copy's kernel) and silu.
    const std::vector<std::pair<OpKind, uint64_t>> want = {
        {OpKind::other, act},
        {OpKind::rsqrt, rstd}, {OpKind::mul, act},
        {e == 4 ? OpKind::rope_pairs : OpKind::to_copy, act},
        {OpKind::expand_clone, act}, {OpKind::expand_clone, act},
        {OpKind::sdpa_flash, act}, {OpKind::sdpa_flash, lse},
        {OpKind::mm_linear, act},
        {OpKind::rsqrt, rstd}, {OpKind::mul, act},
        {OpKind::mm_linear, ff}, {OpKind::mm_linear, ff}, {OpKind::mul, ff}};
    uint64_t total = 0;
    for (const auto& w : want) total += w.second;
    const auto regions = compiled_forward_loss(e == 2 ? "bf16" : "fp32");
    REQUIRE(regions.size() == 2 + 8);
    for (int l = 0; l < 2; ++l) {
      const auto& r = regions[l];
      INFO(l);
      memsim_test::check_saved_values(r, want);
      // Eager saves silu(w1) for the product's backward and, per RMSNorm: 16-bit,
      // x.float() (fp32: pow's and the product's input) and x_normed (the scale's mul
      // reads it), but not the layer input nor output_proj's output (their readers, the
      // upcast and the residual add, save nothing); fp32, the input itself (x.float() is
      // x), the residual sum and x * rsqrt (the scale's input).
      const uint64_t xf = rows * D * 4;
      CHECK(r.eager_saved_bytes == total + ff + (e == 4 ? 2 * act : 2 * xf));
    }
  }
}

TEST_CASE("compile + torchtune: compile_loss saves each chunk's logits, not its log-probs",
          "[compile][torchtune][loss]") {
  for (const uint64_t e : {uint64_t{2}, uint64_t{4}}) {
    INFO(e);
    const uint64_t rows = 32 / 8, V = 128;
    const auto regions = compiled_forward_loss(e == 2 ? "bf16" : "fp32");
    REQUIRE(regions.size() == 2 + 8);
    for (size_t i = 2; i < regions.size(); ++i) {
      const auto& r = regions[i];
      INFO(i);
      for (size_t k = 0; k < r.saved_values.size(); ++k)
        UNSCOPED_INFO(k << ": op " << static_cast<int>(r.saved_values[k].op) << " bytes "
                        << r.saved_values[k].bytes << " input " << r.saved_values[k].input);
      // compute_cross_entropy(logits, labels): logits.float() -> log_softmax -> nll_loss.
      // Eager saves the fp32 log-probabilities (LogSoftmaxBackward's result, NllLoss's
      // input), the targets and total_weight. Compiled, the log-probabilities are
      // recomputable (the decomposed log_softmax and nll_loss are pointwise and reductions)
      // and every backward reader is fusible, so the cut is at the chunk's logits (the
      // primal, in the model's dtype) and the targets; of what it computes, only
      // total_weight (a scalar reduction of a larger input: banned, ban_recompute_reductions)
      // is saved.
      REQUIRE(r.saved_values.size() == 3);
      CHECK(r.saved_values[0].input);
      CHECK(r.saved_values[0].bytes == rows * V * e);
      CHECK(r.saved_values[1].input);
      CHECK(r.saved_values[1].bytes == rows * 8);
      CHECK(!r.saved_values[2].input);
      CHECK(r.saved_values[2].op == graph::OpKind::nll_loss);
      CHECK(r.saved_values[2].bytes == 4);
      CHECK(r.saved_bytes == rows * V * e + rows * 8 + 4);
      CHECK(r.eager_saved_bytes == rows * V * 4 + rows * 8 + 4);
      // x.float() and the log-probabilities are inside the one kernel: not allocated.
      CHECK(r.fused_away_bytes >= rows * V * 4 + (e == 4 ? 0 : rows * V * 4));
    }
  }
}

TEST_CASE("compile + torchtune: the loss chunk against AOTAutograd's partition (torch 1.13 CPU)",
          "[compile][torchtune][loss][fixtures]") {
  // tests/data/compile/partition_tune_ce.json (tools/fixtures/gen_compile_loss_fixture.py):
  // compute_cross_entropy on a (4, 128) chunk, with Inductor's log_softmax / nll_loss
  // decompositions, partitioned by functorch 1.13's min-cut. memsim's chunk: 1 x 32
  // tokens in 8 chunks of 4 rows, vocab 128.
  const nlohmann::json fx = memsim_test::load_json(
      std::filesystem::path(MEMSIM_SOURCE_DIR + "/tests/data/compile/partition_tune_ce.json"));
  REQUIRE(fx["runs"].size() == 2);
  for (const nlohmann::json& run : fx["runs"]) {
    const std::string dtype = run["dtype"];
    INFO(dtype);
    REQUIRE(run["rows"] == 4);
    REQUIRE(run["vocab"] == 128);
    const auto regions = compiled_forward_loss(dtype == "bfloat16" ? "bf16" : "fp32",
                                               "");
    REQUIRE(regions.size() == 2 + 8);
    const auto& r = regions[2];
    // Eager: exactly the fixture's (the fp32 log-probabilities, targets, total_weight).
    CHECK(r.eager_saved_bytes == run["eager_saved_bytes"].get<uint64_t>());
    // Compiled: the one chunk-sized value (bf16: the logits, a primal; fp32: a chunk-sized
    // fp32 value, the fixture's log-probabilities where memsim keeps the equal-sized
    // input) and the targets are the fixture's.
    uint64_t big = 0, targets = 0, small = 0;
    for (const nlohmann::json& v : run["saved"]) {
      const uint64_t b = v["bytes"];
      if (b >= 4 * 128 * 2) big += b;
      else if (v["dtype"] == "int64") targets += b;
      else small += b;
    }
    uint64_t m_big = 0, m_small = 0;
    for (const auto& v : r.saved_values) (v.bytes >= 4 * 128 * 2 ? m_big : m_small) += v.bytes;
    CHECK(m_big == big);
    CHECK(m_small == 32 + 4);  // the targets, total_weight
    CHECK(targets == 32);
    // The known difference (docs/compile.md "torchtune's code"): with bf16 logits the
    // real partition also keeps the decomposed log_softmax's amax and log-sum-exp (2 x
    // rows x 4 B), which memsim's one-op log_softmax has no vertex for, and not
    // total_weight (dead code for reduction="sum"), which memsim keeps (4 B).
    CHECK(small == (dtype == "bfloat16" ? 2 * 4 * 4 : 0));
  }
}

TEST_CASE("compile + torchtune: the step runs and saves less than eager",
          "[compile][torchtune]") {
  const Trace eager = trace(build(yaml(false)));
  const Trace comp = trace(build(yaml(true)));
  CHECK(eager.ok);
  CHECK(comp.ok);
  CHECK(comp.end == eager.end);
  CHECK(comp.forward_end < eager.forward_end);
  CHECK(comp.peak <= eager.peak);
}

TEST_CASE("compile + torchtune + FSDP2: the hooks run around each compiled layer",
          "[compile][torchtune][fsdp2]") {
  const Trace eager1 = trace(build(yaml(false)));
  const Trace comp1 = trace(build(yaml(true)));
  const std::string par = "parallel:\n  data: 4\n  sharding: fsdp2\n";
  const Trace eager = trace(build(yaml(false, "bf16", par)));
  const Trace comp = trace(build(yaml(true, "bf16", par)));
  CHECK(eager.ok);
  CHECK(comp.ok);
  CHECK(comp.end == eager.end);
  REQUIRE(!comp.fsdp2.empty());
  CHECK(comp.fsdp2 == eager.fsdp2);  // FSDP2's schedule is untouched by compile
  // The same bf16 activations as one GPU: the same saving at the forward's end.
  CHECK(eager.forward_end - comp.forward_end == eager1.forward_end - comp1.forward_end);
}

TEST_CASE("compile + torchtune: what is not modelled is refused by key", "[compile][torchtune]") {
  std::string y = yaml(true);
  const std::string at = "  compile_scope: block\n";
  std::string m = y;
  m.replace(m.find(at), at.size(), "  compile_scope: model\n");
  std::string err = error_of(m);
  CHECK(err.find("step.compile_scope") != std::string::npos);
  CHECK(err.find("t.yaml") != std::string::npos);
  // checkpoint.policy full is modelled (tests/test_compile_checkpoint_outside.cpp).
  // LoRA with compile is modelled on torchtune's code (tests/test_compile_lora.cpp); its
  // dropout is refused.
  err = error_of(yaml(true, "bf16", "lora:\n  rank: 8\n  dropout: 0.1\n  targets: [q_proj, v_proj]\n"));
  CHECK(err.find("lora.dropout") != std::string::npos);
  // litgpt's code stays refused.
  std::string lit = yaml(true);
  lit.replace(lit.find("torchtune"), 9, "litgpt");
  err = error_of(lit);
  CHECK(err.find("step.compile") != std::string::npos);
}
