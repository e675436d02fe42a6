// FSDP2's root hooks when the model computes the loss inside its forward
// (sim/step/loss_placement.h, sim/parallel/fsdp2.h; docs/fsdp2.md "The root's hooks and
// where the loss is computed"). torch 2.11 _fsdp_state.py: the root's post-forward runs
// when model.forward returns, and its pre-backward is a tensor hook on every forward
// output that requires grad. HF Trainer's compute_loss (step.keep_output: loss) passes the
// labels, so the loss is such an output: the root's pre-backward (prefetch of the last
// block's all-gather) runs at the loss's first backward op, and the forward's last flat
// all-gather output (all_gather_state) lives until after the loss. A loop that computes
// the loss from the returned logits (step.keep_output true / false) keeps both at the
// LM head. The H200 trace of hft_lora_fsdp2_w8 (tests/test_gpu_hft_runs.cpp) shows both.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "sim/parallel/fsdp2.h"
#include "sim/step/loss_placement.h"
#include "sim/step/schedule.h"
#include "cli_test_support.h"

using namespace memsim;

namespace {

// 2-layer hf-llama, fp32, FSDP2 over 4 ranks (tests/test_fsdp2.cpp's model).
Scenario scenario_with(const std::string& step_extra, const std::string& extra = "",
                       const std::string& model_extra = "",
                       const std::string& parallel = "parallel:\n  data: 4\n  sharding: fsdp2\n") {
  std::string y = "model:\n  family: hf-llama\n  layers: 2\n  d_model: 256\n  heads: 4\n"
                  "  kv_heads: 4\n  d_ff: 1000\n  vocab: 1001\n  context_length: 64\n" +
                  model_extra;
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n";
  y += "optimizer:\n  type: adamw\n  impl: foreach\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n" + step_extra;
  y += parallel + extra;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "fsdp2_loss.yaml");
}

bool is_module(const Program& p, const MemoryEvent& e, graph::Module m) {
  return p.tensors[e.tensor].module == static_cast<uint8_t>(m);
}

// Event indices in the measured step (after the measured_step_begin mark).
struct StepOrder {
  size_t last_forward_ag_free = 0;  // the forward's last flat all-gather output freed
  size_t last_loss_forward = 0;     // the last allocation of the loss's forward ops
  size_t prefetch = 0;              // the backward's first flat all-gather output (last block)
  size_t first_loss_backward = 0;   // the first allocation of the loss's backward ops
  size_t first_head_backward = 0;   // the first allocation of the LM head's backward
  std::string prefetch_name;
};

StepOrder step_order(const Program& p) {
  size_t begin = 0;
  for (size_t i = 0; i < p.events.size(); ++i)
    if (p.events[i].type == EventType::mark && p.str(p.events[i].bytes) == "measured_step_begin")
      begin = i;
  REQUIRE(begin > 0);
  const auto npos = static_cast<size_t>(-1);
  StepOrder o{npos, npos, npos, npos, npos, ""};
  uint32_t forward_ag = UINT32_MAX;
  for (size_t i = begin; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::mark) continue;
    const std::string name = p.str(p.tensors[e.tensor].name);
    const bool ag = name.rfind("FSDP2 all-gather output (flat)", 0) == 0;
    if (e.type == EventType::alloc && ag && e.phase == Phase::forward) forward_ag = e.tensor;
    if (e.type == EventType::free && e.tensor == forward_ag) o.last_forward_ag_free = i;
    if (e.type != EventType::alloc) continue;
    if (e.phase == Phase::loss) o.last_loss_forward = i;
    if (e.phase != Phase::backward) continue;
    if (ag && o.prefetch == npos) {
      o.prefetch = i;
      o.prefetch_name = name;
    }
    // The ops' own allocations (FSDP2's buffers carry the module whose op ran the hook).
    if (name.rfind("FSDP2 ", 0) == 0) continue;
    if (is_module(p, e, graph::Module::loss) && o.first_loss_backward == npos) o.first_loss_backward = i;
    if (is_module(p, e, graph::Module::head) && o.first_head_backward == npos) o.first_head_backward = i;
  }
  REQUIRE(o.last_forward_ag_free != npos);
  REQUIRE(o.last_loss_forward != npos);
  REQUIRE(o.prefetch != npos);
  REQUIRE(o.first_loss_backward != npos);
  REQUIRE(o.first_head_backward != npos);
  return o;
}

}  // namespace

TEST_CASE("where the step computes its loss: inside the model only for HF Trainer's "
          "compute_loss with the model's own loss, and Liger's forward", "[fsdp2-loss]") {
  CHECK(loss_in_model_forward(scenario_with("  keep_output: loss\n")));
  // Liger's patched forward (refused with sharding today: asked without it).
  const std::string ddp = "parallel:\n  data: 4\n";
  CHECK(loss_in_model_forward(scenario_with("", "loss:\n  impl: liger\n", "", ddp)));
  CHECK(loss_in_model_forward(scenario_with("  keep_output: loss\n", "loss:\n  impl: liger\n", "", ddp)));
  // `logits = model(x)` loops: the loss is computed from the returned logits.
  CHECK_FALSE(loss_in_model_forward(scenario_with("")));
  CHECK_FALSE(loss_in_model_forward(scenario_with("  keep_output: false\n")));
  // The script's own losses and the other stacks' loops compute it outside the model.
  CHECK_FALSE(loss_in_model_forward(scenario_with("  keep_output: loss\n", "loss:\n  impl: torch\n")));
  CHECK_FALSE(loss_in_model_forward(
      scenario_with("  keep_output: loss\n", "loss:\n  impl: chunked:4\n", "", ddp)));
  CHECK_FALSE(loss_in_model_forward(scenario_with(
      "  keep_output: loss\n", "", "  implementation: torchtitan\n  attention: mem-efficient\n", ddp)));
}

TEST_CASE("FSDP2 with the loss inside the model: the root's pre-backward prefetch comes "
          "before the loss's backward, its post-forward after the loss", "[fsdp2-loss][fsdp2]") {
  const Program inside = build_program(scenario_with("  keep_output: loss\n"));
  const StepOrder in = step_order(inside);
  // The prefetch is the last block's all-gather, from the root's pre-backward.
  CHECK(in.prefetch_name == "FSDP2 all-gather output (flat) of block 1");
  // Backward: the loss's first backward op runs after the root's pre-backward hook.
  CHECK(in.prefetch < in.first_loss_backward);
  CHECK(in.first_loss_backward < in.first_head_backward);
  // Forward: the last block's flat all-gather output (all_gather_state) is freed by the
  // root's post-forward, after the loss's forward ops.
  CHECK(in.last_forward_ag_free > in.last_loss_forward);

  // The loss computed from the returned logits: both at the LM head, as before.
  for (const char* keep : {"  keep_output: false\n", ""}) {
    INFO(keep);
    const Program outside = build_program(scenario_with(keep));
    const StepOrder out = step_order(outside);
    CHECK(out.prefetch_name == "FSDP2 all-gather output (flat) of block 1");
    CHECK(out.first_loss_backward < out.prefetch);
    CHECK(out.prefetch < out.first_head_backward);  // the hook runs before the head's op
    CHECK(out.last_forward_ag_free < out.last_loss_forward);
  }
}

TEST_CASE("FSDP2 with the loss inside the model holds the last block's all-gather output "
          "through the loss's backward", "[fsdp2-loss][fsdp2]") {
  const Program inside = build_program(scenario_with("  keep_output: loss\n"));
  const StepOrder in = step_order(inside);
  // ws 4: the last block's padded full numel x 4 bytes (tests/test_fsdp2.cpp's arithmetic),
  // on the all-gather copy-in stream.
  constexpr uint64_t kBlockFull = (4 * 16384 + 3 * 64000 + 2 * 64) * 4 * 4;
  const MemoryEvent& ag = inside.events[in.prefetch];
  CHECK(ag.bytes == kBlockFull);
  CHECK(ag.stream == kAllGatherStream);
  // Freed at the block's copy-out, i.e. after the loss's and the head's backward ops.
  size_t freed = 0;
  for (size_t i = in.prefetch; i < inside.events.size() && freed == 0; ++i)
    if (inside.events[i].type == EventType::free && inside.events[i].tensor == ag.tensor) freed = i;
  CHECK(freed > in.first_head_backward);
}
