// transformers 5.x's masking_utils masks (graph/models/decoder_mask_v5.h,
// docs/transformers5-mask.md): which rows build which masks, at which size and dtype, and
// that model.transformers: 4 keeps v4's. The measured comparisons are in
// tests/test_h100_arch_runs.cpp "[transformers5]" and tests/test_gpu_moe*_runs.cpp.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "scenario/scenario.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

// One step (no warm-up), B = 2, S = 32, fp32 unless said: the (B, 1, S, S) mask is 8 KiB,
// v4's (S, S+1) 4224 B.
std::string yaml(const std::string& arch, const std::string& extra) {
  return "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, kv_heads: 2, d_ff: 128, "
         "vocab: 128, context_length: 64, architecture: " + arch + extra + "}\n"
         "batch: {micro_batch: 2, seq_len: 32}\nstep: {warmup_steps: 0}\ndevice: {capacity: 1TiB}\n";
}

struct Counts {
  int where = 0;      // torch.where's float mask of `bytes`
  int bool_ss = 0;    // (S, S) bools: sdpa_mask's mask function and its `&`
  int cumsum = 0;     // find_packed_sequence_indices' cumsum results (B*S*8)
  int v4_full = 0;    // v4's torch.full((S, S+1)) mask
};

Counts count(const Scenario& s, uint64_t mask_bytes) {
  const Program p = build_program(s);
  Counts c;
  for (const MemoryEvent& e : p.events) {
    if (e.type != EventType::alloc || e.phase != Phase::forward) continue;
    const std::string op = p.str(e.op);
    if (op == "where" && e.bytes == mask_bytes) ++c.where;
    if (e.bytes == 32 * 32 && (op == "ge" || op == "bitwise_or")) ++c.bool_ss;
    if (op == "cumsum" && e.bytes == 2 * 32 * 8) ++c.cumsum;
    if (e.bytes == 32 * 33 * 4) ++c.v4_full;
  }
  return c;
}

}  // namespace

TEST_CASE("transformers 5.x builds masking_utils' (B,1,S,S) eager mask", "[transformers5]") {
  const uint64_t fp32_mask = 2 * 32 * 32 * 4;
  // Qwen2 under 5: create_causal_mask once: one (S, S) bool, one (B, 1, S, S) fp32 mask; the
  // packed-sequence check's cumsum with CUDA's temporary (two allocations).
  const Counts q5 = count(load_scenario_text(yaml("qwen2", ", transformers: 5, attention: eager"), "t.yaml"), fp32_mask);
  CHECK(q5.where == 1);
  CHECK(q5.bool_ss == 1);
  CHECK(q5.cumsum == 2);
  CHECK(q5.v4_full == 0);
  // The same row under 4 (the default): v4's (S, S+1) mask, none of 5.x's.
  const Counts q4 = count(load_scenario_text(yaml("qwen2", ", attention: eager"), "t.yaml"), fp32_mask);
  CHECK(q4.where == 0);
  CHECK(q4.cumsum == 0);
  CHECK(q4.v4_full >= 1);
  // bf16 weights: the mask is in the model dtype (half the bytes).
  const Counts b5 = count(load_scenario_text(yaml("qwen2", ", transformers: 5, attention: eager") +
                                                 "precision: {params: bf16}\n", "t.yaml"),
                          fp32_mask / 2);
  CHECK(b5.where == 1);
  // SDPA: sdpa_mask returns None; the packed-sequence check still runs.
  const Counts s5 = count(load_scenario_text(yaml("qwen2", ", transformers: 5, attention: flash"), "t.yaml"), fp32_mask);
  CHECK(s5.where == 0);
  CHECK(s5.bool_ss == 0);
  CHECK(s5.cumsum == 2);
  // Mistral with a window: create_sliding_window_causal_mask only: and_masks' two terms and
  // two `&` ((S, S) bools each), one float mask.
  const Counts m5 = count(load_scenario_text(yaml("mistral", ", sliding_window: 8, transformers: 5, attention: eager"),
                                             "t.yaml"), fp32_mask);
  CHECK(m5.where == 1);
  CHECK(m5.bool_ss == 4);
  // Gemma-2: the dict of both masks (full, then sliding), its layers build none of their own.
  const Counts g5 = count(load_scenario_text(yaml("gemma2", ", transformers: 5, attention: eager"), "t.yaml"), fp32_mask);
  CHECK(g5.where == 2);
  CHECK(g5.cumsum == 4);
  // Qwen2-MoE (5.x code throughout): both masks even though no layer slides.
  const Counts moe = count(load_scenario_text(yaml("qwen2_moe", ", moe: {experts: 4, top_k: 2, expert_d_ff: 32}, attention: eager"),
                                              "t.yaml"), fp32_mask);
  CHECK(moe.where == 2);
}

TEST_CASE("model.transformers: 5 with a sliding window on qwen2/qwen3 is refused", "[transformers5]") {
  for (const char* arch : {"qwen2", "qwen3"}) {
    INFO(arch);
    try {
      (void)load_scenario_text(yaml(arch, ", sliding_window: 8, transformers: 5"), "t.yaml");
      FAIL("accepted");
    } catch (const std::exception& e) {
      CHECK(std::string(e.what()).find("t.yaml:1: model.transformers: 5 with a sliding window") != std::string::npos);
    }
  }
}
