// FSDP1's root pre-backward when the model computes the loss inside its forward
// (sim/step/loss_placement.h, sim/parallel/fsdp.h). torch's FSDP1 (_runtime_utils.py
// `_post_forward` -> `_register_pre_backward_hooks`) registers the root handle's
// pre-backward as a hook on every forward output that requires grad. With HF Trainer's
// compute_loss (step.keep_output: loss, the model's own loss) the loss is such an output,
// and autograd reaches it first: the prefetch of the last layer's unit runs before the
// loss's backward ops. A loop that computes the loss from the returned logits
// (step.keep_output true / false) fires the hook at the logits' gradient, i.e. at the LM
// head's first backward op (tests/test_fsdp2_loss_in_forward.cpp is FSDP2's counterpart).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "graph/ir.h"
#include "sim/step/schedule.h"
#include "cli_test_support.h"

using namespace memsim;

namespace {

// 2-layer hf-llama, fp32, FSDP1 FULL_SHARD over 4 ranks.
Scenario fsdp1_with(const std::string& step_extra) {
  std::string y = "model:\n  family: hf-llama\n  layers: 2\n  d_model: 256\n  heads: 4\n"
                  "  kv_heads: 4\n  d_ff: 1000\n  vocab: 1001\n  context_length: 64\n";
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n";
  y += "optimizer:\n  type: adamw\n  impl: foreach\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n" + step_extra;
  y += "parallel:\n  data: 4\n  sharding: fsdp\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "fsdp1_loss.yaml");
}

struct Order {
  size_t prefetch = SIZE_MAX;             // the backward's first all-gather (the last layer's unit)
  size_t first_loss_backward = SIZE_MAX;  // the loss's first backward allocation
  size_t first_head_backward = SIZE_MAX;  // the LM head's first backward allocation
  std::string prefetch_name;
};

Order order_of(const Program& p) {
  size_t begin = 0;
  for (size_t i = 0; i < p.events.size(); ++i)
    if (p.events[i].type == EventType::mark && p.str(p.events[i].bytes) == "measured_step_begin")
      begin = i;
  REQUIRE(begin > 0);
  Order o;
  for (size_t i = begin; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type != EventType::alloc || e.phase != Phase::backward) continue;
    const std::string name = p.str(p.tensors[e.tensor].name);
    if (name.find("FSDP all-gather") != std::string::npos) {
      if (o.prefetch == SIZE_MAX) {
        o.prefetch = i;
        o.prefetch_name = name;
      }
      continue;
    }
    if (name.rfind("FSDP", 0) == 0) continue;
    const auto m = static_cast<graph::Module>(p.tensors[e.tensor].module);
    if (m == graph::Module::loss && o.first_loss_backward == SIZE_MAX) o.first_loss_backward = i;
    if (m == graph::Module::head && o.first_head_backward == SIZE_MAX) o.first_head_backward = i;
  }
  REQUIRE(o.prefetch != SIZE_MAX);
  REQUIRE(o.first_loss_backward != SIZE_MAX);
  REQUIRE(o.first_head_backward != SIZE_MAX);
  return o;
}

}  // namespace

TEST_CASE("FSDP1 with the loss inside the model: the root's pre-backward prefetch of the "
          "last layer comes before the loss's backward", "[fsdp][fsdp-loss]") {
  const Order in = order_of(build_program(fsdp1_with("  keep_output: loss\n")));
  INFO(in.prefetch_name);
  CHECK(in.prefetch_name.find("block 1") != std::string::npos);
  CHECK(in.prefetch < in.first_loss_backward);
  CHECK(in.first_loss_backward < in.first_head_backward);

  // The loss computed from the returned logits: the hook fires at the LM head.
  for (const char* keep : {"  keep_output: false\n", ""}) {
    INFO(keep);
    const Order out = order_of(build_program(fsdp1_with(keep)));
    CHECK(out.prefetch_name == in.prefetch_name);
    CHECK(out.first_loss_backward < out.prefetch);
    CHECK(out.prefetch < out.first_head_backward);
  }
}
