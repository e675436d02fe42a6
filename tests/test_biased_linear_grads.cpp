// A projection's input gradient is a view of the mm result, with or without a bias
// (docs/biased-linear-grads.md): PyTorch's linear() flattens a contiguous 3-D input with a
// bias (_flatten_nd_linear: reshape, addmm, view), matmul folds one without, so the input's
// grad is ViewBackward0's reshape of the mm result and InputBuffer::accumulate cannot add
// into it in place. Where a layer's projections read the same tensor (q/k/v_proj, gate_proj
// and up_proj), the first two grads are summed out of place: one hidden-sized `add` per site,
// per layer and backward. The H200 traces with C++ frames (tests/data/h100/arch/
// cpp_stacks_runs.json) show them as InputBuffer::add -> accumulate -> at::add: 16 in the
// Llama stand-in with attention_bias and mlp_bias (4 layers x 2 sites x 2 steps), 16 in
// transformers' Qwen2 (qkv bias), 16 + 2 tied-weight sums in Qwen3's bias-free stand-in.
// tests/test_h100_arch_runs.cpp checks the whole large-allocation sequences.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

// Out-of-place input-grad sums: backward allocations of op AddBackward0 (InputBuffer's sum
// is recorded under the `add` op; AddBackward0 nodes themselves allocate nothing), by size.
std::map<uint64_t, int> grad_sums(const Program& p) {
  std::map<uint64_t, int> out;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && e.phase == Phase::backward && p.str(e.op) == "AddBackward0")
      ++out[e.bytes];
  return out;
}

Program build(const std::string& run, const std::vector<std::pair<std::string, std::string>>& overrides = {}) {
  return build_program(load_scenario(MEMSIM_SOURCE_DIR "/tests/data/h100/arch/" + run + ".yaml", overrides));
}

}  // namespace

TEST_CASE("Biased and bias-free projections' input grads are summed out of place", "[biaslin]") {
  const uint64_t hidden_fp32 = 4ull * 1024 * 1024 * 4;  // b 4 x s 1024 x d 1024 x 4 B
  // Llama stand-in with attention_bias and mlp_bias: q/k/v and gate/up, every layer, both
  // steps (before: 0, the addmm input grad was taken for a dense tensor and summed in place).
  CHECK(grad_sums(build("arch_llama_l4_d1024_s1024_b4_fp32")) == std::map<uint64_t, int>{{hidden_fp32, 16}});
  // Qwen2: biased q/k/v, bias-free MLP (before: 8, the MLP's only).
  CHECK(grad_sums(build("arch_qwen2_l4_d1024_s1024_b4_fp32")) == std::map<uint64_t, int>{{hidden_fp32, 16}});
  // Mistral, no biases: as before.
  CHECK(grad_sums(build("arch_mistral_l4_d1024_s1024_b4_fp32")) == std::map<uint64_t, int>{{hidden_fp32, 16}});
  // bf16 parameters: the same sums in bf16.
  CHECK(grad_sums(build("arch_llama_l4_d1024_s1024_b4_bf16")) == std::map<uint64_t, int>{{hidden_fp32 / 2, 16}});
  // Phi-3's fused qkv_proj and gate_up_proj: one grad per input, nothing to sum.
  CHECK(grad_sums(build("arch_phi3_l4_d1024_s1024_b4_fp32")).empty());
  // Biases switched off on the Llama row: the same sums (the layout does not depend on them).
  CHECK(grad_sums(build("arch_llama_l4_d1024_s1024_b4_fp32",
                        {{"model.qkv_bias", "false"}, {"model.o_bias", "false"}, {"model.mlp_bias", "false"}})) ==
        std::map<uint64_t, int>{{hidden_fp32, 16}});
}

TEST_CASE("The sums appear in the traced order: Llama stand-in with biases (H200, torch 2.11)", "[biaslin][h100]") {
  // Where each sum falls: after the second of the two (three) projections' backward, before
  // the norm below them runs. In the program, every AddBackward0 allocation of the layer's
  // hidden size is followed by the free of both addends (neither is kept: the old buffer was
  // a view, the new grad is consumed), so the sum never raises the live total by more than
  // one hidden-sized tensor.
  const Program p = build("arch_llama_l4_d1024_s1024_b4_fp32");
  const uint64_t hidden = 4ull * 1024 * 1024 * 4;
  size_t sums = 0;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type != EventType::alloc || e.phase != Phase::backward || p.str(e.op) != "AddBackward0") continue;
    REQUIRE(e.bytes == hidden);
    ++sums;
    // The next two events free hidden-sized tensors (the addends).
    REQUIRE(i + 2 < p.events.size());
    CHECK(p.events[i + 1].type == EventType::free);
    CHECK(p.events[i + 2].type == EventType::free);
    CHECK(p.tensors[p.events[i + 1].tensor].bytes == hidden);
    CHECK(p.tensors[p.events[i + 2].tensor].bytes == hidden);
  }
  CHECK(sums == 16);
}
