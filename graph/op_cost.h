// The time model's per-op cost rule, keyed by op kind (issue #18 item 1; the model and its
// limits: docs/time-model.md).
//
// Contract: hbm_writes_and_reads(k) is how many times the bytes an op of kind k allocates
// cross HBM, for the ops whose cost is not counted elsewhere:
//  - 0 for GEMM-class ops (matmuls, attention kernels): each reports its own FLOPs and
//    operand bytes as one roofline GEMM (Runtime::add_flops_forward, Node::gemm_bytes);
//    the optimizer's kernels (sim/optim/optimizer_cost.h) and ops whose allocations are
//    not kernel outputs (`other`: batches, communication buffers, whose bytes the
//    collectives count) are 0 too;
//  - 1 for ops that only write what they allocate (ones_like, arange, 0-d scalars);
//  - 2 for every other op: eager PyTorch writes each output to HBM and its consumer
//    reads it back, and an element-wise op reads about as many bytes as it writes. This
//    undercounts binary ops (two inputs) and reductions (input larger than output) and
//    overcounts broadcasts; docs/time-model.md states it as a limit.
// Plain data (a switch over OpKind): no virtuals, nothing allocated.
#pragma once

#include "graph/ir.h"

namespace memsim::graph {

constexpr int hbm_writes_and_reads(OpKind k) {
  switch (k) {
    case OpKind::bmm:
    case OpKind::linear:
    case OpKind::addmm:
    case OpKind::mm_linear:
    case OpKind::sdpa_flash:
    case OpKind::sdpa_efficient:
    case OpKind::sdpa_cudnn:
    case OpKind::megatron_linear:
    case OpKind::baddbmm:
    case OpKind::fused_attention:
    case OpKind::matmul_4bit:
    case OpKind::liger_flce:
    case OpKind::float8_linear:
    case OpKind::optimizer_math:
    case OpKind::other:
      return 0;
    case OpKind::fill:
    case OpKind::arange:
    case OpKind::scalar_tensor:
    case OpKind::offload_unpack:  // a host-to-device copy writes HBM once (PCIe: StepCost::host_bytes)
      return 1;
    default:
      return 2;
  }
}

}  // namespace memsim::graph
