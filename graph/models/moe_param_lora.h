// PEFT's LoRA on transformers 5.x's 3-D routed experts (lora.target_parameters; docs/moe.md
// "LoRA on the routed experts"), written against graph::Runtime.
//
// Mirrors huggingface/peft 5d602fdb (0.20.1.dev0) src/peft/tuners/lora/layer.py ParamWrapper /
// _LoraParameterProxy and torch's nn.utils.parametrize (torch/nn/utils/parametrize.py:
// register_parametrization, ParametrizationList.__init__, cached, remove_parametrizations):
//  - update_layer: per targeted parameter (E, out, in) one lora_A = nn.Linear(in, r*E) and one
//    lora_B = nn.Linear(r*E, out), without bias, in lora.adapter_dtype (r*E*(in+out)
//    trainable elements per layer and target). Two targets nest two wrappers; PEFT's
//    _inject_parameters walks the experts' parameters in registration order, so gate_up_proj's
//    wrapper is the inner one (module mlp.experts.base_layer) and down_proj's the outer
//    (mlp.experts): the outer's delta is computed first, its exit runs last.
//  - enter() (ParamWrapper.forward -> _activate_lora, outermost first): get_delta_weight
//    reshapes A (a view of the leaf with its own ViewBackward0, made first: the engine then
//    runs B's AccumulateGrad before A's, the order torch DDP's reducer sees) and B, then
//    computes einsum("o r e, e r i -> e o i", B.reshape(out, r, E), A.reshape(E, r, in)) * scaling,
//    which aten's sumproduct_pair lowers to permutes/reshapes (views) and one bmm of
//    (E, out, r) x (E, r, in) -> (E, out, in) (aten/src/ATen/native/Linear.cpp); the left
//    operand is B permuted, strides (1, r*E, E): on CUDA bmm copies it contiguous
//    (prepare_batch_matrix_for_cublas: neither inner stride is 1), a transient of B's size,
//    and in backward the same for its transpose in grad_A = left^T.bmm(grad) (emitted when
//    kernel scratch is on; torch 1.13's CPU bmm makes no copy). The einsum output dies
//    after `* scaling` (MulBackward saves nothing), then `.to(param dtype)` copies when
//    the adapters' dtype differs. register_parametrization(unsafe=False) evaluates
//    W + delta once to check its shape and dtype and drops it (a whole-weight transient).
//  - weight(): the experts' `self.gate_up_proj` under parametrize.cached(): the first read
//    computes W + delta (AddBackward0: the frozen W gets no grad, delta's grad passes
//    through) and caches it; every hit expert's F.linear then takes a select view of it, so
//    the whole merged (E, out, in) weight is saved until that layer's backward when the
//    expert's input requires grad (or, for down_proj, always: act*up requires grad through
//    gate_up's adapter), and dies with the cache otherwise.
//  - exit() (the wrappers' `with` exits, innermost first): an inner wrapper's delta dies
//    with its generator; the outermost cached() exit drops the cache (the merged weights in
//    first-read order), then the outer delta dies.
// Under torch.autocast (fp32 parameters and adapters): CUDA's autocast lists einsum itself
// (aten/src/ATen/autocast_mode.cpp, KERNEL_CUDA(einsum, lower_precision_fp)), so the wrapper
// casts B.reshape(out, r, E) and then A.reshape(E, r, in) to the low dtype (views: never
// cached) and the bmm runs in it: the casts are saved by BmmBackward0, the einsum's output
// and `* scaling` are low, and `.to(param dtype)` copies the delta back to fp32, so W + delta
// and the merged weight stay fp32 (the experts' F.linear then casts each hit expert's slice:
// decoder_moe.cpp expert_linear_autocast). In backward ToCopyBackward0 brings A's and B's
// low grads up to fp32.
// Under activation checkpointing (full, custom [mlp]) the checkpoint engine's re-run calls
// enter / weight / exit again: deltas and merged weights are made anew in backward, as the
// *_ckpt_* CPU fixtures show (docs/moe.md). With torch >= 2.1's early stop the engine throws
// from the re-run's last save (graph/checkpoint.h) and the unwinding destroys this object (a
// local of the experts' forward): its merged weights and deltas die then, before backward
// allocates again, as PEFT's generators' `finally` and the outermost cached() exit free them
// while _StopRecomputationError unwinds (torch/utils/checkpoint.py, pytorch 0008d771).
// The same wrappers run around transformers' batched_mm and grouped_mm experts forwards
// (graph/models/decoder_moe.cpp; docs/moe.md "Under batched_mm and grouped_mm"): weight() is
// then gathered per sample (IndexBackward0 keeps only the indices: the merged weight lives
// until exit()) or handed to _grouped_mm (saved as mat2 when its input requires grad).
// Backward (eager): each hit expert's SelectBackward0 gives a zeros of the whole merged weight,
// accumulated (in place, torch 2.x) in AddBackward0's input buffer; MulBackward0 makes one
// more whole-size tensor (and ToCopyBackward0 its cast for other adapter dtypes); bmm's
// backward gives A's grad (a view, stolen) and B's (its reshape copies: the grad is not
// viewable as (out, r*E)).
#pragma once

#include <cstdint>
#include <string>

#include "graph/models/lora.h"
#include "graph/runtime.h"

namespace memsim::graph {

class Autocast;

// HfLora::targets bits of lora.target_parameters (scenario/lora_target_parameters_key.h).
enum ExpertsParam : uint32_t { kExpertsGateUp = 7, kExpertsDown = 8 };

// ParamWrapper.update_layer's lora_A (r*E, in) and lora_B (out, r*E), named
// `module`.lora_A.default.weight / .lora_B.default.weight.
LoraAdapter add_experts_adapter(Runtime& rt, uint64_t experts, uint64_t out, uint64_t in, uint64_t rank,
                                uint64_t adapter_elem, const std::string& module);

// One experts module's forward under its ParamWrappers (slot 0 gate_up_proj, 1 down_proj).
class ExpertsParamLora {
 public:
  struct Target {
    LoraAdapter ad;       // undefined: the parameter is not targeted
    int32_t weight = -1;  // the frozen 3-D parameter
    uint64_t out = 0, in = 0;
  };
  // autocast: the model's torch.autocast region when it is active (null: none). Under it
  // the einsum is a lower-precision op (CUDA's list): its operands are cast, B first.
  ExpertsParamLora(Runtime& rt, uint64_t experts, uint64_t rank, uint64_t adapter_elem, uint64_t param_elem,
                   const Target& gate_up, const Target& down, Autocast* autocast = nullptr);
  bool any() const { return t_[0].ad.defined() || t_[1].ad.defined(); }
  void enter();
  // The tensor `experts.<slot>` reads: the merged weight (made at the first read) or the
  // plain parameter when the slot is not targeted.
  Tensor weight(int slot);
  void exit();

 private:
  Tensor delta(const Target& t);
  Runtime& rt_;
  Autocast* ac_;
  uint64_t experts_, rank_, adapter_elem_, param_elem_;
  Target t_[2];
  Tensor delta_[2], merged_[2];
  int order_[2] = {-1, -1};  // the slots in first-read order (the cache's insertion order)
  int reads_ = 0;
};

}  // namespace memsim::graph
