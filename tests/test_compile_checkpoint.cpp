// torch.compile composed with activation checkpointing of whole blocks (checkpoint.policy
// full or sac-layer:N with step.compile_scope: block; graph/compile.h 4b, docs/compile.md
// "With activation checkpointing"), torchtitan's order: apply_ac, then apply_compile on
// the wrapped block. Dynamo traces torch.utils.checkpoint as the tag_activation_checkpoint
// HOP, every op of it tagged PREFER_RECOMPUTE; the partitioner sends a tagged node to the
// sink (must_recompute), so the compiled forward saves the block's inputs only, and the
// backward graph recomputes the block (reordering_to_mimic_autograd_engine: just before
// the first backward op that needs it). Checked here without a GPU (no torch.compile on
// the CPU torch 1.13 of the fixtures):
//  - the forward's end holds exactly what eager full checkpointing holds (each block's
//    inputs, which eager's checkpoint frame keeps and torch's CPU fixtures have matched);
//  - the recompute of one Llama block (fp32, 2 x 16 tokens, D 64, 4 heads / 2 KV heads,
//    F 160) materialises by hand arithmetic exactly the values its backward reads that are
//    not fused into a backward kernel, plus o_proj's output, from which the residual sum
//    that the second RMSNorm's backward reads is recomputed;
//  - a well-formed event stream for Llama and GPT-2, full and sac-layer:2, with FSDP2 too;
//  - sac-op (torchtitan's op-level SAC): the cached mm outputs the backward reads are saved,
//    down_proj's (read only by the residual sum) is not, by hand arithmetic;
//  - what is not modelled is refused by key.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "compile_test_support.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

std::string yaml(const std::string& family, bool compile, const std::string& policy,
                 const std::string& parallel = "") {
  const std::string on = compile ? "  compile: true\n  compile_scope: block\n" : "";
  const std::string ckpt = policy.empty() ? "" : "checkpoint:\n  policy: " + policy + "\n";
  return memsim_test::tiny_compile_yaml(family, "fp32", "for-loop", on, ckpt + parallel);
}

Program build(const std::string& y) { return build_program(load_scenario_text(y, "a.yaml")); }

struct Walk {
  bool ok = true;
  uint64_t forward_end = 0, peak = 0, end = 0;
  // Per layer: the most recomputed bytes alive at once in the measured step's backward.
  std::vector<uint64_t> recomputed_max = std::vector<uint64_t>(2, 0);
  uint32_t recomputed_allocs = 0;
};

Walk walk(const Program& p) {
  Walk w;
  std::vector<uint8_t> live(p.tensors.size(), 0);
  std::vector<uint64_t> rec(2, 0);
  uint64_t cur = 0;
  bool measured = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark) {
      const std::string& name = p.str(static_cast<uint32_t>(e.bytes));
      if (name == "measured_step_begin") {
        measured = true;
        w.peak = cur;
      }
      if (name == "forward_end" && measured) w.forward_end = cur;
      continue;
    }
    if (e.type != EventType::alloc && e.type != EventType::free) continue;
    const bool a = e.type == EventType::alloc;
    if (live[e.tensor] == a) w.ok = false;
    live[e.tensor] = a;
    const uint64_t bytes = p.tensors[e.tensor].bytes;
    cur = a ? cur + bytes : cur - bytes;
    if (measured) w.peak = std::max(w.peak, cur);
    // The recompute's own tensors (FSDP2's hooks allocate while a re-run is under way too).
    const TensorInfo& info = p.tensors[e.tensor];
    const bool fsdp2 = info.role == NameRole::none && info.name != 0 &&
                       p.str(info.name).rfind("FSDP2", 0) == 0;
    if ((info.flags & kTensorRecomputed) == 0 || fsdp2 || e.layer < 0 || e.layer > 1) continue;
    rec[e.layer] = a ? rec[e.layer] + bytes : rec[e.layer] - bytes;
    if (!measured) continue;
    if (a) ++w.recomputed_allocs;
    w.recomputed_max[e.layer] = std::max(w.recomputed_max[e.layer], rec[e.layer]);
  }
  w.end = cur;
  return w;
}

}  // namespace

TEST_CASE("compile + full AC: each compiled block saves its inputs only", "[compile][checkpoint]") {
  for (const char* family : {"hf-llama", "hf-gpt2"}) {
    INFO(family);
    const Walk eager = walk(build(yaml(family, false, "full")));
    const Walk comp = walk(build(yaml(family, true, "full")));
    const Walk comp_none = walk(build(yaml(family, true, "")));
    CHECK(eager.ok);
    CHECK(comp.ok);
    CHECK(comp.end == eager.end);
    // The tagged block saves its primals: what eager checkpoint's frame holds.
    CHECK(comp.forward_end == eager.forward_end);
    CHECK(comp.forward_end < comp_none.forward_end);
    // The recompute is fused: it never holds more than eager's re-run.
    CHECK(comp.peak <= eager.peak);
    CHECK(comp.recomputed_allocs > 0);
    CHECK(comp.recomputed_max[1] <= eager.recomputed_max[1]);
    // sac-layer:2 checkpoints layer 1 only: between the two.
    const Walk sac2 = walk(build(yaml(family, true, "sac-layer:2")));
    CHECK(sac2.ok);
    CHECK(sac2.end == eager.end);
    CHECK(sac2.forward_end > comp.forward_end);
    CHECK(sac2.forward_end < comp_none.forward_end);
    CHECK(sac2.recomputed_max[0] == 0);
    CHECK(sac2.recomputed_max[1] == comp.recomputed_max[1]);
  }
}

TEST_CASE("compile + full AC: the recompute of a Llama block by hand", "[compile][checkpoint]") {
  // fp32, rows = 2 x 16 = 32, D 64 (4 heads of 16), 2 KV heads repeated to 4, F 160.
  const uint64_t rows = 32, D = 64, F = 160, B = 2, H = 4, S = 16;
  const uint64_t act = rows * D * 4;      // 8,192: a hidden-sized fp32 tensor
  const uint64_t probs = B * H * S * S * 4;  // 8,192: the attention probabilities
  const uint64_t ff = rows * F * 4;       // 20,480: gate / up / silu(gate) * up
  // What the backward reads and gets as buffers: input_layernorm's output (q/k/v's
  // input), q after RoPE, the repeated k and v (the score and context bmms' inputs), the
  // softmax output, the attention output (o_proj's input), post_attention_layernorm's
  // output, gate and up (SiLU's and the product's backward), silu(gate) * up (down_proj's
  // input). Recomputed inside backward kernels instead: both RMSNorms' rsqrt and
  // normalised values, the residual sum, silu(gate). Held for them: o_proj's output (the
  // residual sum x + o is recomputed from it; x is the block's input, alive anyway).
  const uint64_t materialised = 6 * act + probs + 3 * ff;
  const uint64_t held = act;
  REQUIRE(materialised + held == 126'976);
  const Walk comp = walk(build(yaml("hf-llama", true, "full")));
  REQUIRE(comp.ok);
  CHECK(comp.recomputed_max[0] == materialised + held);
  CHECK(comp.recomputed_max[1] == materialised + held);
}

TEST_CASE("compile + AC + FSDP2: torchtitan's composition runs", "[compile][checkpoint][fsdp2]") {
  const std::string par = "parallel:\n  data: 4\n  sharding: fsdp2\n";
  for (const char* policy : {"full", "sac-layer:2", "sac-op"}) {
    INFO(policy);
    const Walk eager = walk(build(yaml("hf-llama", false, policy, par)));
    const Walk comp = walk(build(yaml("hf-llama", true, policy, par)));
    CHECK(comp.ok);
    CHECK(comp.end == eager.end);
    CHECK(comp.peak <= eager.peak);
    // The recompute does not depend on FSDP2; the forward's end moves as on one GPU.
    const Walk single = walk(build(yaml("hf-llama", true, policy)));
    const Walk single_eager = walk(build(yaml("hf-llama", false, policy)));
    CHECK(comp.recomputed_max[1] == single.recomputed_max[1]);
    CHECK(eager.forward_end - comp.forward_end == single_eager.forward_end - single.forward_end);
  }
}

TEST_CASE("compile + AC: what is not modelled is refused by key", "[compile][checkpoint]") {
  auto refused = [](const std::string& y, const std::string& key) {
    INFO(key);
    try {
      build(y);
      FAIL("not refused");
    } catch (const ScenarioError& e) {
      CHECK(std::string(e.what()).find(key) != std::string::npos);
    }
  };
  refused(yaml("hf-llama", true, "selective"), "checkpoint.policy");
  std::string model_scope = yaml("hf-llama", true, "full");
  model_scope.replace(model_scope.find("compile_scope: block"), 20, "compile_scope: model");
  refused(model_scope, "step.compile_scope");
  std::string reentrant = yaml("hf-llama", true, "full");
  reentrant.replace(reentrant.find("policy: full\n"), 13, "policy: full\n  reentrant: true\n");
  refused(reentrant, "checkpoint.reentrant");
  std::string dropout = yaml("hf-gpt2", true, "full");
  dropout.replace(dropout.find("attention: eager\n"), 17, "attention: eager\n  dropout: 0.1\n");
  refused(dropout, "model.dropout");
}

TEST_CASE("compile + sac-op: the cached outputs the backward reads are saved, down_proj's not",
          "[compile][checkpoint]") {
  // torchtitan's op-level SAC inside a compiled block: the policy's answers become the
  // nodes' tags; MUST_SAVE bans recomputation (partitioners.py should_ban_recomputation)
  // but a banned value is saved only when the cut needs it. Per layer the policy saves the
  // 1st, 3rd, 5th and 7th mm: q_proj (8,192 B), v_proj (4,096), gate_proj (20,480) and
  // down_proj (8,192), whose output only the residual sum reads: eager SAC keeps it in the
  // frame's cache, the compiled block does not save it.
  const uint64_t q = 8192, v = 4096, gate = 20480, down = 8192;
  const Walk full = walk(build(yaml("hf-llama", true, "full")));
  const Walk sac = walk(build(yaml("hf-llama", true, "sac-op")));
  const Walk eager = walk(build(yaml("hf-llama", false, "sac-op")));
  CHECK(sac.ok);
  CHECK(sac.end == full.end);
  CHECK(sac.forward_end == full.forward_end + 2 * (q + v + gate));
  CHECK(eager.forward_end == sac.forward_end + 2 * down);
  // The recompute: full AC's (126,976 B) without gate_proj's output, handed back cached.
  CHECK(sac.recomputed_max[0] == 126'976 - gate);
  CHECK(sac.recomputed_max[1] == 126'976 - gate);
  CHECK(sac.peak <= eager.peak);
}
