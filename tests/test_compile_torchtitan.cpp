// torch.compile per block (step.compile_scope: block) on torchtitan's own Llama code
// (model.implementation: torchtitan; docs/compile.md "torchtitan's model code"):
// torchtitan's apply_compile compiles each TransformerBlock, and apply_fsdp then wraps
// the compiled block (torchtitan 5077be6e models/llama3/infra/parallelize.py). Its block
// differs from transformers' in the complex RoPE (view_as_complex, complex mul,
// view_as_real, flatten: OpKind::rope_complex, graph/compile.cpp op_class) and its own
// SDPA call and nn.RMSNorm. Structural checks (no torch.compile on the CPU torch 1.13 of
// the fixtures, no GPU run): compile lowers the forward's end; FSDP2's buffers are the
// same compiled or not; full AC saves only each block's input; what one block saves is
// checked by hand below.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "compile_test_support.h"
#include "graph/compile.h"
#include "graph/models/decoder.h"
#include "scenario/hf_family.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

// A 2-layer torchtitan Llama, bf16 (or fp32 with FSDP2's bf16 param_dtype): D 64, 4 heads
// of 16, 2 KV heads, F 160, vocab 128, micro-batch 2 x 16, flash attention.
std::string yaml(bool compile, const std::string& checkpoint, const std::string& parallel,
                 const std::string& params = "bf16") {
  std::string y =
      "model:\n  family: hf-llama\n  implementation: torchtitan\n  attention: flash\n"
      "  layers: 2\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 160\n  vocab: 128\n"
      "  context_length: 16\n"
      "batch:\n  micro_batch: 2\n  seq_len: 16\n"
      "precision:\n  params: " + params + "\n  autocast: none\n"
      "optimizer:\n  type: adamw\n  impl: fused\n"
      "step:\n  kind: train\n  warmup_steps: 1\n";
  if (compile) y += "  compile: true\n  compile_scope: block\n";
  if (!checkpoint.empty()) y += "checkpoint:\n  policy: " + checkpoint + "\n";
  y += parallel;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return y;
}

Program build(const std::string& y) { return build_program(load_scenario_text(y, "t.yaml")); }

using memsim_test::Trace;
using memsim_test::trace;

// The compiled regions of one forward of the 2-layer model.
std::vector<graph::CompiledRegionStats> compiled_forward(const std::string& params) {
  return memsim_test::compiled_block_forward(load_scenario_text(yaml(false, "", "", params), "t.yaml"));
}

}  // namespace

TEST_CASE("compile + torchtitan: what one compiled block saves, by hand", "[compile][torchtitan]") {
  // rows = 2 x 16 = 32, D 64 (4 heads of 16; 2 KV heads repeated to 4), F 160.
  for (const uint64_t e : {uint64_t{2}, uint64_t{4}}) {
    INFO(e);
    const uint64_t rows = 32, D = 64, F = 160, B = 2, H = 4, S = 16;
    const uint64_t act = rows * D * e;  // a hidden-sized tensor; q, and k / v repeated
    const uint64_t rstd = rows * 4, lse = B * H * S * 4, ff = rows * F * e;
    using graph::OpKind;
    // The min-cut by hand. Saved: the block input (primal); attention_norm's output
    // (wq/wk/wv read it) and rstd; q after the complex RoPE (view_as_complex is banned from
    // recompute, so nothing before it can stand in; 16-bit: its .type_as copy); the
    // repeated k and v (SDPA's backward is not fusible: they are materialised either way);
    // SDPA's output and logsumexp; wo's output (the residual sum x + o is recomputed from
    // it and the input inside ffn_norm's backward); ffn_norm's output and rstd; w1's and
    // w3's outputs; silu(w1) * w3 (w2's input). Recomputed: silu(w1) (eager saves it for
    // the product's backward), the residual sum, the norms' normalised values' producers.
    const std::vector<std::pair<OpKind, uint64_t>> want = {
        {OpKind::other, act},
        {OpKind::fused_rms_norm, act}, {OpKind::fused_rms_norm, rstd},
        {e == 4 ? OpKind::rope_complex : OpKind::to_copy, act},
        {OpKind::expand_clone, act}, {OpKind::expand_clone, act},
        {OpKind::sdpa_flash, act}, {OpKind::sdpa_flash, lse},
        {OpKind::mm_linear, act},
        {OpKind::fused_rms_norm, act}, {OpKind::fused_rms_norm, rstd},
        {OpKind::mm_linear, ff}, {OpKind::mm_linear, ff}, {OpKind::mul, ff}};
    uint64_t total = 0;
    for (const auto& w : want) total += w.second;
    const auto regions = compiled_forward(e == 2 ? "bf16" : "fp32");
    REQUIRE(regions.size() == 2);
    for (const auto& r : regions) {
      INFO(r.layer);
      memsim_test::check_saved_values(r, want);
      // Eager also saves silu(w1) for the product's backward.
      CHECK(r.eager_saved_bytes == total + ff);
    }
  }
}

TEST_CASE("compile + torchtitan + FSDP2: the hooks run around each compiled block",
          "[compile][torchtitan][fsdp2]") {
  const Trace eager1 = trace(build(yaml(false, "", "")));
  const Trace comp1 = trace(build(yaml(true, "", "")));
  CHECK(eager1.ok);
  CHECK(comp1.ok);
  CHECK(comp1.forward_end < eager1.forward_end);
  for (const std::string mp : {"", "  fsdp_mixed_precision: bf16\n  reduce_dtype: fp32\n"}) {
    INFO(mp);
    const std::string par = "parallel:\n  data: 4\n  sharding: fsdp2\n" + mp;
    const std::string params = mp.empty() ? "bf16" : "fp32";
    const Trace eager = trace(build(yaml(false, "", par, params)));
    const Trace comp = trace(build(yaml(true, "", par, params)));
    CHECK(eager.ok);
    CHECK(comp.ok);
    CHECK(comp.end == eager.end);
    REQUIRE(!comp.fsdp2.empty());
    CHECK(comp.fsdp2 == eager.fsdp2);  // FSDP2's schedule is untouched by compile
    CHECK(comp.forward_end < eager.forward_end);
    CHECK(comp.peak <= eager.peak);
    if (mp.empty())  // same bf16 activations as one GPU: the same saving
      CHECK(eager.forward_end - comp.forward_end == eager1.forward_end - comp1.forward_end);
  }
}

TEST_CASE("compile + torchtitan + full AC: each compiled block saves its input only",
          "[compile][torchtitan][checkpoint]") {
  const std::string par = "parallel:\n  data: 4\n  sharding: fsdp2\n";
  for (const std::string& p : {std::string(), par}) {
    INFO(p);
    const Trace eager = trace(build(yaml(false, "full", p)));
    const Trace comp = trace(build(yaml(true, "full", p)));
    const Trace comp_none = trace(build(yaml(true, "", p)));
    CHECK(eager.ok);
    CHECK(comp.ok);
    CHECK(comp.end == eager.end);
    // The tagged block saves its primals (the block input; freqs_cis is a buffer): what
    // eager checkpoint's frame holds.
    CHECK(comp.forward_end == eager.forward_end);
    CHECK(comp.forward_end < comp_none.forward_end);
    CHECK(comp.peak <= eager.peak);
    if (!p.empty()) CHECK(comp.fsdp2 == eager.fsdp2);
  }
  // sac-op (torchtitan's own policy) composes too.
  const Trace sac = trace(build(yaml(true, "sac-op", par)));
  CHECK(sac.ok);
}

TEST_CASE("compile + torchtitan: model scope is refused by key", "[compile][torchtitan]") {
  std::string y = yaml(true, "", "");
  const std::string at = "  compile_scope: block\n";
  y.replace(y.find(at), at.size(), "  compile_scope: model\n");
  try {
    build(y);
    FAIL("not refused");
  } catch (const ScenarioError& e) {
    CHECK(std::string(e.what()).find("step.compile_scope") != std::string::npos);
    CHECK(std::string(e.what()).find("t.yaml") != std::string::npos);
  }
}
