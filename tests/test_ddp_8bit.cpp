// bitsandbytes 8-bit Adam/AdamW (optimizer.type adam8bit / adamw8bit) under torch DDP
// (parallel.data > 1, parallel.sharding none): the two compose without interacting. DDP's
// reducer buckets the gradients (sim/parallel/data_parallel.h) whatever the optimizer is;
// the optimizer then steps the full replica's parameters on every rank, creating the
// 8-bit state per parameter as on one GPU (sim/optim/optimizer_8bit.h: uint8 state1/2 and
// fp32 absmax per 256-element block for numel >= 4096, fp32 state below, the two 1 KiB
// quantisation maps). Checked event by event: the optimizer-state allocations equal the
// one-GPU 8-bit run's, the gradient/bucket allocations equal DDP with torch's AdamW.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "scenario/scenario.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

std::vector<uint64_t> allocs_of(const Program& p, TensorKind kind) {
  std::vector<uint64_t> out;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && p.tensors[e.tensor].kind == kind) out.push_back(e.bytes);
  return out;
}

Program build(const std::string& text, std::vector<std::pair<std::string, std::string>> set) {
  return build_program(load_scenario_text(text, "ddp8bit.yaml", set));
}

}  // namespace

TEST_CASE("ddp + 8-bit Adam: DDP's buckets and bitsandbytes' state, each as alone", "[ddp-8bit]") {
  const std::string full =
      "model: { family: hf-llama, layers: 2, d_model: 128, heads: 4, d_ff: 256, vocab: 1000 }\n"
      "batch: { micro_batch: 2, seq_len: 32 }\n"
      "step: { warmup_steps: 1 }\n";
  const std::string lora = full + "precision: { params: bf16 }\nlora: { rank: 8, targets: [q_proj, v_proj] }\n";
  for (const std::string& text : {full, lora}) {
    for (const char* type : {"adamw8bit", "adam8bit"}) {
      INFO(type << (text == lora ? " lora" : " full"));
      const Program ddp8 = build(text, {{"optimizer.type", type}, {"parallel.data", "4"}});
      const Program one8 = build(text, {{"optimizer.type", type}});
      const Program ddp32 = build(text, {{"optimizer.type", "adamw"}, {"parallel.data", "4"}});
      CHECK(ddp8.rank.distributed());
      const auto state = allocs_of(ddp8, TensorKind::optimizer_state);
      CHECK(!state.empty());
      CHECK(state == allocs_of(one8, TensorKind::optimizer_state));
      CHECK(allocs_of(ddp8, TensorKind::gradient) == allocs_of(ddp32, TensorKind::gradient));
      // 8-bit state: far less than AdamW's 8 bytes per trained element (the full model's
      // matrices; LoRA's adapters are under min_8bit_size and keep fp32 state).
      uint64_t s8 = 0, s32 = 0;
      for (uint64_t b : state) s8 += b;
      for (uint64_t b : allocs_of(ddp32, TensorKind::optimizer_state)) s32 += b;
      if (text == full) CHECK(s8 * 3 < s32);
    }
  }
}
