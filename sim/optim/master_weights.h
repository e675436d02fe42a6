// fp32 master weights around a torch.optim optimizer, for the families built on
// graph::Runtime (cs336, hf-gpt2, hf-llama; megatron has its own, sim/megatron/megatron_optimizer.h).
//
// The script modelled (the classic mixed-precision recipe, apex's FP16_Optimizer
// without loss scaling; bf16 or fp16 model parameters):
//   master = [p.detach().float() for p in model.parameters()]   # setup, parameter order
//   opt = AdamW(master)                                          # state: fp32, lazy
//   ...loss.backward()                                           # 16-bit p.grad
//   for m, p in zip(master, params): m.grad = p.grad.float()     # fp32 grad copies
//   opt.step()
//   for m, p in zip(master, params): p.data.copy_(m); m.grad = None
// Contract: construct() allocates the fp32 masters (TensorKind::optimizer_state, named
// "master_param") of the trainable 16-bit parameters (an fp32 parameter, e.g. an fp32
// LoRA adapter, is its own master: .float() returns it); step() allocates every fp32 grad copy (a parameter without .grad is
// skipped), runs the wrapped optimizer on fp32-sized tensors (its state and temporaries
// are fp32), copies back in place and frees the fp32 grads in parameter order. Between
// steps a parameter costs 2 (param) + 2 (grad, until zero_grad) + 4 (master) + 8 (Adam's
// m and v) = 16 bytes; during the step the fp32 grads add 4 more.
#pragma once

#include <memory>

#include "sim/optim/optimizer_step.h"

namespace memsim {

std::unique_ptr<OptimizerSim> make_master_weights(const OptimizerConfig& config,
                                                  const OptimizerSetup& setup);

}  // namespace memsim
