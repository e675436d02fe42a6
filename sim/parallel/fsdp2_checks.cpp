#include "sim/parallel/fsdp2_checks.h"

#include "sim/parallel/accelerate_step_checks.h"
#include "sim/step/loss_placement.h"

#include <algorithm>
#include <string>

namespace memsim {

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
}  // namespace

namespace {
// precision.autocast with parallel.fsdp_mixed_precision: Accelerate's FSDP2 path for
// mixed_precision: bf16 in v1.6 / v1.7 (HF Trainer's bf16=True with fsdp_version 2; later
// releases skip the autocast wrapper under FSDP2: sim/parallel/accelerate_amp.h), and nothing else.
void require_accelerate_amp_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  // FullyShardedDataParallelPlugin.set_mixed_precision("bf16") (accelerate @16cb6eb8
  // utils/dataclasses.py): MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16,
  // output_dtype=bf16); autocast (accelerator.py native_amp) in the same dtype.
  // Accelerate's fp16 path (the fp16 policy, autocast, GradScaler, a loss cast to fp16 by
  // output_dtype) was not checked; the bf16 one was.
  if (*s.precision.autocast != DType::bf16)
    refuse(s, "precision.autocast",
           "autocast over MixedPrecisionPolicy's parameters is modelled as Accelerate's "
           "mixed_precision: bf16 path only; its fp16 path (fp16 policy and output loss, "
           "GradScaler) is not modelled: use autocast fp16 over fp32 FSDP2 parameters "
           "(parallel.fsdp_mixed_precision none) or bf16");
  if (*p.fsdp_mixed_precision != *s.precision.autocast)
    refuse(s, "parallel.fsdp_mixed_precision",
           "with precision.autocast, modelled as Accelerate sets it: param_dtype equal to "
           "the autocast dtype (bf16)");
  if (!p.reduce_dtype.has_value() || *p.reduce_dtype != *p.fsdp_mixed_precision)
    refuse(s, "parallel.reduce_dtype",
           "autocast over MixedPrecisionPolicy's parameters is modelled as Accelerate's "
           "mixed_precision: bf16 policy (param_dtype, reduce_dtype and output_dtype bf16, "
           "autocast, convert_outputs_to_fp32): set parallel.reduce_dtype: bf16; other "
           "policies under autocast are not modelled");
  // The loop: HF Trainer's compute_loss, the loss computed inside model.forward (so inside
  // the autocast region and before the root's output casts).
  require_accelerate_trainer_step(
      s, {"Accelerate's FSDP2 bf16 path", "autocast over bf16 parameters",
          "checked op by op: docs/fsdp2.md", " and before FSDP2's output cast"});
  if (p.context > 1)
    refuse(s, "parallel.context",
           "Accelerate's FSDP2 bf16 path with context parallelism is not modelled");
  if (p.cpu_offload)
    refuse(s, "parallel.cpu_offload",
           "Accelerate's FSDP2 bf16 path with CPUOffloadPolicy is not modelled");
  // Accelerate v1.6 / v1.7 set output_dtype with the rest of the policy
  // (set_mixed_precision); asked for explicitly, as reduce_dtype is, so that a file says
  // which policy it describes.
  if (!p.fsdp_output_dtype.has_value() || *p.fsdp_output_dtype != *p.fsdp_mixed_precision)
    refuse(s, "parallel.fsdp_output_dtype",
           "autocast over MixedPrecisionPolicy's parameters is modelled as Accelerate v1.6 / "
           "v1.7 run it, whose policy has output_dtype equal to param_dtype: set "
           "parallel.fsdp_output_dtype: bf16");
}

// parallel.fsdp_output_dtype: MixedPrecisionPolicy.output_dtype. Every fully_shard'ed module
// casts its floating outputs in its own _post_forward (pytorch/pytorch
// torch/distributed/fsdp/_fully_shard/_fsdp_state.py @01c9f4fc: the cast is not root-only),
// so memsim models it where only the root's casts copy anything: the decoder layers' outputs
// are already in output_dtype (their compute dtype: param_dtype, or precision.params without
// a policy), and the root's outputs are the loss and the logits of HF Trainer's step (the
// loss computed in model.forward: sim/parallel/accelerate_amp.h cast_outputs).
void require_output_dtype_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  const DType compute = p.fsdp_mixed_precision.value_or(s.precision.params);
  if (s.precision.autocast.has_value() && !p.fsdp_mixed_precision.has_value())
    refuse(s, "parallel.fsdp_output_dtype",
           "with autocast over fp32 FSDP2 parameters the decoder layers return mixed dtypes "
           "(fp32 residual stream, bf16 matmuls), which each layer's output cast would "
           "change; not modelled (Accelerate's policies set parallel.fsdp_mixed_precision)");
  if (*p.fsdp_output_dtype != compute)
    refuse(s, "parallel.fsdp_output_dtype",
           std::string("output_dtype ") + to_string(*p.fsdp_output_dtype) +
               " differs from the layers' compute dtype " + to_string(compute) +
               " (parallel.fsdp_mixed_precision, else precision.params): every "
               "fully_shard'ed decoder layer would cast its hidden states in its "
               "post-forward, which is not modelled; modelled: output_dtype equal to "
               "param_dtype (Accelerate >= 1.8's bf16 policy), where only the root's "
               "loss and logits are cast");
  if (!loss_in_model_forward(s) || s.loss.impl != LossFunction::automatic)
    refuse(s, "parallel.fsdp_output_dtype",
           "the root's output cast is modelled for HF Trainer's step (labels passed to the "
           "model, which returns its loss and logits: model.family hf-llama / hf-gpt2 with "
           "model.implementation hf, step.keep_output: loss, step.kind train, loss.impl "
           "left out); a loop computing the loss from cast logits is not modelled");
  if (p.context > 1)
    refuse(s, "parallel.context",
           "parallel.fsdp_output_dtype with context parallelism (each rank's share of the "
           "logits) is not modelled");
  if (s.step.compile)
    refuse(s, "step.compile",
           "parallel.fsdp_output_dtype with torch.compile is not modelled");
}

// parallel.accelerate_version: which releases do what (sim/parallel/fsdp2_layout.h has the
// grouping, docs/fsdp2.md "Accelerate's FSDP2 grouping" the source).
void require_accelerate_version_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  const int32_t v = p.accelerate_version;
  const std::string release = "Accelerate " + std::to_string(v / 100) + "." + std::to_string(v % 100);
  if (s.model.arch.impl != graph::ModelImpl::hf || (s.model.family != ModelFamily::hf_llama &&
                                                    s.model.family != ModelFamily::hf_gpt2))
    refuse(s, "parallel.accelerate_version",
           "Accelerate's fsdp2_prepare_model is modelled for transformers' models "
           "(model.family hf-llama / hf-gpt2, model.implementation hf); use none for this "
           "loop's own fully_shard calls");
  // >= 1.14: transformers' Llama-family names (model.embed_tokens, model.norm, lm_head).
  if (v >= 114 && s.model.family != ModelFamily::hf_llama)
    refuse(s, "parallel.accelerate_version",
           release + "'s grouping is modelled for transformers' Llama-family models "
           "(model.family hf-llama: model.embed_tokens, model.norm, lm_head)");
  // Tied embeddings (scenario/accelerate_tied_head.h): [final norm, embed_tokens] one group,
  // lm_head.weight the root's parameter, its shard the embedding's once Accelerate re-ties
  // the model after loading the state dict, which it does only with
  // cpu_ram_efficient_loading (fsdp_utils.py v1.14.0 lines 786-805).
  if (v >= 114 && s.model.tied_embeddings) {
    if (!p.fsdp_init_on_cpu)
      refuse(s, "parallel.fsdp_init",
             release + " with tied embeddings is modelled with cpu_ram_efficient_loading "
             "(parallel.fsdp_init: cpu), after which Accelerate re-ties lm_head to the "
             "embedding's shard; without it the root keeps a shard of its own of the tied "
             "weight (and its gradient) that the optimizer never steps: not modelled");
    if (p.cpu_offload)
      refuse(s, "parallel.cpu_offload",
             release + " with tied embeddings under CPUOffloadPolicy (the root and the "
             "[norm, embed_tokens] group gathering one CPU shard) is not modelled");
    if (s.lora.rank > 0)
      refuse(s, "lora.rank",
             "LoRA on a tied model under " + release + "'s grouping ([embed_tokens] alone "
             "kept gathered, the root holding the final norm and lm_head) is not modelled");
  }
  // v1.6.0 / v1.7.0: Accelerator.prepare_model wraps forward in autocast, then
  // fsdp2_prepare_model; from v1.8.0 (PR #3585, d2e6b031) _prepare_fsdp2 never calls
  // prepare_model: MixedPrecisionPolicy alone (docs/fsdp2.md "Accelerate's FSDP2 bf16 path").
  if (v >= 108 && s.precision.autocast.has_value())
    refuse(s, "precision.autocast",
           release + " never autocasts an FSDP2 model (_prepare_fsdp2 skips prepare_model, "
           "from v1.8.0): mixed_precision bf16 is MixedPrecisionPolicy(param_dtype, "
           "reduce_dtype, output_dtype bf16) alone; use precision.autocast: none with "
           "parallel.fsdp_mixed_precision / reduce_dtype / fsdp_output_dtype: bf16, or "
           "parallel.accelerate_version 1.6 / 1.7 for the autocast wrapper");
  if (v < 108 && p.fsdp_mixed_precision.has_value() && !s.precision.autocast.has_value())
    refuse(s, "precision.autocast",
           release + " wraps the model's forward in autocast whenever mixed precision is on "
           "(Accelerator.prepare_model's native_amp block, before fsdp2_prepare_model): set "
           "precision.autocast: bf16 (or a release from 1.8 for the policy alone)");
}
}  // namespace

void require_fsdp2_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  // With context parallelism the shard group is data x context ranks (torchtitan's
  // dp_shard x cp mesh), so data 1 still shards.
  if (p.data * p.context == 1)
    refuse(s, "parallel.sharding",
           "FSDP2 on one GPU shards nothing (fully_shard's world-size-1 path), which is not "
           "modelled; set parallel.data > 1 or parallel.sharding: none");
  if (p.replicate == p.data * p.context)
    refuse(s, "parallel.replicate",
           "a replicate group as large as parallel.data leaves shard groups of one rank "
           "(DDP through fully_shard), which is not modelled; use parallel.sharding: none for "
           "DDP or a smaller parallel.replicate");
  if (p.fsdp_mixed_precision && s.precision.params != DType::fp32)
    refuse(s, "parallel.fsdp_mixed_precision",
           std::string("modelled for fp32 parameters cast to param_dtype; with precision.params ") +
               to_string(s.precision.params) + " use parallel.fsdp_mixed_precision: none");
  // Which Accelerate release prepared the model comes before what its policy implies.
  if (p.accelerate_version != 0) require_accelerate_version_modelled(s);
  // torch.autocast over fp32 unsharded parameters is modelled (docs/fsdp2.md "Autocast over
  // FSDP2"): each unsharded nn.Parameter is a leaf, so autocast's cache keeps its bf16 cast
  // until the region exits, as on one GPU. Autocast over MixedPrecisionPolicy's bf16
  // parameters is modelled as Accelerate runs it (sim/parallel/accelerate_amp.h), for the
  // code whose ops it was checked on; the regions that span backward are not checked.
  if (s.precision.autocast.has_value()) {
    if (p.fsdp_mixed_precision) require_accelerate_amp_modelled(s);
    // fp16 autocast over fp32 FSDP2 parameters trains with torch.amp.GradScaler
    // (precision.grad_scaler, modelled over DTensor grads: sim/step/grad_scaler.h); without
    // it the step is unscaled, as on one GPU. Accelerate's fp16 path (autocast over its fp16
    // policy, an fp16 output loss) is refused by require_accelerate_amp_modelled.
    if (s.precision.autocast_region == AutocastRegion::whole_step ||
        s.precision.autocast_region == AutocastRegion::whole_run)
      refuse(s, "precision.autocast_region",
             "an autocast region spanning FSDP2's backward (whole-step, whole-run) is not "
             "checked; use forward or forward-and-loss");
    if (s.precision.float8_all_gather)
      refuse(s, "precision.float8_all_gather",
             "torchao's float8 all-gather under torch.autocast is not modelled; use "
             "precision.autocast: none");
  }
  if (p.fsdp_output_dtype.has_value()) require_output_dtype_modelled(s);
  if (s.precision.master_weights)
    refuse(s, "precision.master_weights",
           "fp32 master copies of FSDP2 shards are not modelled; FSDP2 keeps fp32 shards "
           "itself with parallel.fsdp_mixed_precision");
  switch (s.optimizer.type) {
    case OptimizerType::adam8bit:
    case OptimizerType::adamw8bit:
    case OptimizerType::adafactor:
      refuse(s, "optimizer.type",
             "8-bit optimizers and Adafactor over FSDP2's DTensor shards are not modelled; "
             "use adam, adamw or sgd");
    default: break;
  }
  if (s.optimizer.impl == OptimizerImpl::out_of_place)
    refuse(s, "optimizer.impl",
           "the out-of-place Adam creates its state for the module's parameters at "
           "construction; over FSDP2's shards it is not modelled");
  if (s.lora.rank > 0 && s.lora.base_nf4)
    refuse(s, "lora.base_dtype",
           "QLoRA (nf4 base weights) under FSDP2 is not modelled; use lora.base_dtype "
           "equal to precision.params");
  if (s.precision.float8_all_gather) {
    // FSDPParam.all_gather_inputs raises NotImplementedError for an all-gather extension
    // in SHARDED_POST_FORWARD (torch/distributed/fsdp/_fully_shard/_fsdp_param.py @010ae4a8).
    if (p.reshard_after_forward_ranks > 0)
      refuse(s, "parallel.reshard_after_forward",
             "reshard_after_forward N with precision.float8_all_gather: FSDP2 raises "
             "NotImplementedError when all-gathering a float8 weight from its post-forward "
             "shard; use true or false");
    if (p.cpu_offload)
      refuse(s, "parallel.cpu_offload",
             "CPUOffloadPolicy with precision.float8_all_gather (the shard copied to the GPU, "
             "then cast) is not modelled");
    if (s.recipe.optimizer_in_backward && s.precision.float8_precompute_scale)
      refuse(s, "precision.float8_precompute_scale",
             "precompute_float8_dynamic_scale_for_fsdp runs after optimizer.step(), which "
             "optimizer.in_backward replaces; not modelled");
    // Fsdp2 takes every block matrix for a Float8Linear weight: routed experts are not.
    if (s.model.arch.moe.experts > 0)
      refuse(s, "model.moe",
             "precision.float8_all_gather with mixture-of-experts layers (torchao's float8 "
             "MoE path is not Float8Linear) is not modelled");
    // torchao's one-argument fsdp_pre_all_gather casts the unpadded local shard: a rank with
    // a short last chunk would all-gather fewer bytes than rank 0 (torch.chunk's chunk 0),
    // which all_gather_into_tensor does not accept. memsim's rank 0 stands for all ranks
    // only when every Float8Linear's out-features divide evenly.
    const int64_t ws = p.data / p.replicate * p.context;
    const graph::DecoderArch& a = s.model.arch;
    const int64_t hd = a.head_dim > 0 ? a.head_dim : s.model.d_model / std::max<int64_t>(1, s.model.heads);
    const int64_t kv = s.model.kv_heads > 0 ? s.model.kv_heads : s.model.heads;
    for (int64_t rows : {s.model.d_model, s.model.heads * hd, kv * hd, s.model.d_ff})
      if (ws > 0 && rows % ws != 0)
        refuse(s, "parallel.data",
               "precision.float8_all_gather with a Float8Linear of " + std::to_string(rows) +
                   " output rows over a shard group of " + std::to_string(ws) +
                   " ranks: torchao's float8 all-gather needs even shards (uneven ones "
                   "all-gather unequal byte counts); not modelled");
  }
  if (s.lora.rank > 0 && p.fsdp_mixed_precision)
    refuse(s, "parallel.fsdp_mixed_precision",
           "LoRA with FSDP2's MixedPrecisionPolicy is not modelled (adapters and base weights "
           "would be cast to param_dtype); use parallel.fsdp_mixed_precision: none");
}

}  // namespace memsim
