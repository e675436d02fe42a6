// Where autograd's InputBuffer sums two incoming gradients out of place (docs/input-buffer.md).
// torch 2.x adds a second grad into the buffered one in place only when the buffered grad is
// dense and its storage held by the buffer alone (torch/csrc/autograd/input_buffer.cpp
// `can_accumulate_inplace`); a linear on a (B, S, D) activation hands x's grad back as a
// view of the mm result (matmul's fold, _flatten_nd_linear with a bias), which fails that
// test, so the first two grads at a layer's attention input (q/k/v_proj) and MLP input
// (gate/up_proj) are summed out of place: one hidden-sized `add` per site, layer and
// backward, with or without biases. The MoE blocks work on hidden_states.view(-1, D), a 2-D
// tensor of its own: its router, shared expert and experts hand back dense grads, all added
// in place. The H200 traces (torch 2.11) are the reference: tests/test_h100_arch_runs.cpp
// and tests/test_gpu_moe_runs.cpp compare the whole allocation sequences; these cases pin
// the rule on memsim's programs so a regression names the site.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "program/tensor_names.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

// Out-of-place input-grad sums (InputBuffer's `add`, recorded as AddBackward0 in backward)
// by the module they fall in ("model.layers.1.self_attn" -> "self_attn") and size.
std::map<std::pair<std::string, uint64_t>, int> grad_sums(const Program& p) {
  std::map<std::pair<std::string, uint64_t>, int> out;
  for (const MemoryEvent& e : p.events) {
    if (e.type != EventType::alloc || e.phase != Phase::backward || p.str(e.op) != "AddBackward0") continue;
    const std::string name = tensor_name(p, e.tensor, e);
    const size_t dot = name.rfind('.');
    out[{dot == std::string::npos ? name : name.substr(dot + 1), e.bytes}]++;
  }
  return out;
}

Program build(const std::string& file, const std::vector<std::pair<std::string, std::string>>& overrides = {}) {
  return build_program(load_scenario(MEMSIM_SOURCE_DIR + "/tests/data/" + file, overrides));
}

using Sums = std::map<std::pair<std::string, uint64_t>, int>;

}  // namespace

TEST_CASE("InputBuffer: a (B, S, D) input's grads are summed out of place, biased or not", "[inbuf]") {
  const uint64_t hidden_fp32 = 4ull * 1024 * 1024 * 4;  // b 4 x s 1024 x d 1024 x 4 B
  // Llama stand-in with attention_bias and mlp_bias: q/k/v and gate/up in each of 4 layers,
  // 2 backward passes (the H200 C++ frames: 16 InputBuffer::add after AddmmBackward0).
  // Before the rule held for addmm, memsim summed these in place: 0.
  CHECK(grad_sums(build("h100/arch/arch_llama_l4_d1024_s1024_b4_fp32.yaml")) ==
        Sums{{{"mlp", hidden_fp32}, 8}, {{"self_attn", hidden_fp32}, 8}});
  // Qwen2: biased q/k/v, bias-free MLP (the MLP's 8 were there before, the attention's not).
  CHECK(grad_sums(build("h100/arch/arch_qwen2_l4_d1024_s1024_b4_fp32.yaml")) ==
        Sums{{{"mlp", hidden_fp32}, 8}, {{"self_attn", hidden_fp32}, 8}});
  // The same Llama without biases: the same sums (the layout does not depend on them).
  CHECK(grad_sums(build("h100/arch/arch_llama_l4_d1024_s1024_b4_fp32.yaml",
                        {{"model.qkv_bias", "false"}, {"model.o_bias", "false"}, {"model.mlp_bias", "false"}})) ==
        Sums{{{"mlp", hidden_fp32}, 8}, {{"self_attn", hidden_fp32}, 8}});
  // bf16: the same sums in bf16.
  CHECK(grad_sums(build("h100/arch/arch_llama_l4_d1024_s1024_b4_bf16.yaml")) ==
        Sums{{{"mlp", hidden_fp32 / 2}, 8}, {{"self_attn", hidden_fp32 / 2}, 8}});
  // Phi-3's fused qkv_proj and gate_up_proj: one grad per input, nothing to sum.
  CHECK(grad_sums(build("h100/arch/arch_phi3_l4_d1024_s1024_b4_fp32.yaml")).empty());
}

TEST_CASE("InputBuffer: the MoE block's 2-D input takes dense grads, summed in place", "[inbuf][moe]") {
  const uint64_t hidden_bf16 = 16ull * 256 * 1024 * 2;  // b 16 x s 256 x d 1024 x 2 B
  // transformers 5.17's Qwen2-MoE (biased q/k/v; a shared expert and its gate beside the
  // router and the experts, all on hidden_states.view(-1, D)): the out-of-place sums are the
  // attention input's (2 layers x 2 backward passes), none in the MoE block. Before, memsim
  // took the router's and the shared expert's input grads for views of a fold (an
  // out-of-place sum in the block) and the biased q/k/v's for dense ones (none there): the
  // same count, in the wrong module, which the size-only comparison of test_gpu_moe_runs
  // could not see.
  CHECK(grad_sums(build("gpu/moe/moe_tf_qwen2_moe_bf16_balanced.yaml")) == Sums{{{"self_attn", hidden_bf16}, 4}});
  // Qwen3-MoE (bias-free attention, no shared expert): as before.
  CHECK(grad_sums(build("gpu/moe/moe_tf_qwen3_moe_bf16_balanced.yaml")) == Sums{{{"self_attn", hidden_bf16}, 4}});
}
