// The SDPA kernel settings of model.attention that depend on the rest of the scenario: the
// `cudnn` value (SDPA's cuDNN backend, graph/ops/ops_sdpa_cudnn.h) and transformers 5.x's
// grouped-query SDPA call (enable_gqa=True instead of repeat_kv; DecoderArch::sdpa_gqa,
// set by model.transformers: 5). Internal to the scenario loader, run once every section
// is read (docs/sdpa-gqa.md).
//
// Contract: a scenario without model.attention cudnn and without grouped KV heads under
// model.transformers 5 passes unchanged. Otherwise exit 1 naming the key:
//  - cudnn with fp32 compute (precision.params fp32, no precision.autocast, no 16-bit FSDP
//    parallel.fsdp_mixed_precision): cuDNN attention takes fp16/bf16 only (torch's
//    check_dtypes_low_precision), no stack runs it. (`flash` with fp32 is accepted: the
//    CPU fixtures run torch's CPU flash path, which takes fp32; on CUDA it does not.)
//  - cudnn where it is not modelled: a family other than hf-llama, model.implementation
//    other than hf, model.dropout > 0, a head size over 256 or not a multiple of 8 (cuDNN
//    rejects it), parallel.context > 1, step.compile, step.kind generate, checkpoint
//    policies other than none and full;
//  - mem-efficient with grouped KV heads under model.transformers 5 (head_dim <= 256):
//    5.x passes enable_gqa=True, which torch 2.11's mem-efficient kernel rejects
//    (can_use_efficient_attention false, H200 run hft_bf16_sdpa_gqa), so SDPA runs its math
//    kernel, which is not modelled (use eager, or flash / cudnn for the kernels that take it);
//  - parallel.context > 1 with grouped KV heads under model.transformers 5 (the ring over
//    enable_gqa is not modelled).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void check_sdpa_kernel(const Doc& d, const Scenario& s);

}  // namespace memsim::scenario_detail
