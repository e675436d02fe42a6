// Megatron-LM's mixed-precision optimizer as memory events: Float16OptimizerWithFloat16Params
// (fp32 master copy of every 16-bit parameter) around a fused Adam (apex / Transformer
// Engine FusedAdam: multi-tensor kernels, no per-parameter temporaries), fed by the DDP
// main_grad buffer that the scheduler allocates.
//
// Contract:
//  - construct() runs at setup, in Megatron's order: master copies (per parameter
//    `param.detach().clone().float()`: a 16-bit clone that dies after the fp32 copy),
//    in param-group order (weight-decayed matrices first, then biases and norms).
//  - step(): _copy_model_grads_to_main_grads (`main_param.grad = main_grad.float()`: an
//    alias when main_grad is fp32, an fp32 copy per parameter when it is 16-bit, kept
//    until the next zero_grad), then Adam's state, created lazily on the first step
//    (exp_avg then exp_avg_sq per parameter, fp32), then the in-place master-to-model
//    copy. Without master weights Adam updates the 16-bit parameters directly from
//    main_grad, with fp32 state.
//  - zero_grad(): optimizer.zero_grad(set_to_none=True) drops the master grads.
//  - owned_numel (the distributed optimizer, parallel.zero 1): every tensor above is
//    allocated for this rank's shard of each parameter only (Megatron's
//    `shard_model_param.clone().float()`, shard grads `.float()` of a main_grad slice).
//  - names (program/tensor_names.h): "master copy of P" (Megatron's main_param), "fp32 grad
//    of P" (main_param.grad), "exp_avg of P", "exp_avg_sq of P"; for a parameter this rank
//    owns only part of, the same with " (distributed-optimizer shard)".
//  - transient_master_grads (the ZeRO paper's accounting, not Megatron's behaviour):
//    the fp32 copies die at the end of step(), as if the cast were fused into Adam.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

struct MegatronOptimizerConfig {
  bool master_weights = true;
  uint64_t param_elem = 2;   // bytes per parameter element
  uint64_t grad_elem = 4;    // bytes per main_grad element
  bool adam = true;          // false: SGD without momentum (no state)
  bool transient_master_grads = false;
  // Distributed optimizer (sim/parallel/zero_sharding.h): elements of each parameter (by id) whose
  // fp32 main copy, main grad and Adam state this rank owns. Empty: every element (no
  // sharding). Parameters with no element here get no optimizer tensors.
  std::vector<uint64_t> owned_numel;
};

// What Megatron derives from the scenario (owned_numel left empty): bf16 forces fp32
// main_grad accumulation (accumulate_allreduce_grads_in_fp32), fp16/fp32 keep the
// parameters' dtype; `zero_paper_accounting` (sim/megatron/megatron_step.h) keeps main_grad 16-bit
// and the fp32 grad copies transient.
MegatronOptimizerConfig megatron_optimizer_config(const Scenario& s, bool zero_paper_accounting);

class MegatronOptimizer {
 public:
  // `order`: parameter ids in param-group order.
  MegatronOptimizer(const MegatronOptimizerConfig& config, std::vector<int32_t> order)
      : c_(config), order_(std::move(order)) {}

  void construct(graph::Runtime& rt);
  void zero_grad(graph::Runtime& rt);
  void step(graph::Runtime& rt);

 private:
  uint64_t numel(const graph::Runtime& rt, int32_t id) const {
    return c_.owned_numel.empty() ? rt.parameters()[id].bytes / c_.param_elem
                                  : c_.owned_numel[static_cast<size_t>(id)];
  }

  graph::Tensor of_param(graph::Runtime& rt, graph::Tensor t, int32_t id, NameRole whole,
                         NameRole shard) const;

  MegatronOptimizerConfig c_;
  std::vector<int32_t> order_;
  std::vector<graph::Tensor> master_, master_grad_, exp_avg_, exp_avg_sq_;
  graph::Tensor overflow_buf_;
};

}  // namespace memsim
