// Accelerate's FSDP2 bf16 path at the root module's boundary: what HF Trainer(bf16=True)
// with fsdp_version 2 (Accelerate's `mixed_precision: bf16` and an FSDP2 plugin) adds to
// a model whose unsharded parameters are already bf16. docs/fsdp2.md "Accelerate's FSDP2
// bf16 path" walks through it with byte counts.
//
// Which Accelerate: v1.6.0 and v1.7.0 (9cb1a6b6), whose prepare_model both wraps the forward
// and calls fsdp2_prepare_model. From v1.8.0 (PR #3585, d2e6b031) Accelerator.prepare sends
// FSDP2 models to _prepare_fsdp2, which never calls prepare_model: MixedPrecisionPolicy with
// output_dtype, no autocast, no convert_outputs_to_fp32 (docs/fsdp2.md).
// Sources: huggingface/accelerate @16cb6eb8 and v1.7.0: utils/dataclasses.py
// FullyShardedDataParallelPlugin.set_mixed_precision builds
// MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16);
// accelerator.py prepare_model (native_amp) replaces model.forward by
// convert_outputs_to_fp32(autocast(forward)) (utils/operations.py ConvertOutputsToFp32),
// an instance attribute that nn.Module._call_impl calls between fully_shard's forward
// pre- and post-hooks. pytorch/pytorch _fully_shard/_fsdp_state.py @01c9f4fc
// FSDPState._post_forward: the root registers its pre-backward hook on the outputs it got
// (the fp32 ones), frees the last all-gather result, then casts every floating output to
// output_dtype (_cast_fp_tensor: x.to(dtype) unless already that dtype;
// torch/distributed/utils.py _apply_to_tensors walks the ModelOutput dataclass in field
// order: loss, then logits).
//
// Why no graph::Autocast: autocast's casts of bf16 arguments to bf16 return the argument
// (at::autocast::cached_cast, aten/src/ATen/autocast_mode.cpp @008ec6b1: it casts only
// when `arg.scalar_type() != to_type`, and caches only fp32 leaves), and the transformers
// code of the architectures the checks allow (llama, mistral, qwen2) runs its fp32-list
// ops (pow, rsqrt, cross_entropy's nll_loss) on tensors it upcast itself (RMSNorm's
// `.to(torch.float32)`, the loss's `logits.float()`), with the rotary tables computed
// with autocast disabled and softmax given dtype=float32. So inside the region every op
// runs as it would without autocast: the model is the FSDP2 MixedPrecisionPolicy graph,
// plus the two boundary casts below.
//
// Contract:
//  - accelerate_fsdp2_amp(s): parallel.sharding fsdp2 with precision.autocast and
//    parallel.fsdp_mixed_precision both set (sim/parallel/fsdp2_checks.cpp admits only
//    Accelerate's policy and the HF Trainer loop: the loss computed in the model's
//    forward).
//  - convert_outputs_to_fp32(rt, loss, logits, numel): after the loss, before the root's
//    post-forward (FSDP2 and FSDP1 alike). The loss (fp32) is kept as is; low-precision logits get an fp32 copy
//    (_to_copy, ToCopyBackward0: saves nothing), then the low-precision original dies
//    (the ModelOutput holding it is dropped when ConvertOutputsToFp32 returns).
//    fp32 logits (transformers v4.45's forward upcast) are kept as is.
//  - cast_outputs(rt, loss, logits, numel, elem): MixedPrecisionPolicy.output_dtype
//    (parallel.fsdp_output_dtype), for both Accelerate paths: v1.6 / v1.7 (after the
//    convert above) and >= 1.8 (the policy alone: output_dtype bf16, no autocast, no
//    convert; accelerate v1.8.0 / v1.13.0 / 16cb6eb8 accelerator.py _prepare_fsdp2 calls
//    only fsdp2_prepare_model). After the root's post-forward
//    (Fsdp2::post_forward): a copy of the loss, then of the logits, in `elem` bytes per
//    element unless already so; the fp32 originals die after both copies (the hook's
//    result replaces the output in _call_impl). The loss copy is the graph's root: its
//    ToCopyBackward0 runs first in backward (module none), so the root's pre-backward
//    hook (a hook on the fp32 loss) runs at the loss's own first backward op after it.
#pragma once

#include <cstdint>

#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

bool accelerate_fsdp2_amp(const Scenario& s);

// Accelerate's FSDP1 bf16 path (HF Trainer bf16=True, fsdp_version 1): parallel.sharding
// fsdp with precision.autocast and parallel.fsdp_mixed_precision both set
// (sim/parallel/accelerate_fsdp1_checks.h admits only Accelerate's MixedPrecision and
// Trainer's loop). Accelerator.prepare_model (accelerate @16cb6eb8 accelerator.py, the
// native_amp block, then the `DistributedType.FSDP` branch) replaces model.forward by
// convert_outputs_to_fp32(autocast(forward)) and then wraps the model in FSDP with
// MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16): the wrapper's
// forward runs FSDP's root pre-forward, the inner module's _call_impl (the replaced
// forward: HF's forward and loss under autocast, then the fp32 copy of the logits), then
// FSDP's _post_forward, which casts no output (pytorch/pytorch @00ae0bc9
// torch/distributed/fsdp/_runtime_utils.py _post_forward: reshard, pre-backward hooks).
// So the fp32 logits copy lives until Trainer's compute_loss drops the outputs. As under
// FSDP2, autocast over the bf16 views casts nothing (the comment above): no graph::Autocast.
bool accelerate_fsdp1_amp(const Scenario& s);

// Accelerate's FSDP1 path over a model loaded in 16 bits (precision.params bf16:
// transformers 5.x's from_pretrained dtype="auto" on a bf16 checkpoint). accelerate
// @16cb6eb8 accelerator.py prepare_model, after FSDP(model, ...) and with mixed precision
// on: every FSDP module whose _flat_param requires grad and is not fp32 gets
// `param.data = param.data.to(torch.float32)` and `_handle._orig_param_dtype = float32`
// (warning "Upcasted low precision parameters in ... because mixed precision turned on in
// FSDP"). So the module is built, synced, flattened and sharded in bf16 and the optimizer
// steps fp32 shards (sim/parallel/fsdp.h "Accelerate's upcast"). precision.params is then
// the dtype the model is loaded in; the trained shards are fp32 (trained_param_elem).
bool accelerate_fsdp1_upcast(const Scenario& s);
// Bytes per element of the parameters the optimizer steps: 4 under the upcast above,
// else precision.params'.
uint64_t trained_param_elem(const Scenario& s);

void convert_outputs_to_fp32(graph::Runtime& rt, graph::Tensor& loss, graph::Tensor& logits,
                             uint64_t logits_numel);

void cast_outputs(graph::Runtime& rt, graph::Tensor& loss, graph::Tensor& logits,
                  uint64_t logits_numel, uint64_t elem);

}  // namespace memsim
