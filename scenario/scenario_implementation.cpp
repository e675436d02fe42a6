#include "scenario/scenario_implementation.h"

#include <string>
#include <utility>
#include <vector>

#include "scenario/arch_checks.h"
#include "scenario/scenario_family.h"
#include "scenario/litgpt_lora_keys.h"
#include "scenario/torchtune_keys.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {
namespace {

using graph::ModelImpl;

const std::vector<std::pair<std::string, ModelImpl>>& implementation_names() {
  static const std::vector<std::pair<std::string, ModelImpl>> names = {
      {"hf", ModelImpl::hf},
      {"torchtitan", ModelImpl::torchtitan},
      {"torchtune", ModelImpl::torchtune},
      {"litgpt", ModelImpl::litgpt}};
  return names;
}

// Where a refusal points: the other key's own line when it was given, else
// model.implementation's.
std::string at(const Doc& d, const std::string& key, const Field& impl) {
  if (const Field* f = d.find(key)) return f->where;
  return impl.where;
}

}  // namespace

const char* spelling(ModelImpl impl) {
  for (const auto& [name, value] : implementation_names())
    if (value == impl) return name.c_str();
  return "?";
}

void read_implementation(const Doc& d, ModelConfig& m) {
  const Field* f = d.find("model.implementation");
  if (!f) return;
  const ModelImpl impl = read_enum(*f, "model.implementation", implementation_names());
  if (impl != ModelImpl::hf && !family_row(m.family).hf)
    fail(f->where, "model.implementation",
         std::string("selects a Llama model code, but the family is ") + to_string(m.family) +
             " (use family hf-llama)");
  m.arch.impl = impl;
}

void check_implementation(const Doc& d, const Scenario& s) {
  // checkpoint.offload_activations: scenario/offload_activations_key.h;
  // optimizer.in_backward: scenario/torchtune_keys.h.
  const Field* f = d.find("model.implementation");
  if (!f || s.model.arch.impl == ModelImpl::hf) return;
  const std::string who = std::string("model.implementation ") + spelling(s.model.arch.impl);
  auto refuse = [&](const std::string& key, const std::string& why) {
    fail(at(d, key, *f), key, why + " (" + who + "; docs/implementations.md)");
  };
  const bool titan = s.model.arch.impl == ModelImpl::torchtitan;
  const bool lit = s.model.arch.impl == ModelImpl::litgpt;
  const std::string stack = spelling(s.model.arch.impl);
  // torchtitan's llama3 Transformer and torchtune's llama3 builder are one architecture:
  // Llama (RMSNorm, SwiGLU, RoPE, GQA, no biases, untied output).
  if (s.model.family != ModelFamily::hf_llama || std::string(s.model.arch.architecture) != "llama")
    refuse(d.find("model.architecture") ? "model.architecture" : "model.family",
           stack + "'s Llama model code is modelled for the Llama architecture only, not " +
               s.model.arch.architecture);
  if (const char* knob = first_arch_knob(s)) refuse(knob, stack + "'s Llama model code has no such knob");
  if (s.model.tied_embeddings)
    refuse("model.tied_embeddings", stack + "'s Llama output projection is not tied to the embedding");
  if (s.model.attention == AttentionImpl::eager)
    refuse("model.attention",
           stack + " calls F.scaled_dot_product_attention(is_causal=True); use flash (16-bit) "
           "or mem-efficient (fp32), the kernel PyTorch picks");
  if (s.model.dropout > 0.0)
    refuse("model.dropout", stack + "'s Llama has no dropout (attn_dropout 0 in its recipes)");
  if (s.lora.rank > 0 && titan) refuse("lora.rank", "torchtitan has no LoRA");
  if (lit) check_litgpt_lora(d, s);  // litgpt/lora.py's LoRALinear (scenario/litgpt_lora_keys.h)
  if (!titan && !lit) check_torchtune_lora(d, s);  // lora_llama3's LoRALinear (scenario/torchtune_keys.h)
  if (s.precision.autocast.has_value())
    refuse("precision.autocast",
           lit ? std::string("litgpt's Fabric precision \"bf16-mixed\" (torch.autocast around the "
                             "model, fp32 parameters) is not modelled yet; give precision.params "
                             "bf16 (\"bf16-true\") or fp32 (\"32-true\")")
               : stack + " does not run the model under torch.autocast (torchtitan: FSDP2's "
                         "MixedPrecisionPolicy; torchtune: bf16 parameters); give precision.params bf16");
  // torchtune's full_finetune_distributed (FSDP2 over its model code) is modelled:
  // scenario/torchtune_keys.h read_torchtune_sharding, sim/parallel/fsdp2_layout.h.
  // torchtitan's apply_fsdp over its own code likewise (scenario/torchtitan_fsdp2_keys.h).
  const bool own_fsdp2 = !lit && s.parallel.sharding == Sharding::fsdp2;
  if (s.parallel.sharding != Sharding::none && !own_fsdp2)
    refuse("parallel.sharding",
           lit ? std::string("litgpt shards through Fabric's FSDPStrategy (auto_wrap_policy Block), "
                             "which is not modelled with it yet")
           : titan ? stack + " shards with FSDP2 (fully_shard): use parallel.sharding: fsdp2"
                   : std::string("torchtune's distributed recipes shard with FSDP2: use "
                                 "parallel.sharding: fsdp2"));
  if (lit && s.parallel.data > 1)
    refuse("parallel.data", "litgpt's multi-device recipes (finetune/full.py, pretrain.py) use "
                            "Fabric's FSDPStrategy, which is not modelled with it yet");
  if (lit && s.batch.seq_len > s.model.context_length)
    refuse("batch.seq_len", "GPT.max_seq_length cannot exceed the block size (model.context_length, "
                            "\"Cannot attend to ...\")");
  if (lit && s.batch.seq_len < 2)
    refuse("batch.seq_len", "chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:]) needs "
                            "two positions");
  if (s.parallel.tensor > 1 || s.parallel.pipeline > 1)
    refuse(s.parallel.tensor > 1 ? "parallel.tensor" : "parallel.pipeline",
           stack + "'s tensor and pipeline parallelism are not modelled");
  // torchtitan's own selective AC (sac-op, sac-layer:N) wraps its TransformerBlocks as it
  // wraps transformers' layers: its linears are aten.mm and its attention the SDPA kernel,
  // in the same order (wq, wk, wv, SDPA, wo, w1, w3, w2), so the save list's every-other-mm
  // rule picks wq, wv, w1, w2 (torchtitan 5077be6e distributed/activation_checkpoint.py
  // _custom_policy; no mm_recompute_shapes match a dense Llama).
  const bool titan_sac = titan && (s.checkpoint.policy == CheckpointPolicy::sac_op ||
                                   s.checkpoint.policy == CheckpointPolicy::sac_layer);
  if (s.checkpoint.policy != CheckpointPolicy::none && s.checkpoint.policy != CheckpointPolicy::full &&
      !titan_sac)
    refuse("checkpoint.policy",
           "only full (every block, as " + stack + "'s activation checkpointing wraps them) is "
           "modelled with it; " + (titan ? "torchtitan's sac-op and sac-layer:N are too"
                                          : "torchtune checkpoints whole layers only"));
  // The stack's own loss call site is modelled (torchtitan: cross_entropy_loss; torchtune:
  // CEWithChunkedOutputLoss on its 8 output chunks, DecoderModel::loss_tune): loss.impl's
  // alternatives run on transformers' head and are not wired to these rows yet.
  if (s.loss.impl != LossFunction::automatic)
    refuse("loss.impl", "the stack's own loss is modelled (" +
                            std::string(titan ? "cross_entropy_loss"
                                        : lit ? "chunked_cross_entropy, chunk_size 128"
                                              : "CEWithChunkedOutputLoss") +
                            "); loss.impl is not combined with it yet");
  if (s.checkpoint.reentrant.value_or(false))
    refuse("checkpoint.reentrant", stack + " checkpoints without reentrancy");
  if (lit && s.checkpoint.policy == CheckpointPolicy::full)
    refuse("checkpoint.policy", "litgpt checkpoints Blocks only through Fabric's FSDPStrategy "
                                "(activation_checkpointing_policy={Block}), which is not modelled "
                                "with it yet; its single-device recipes do not checkpoint");
  // The stacks' own loops: torchtitan and torchtune step AdamW (or SGD) on the model's
  // parameters, with no torch ZeroRedundancyOptimizer and no classic fp32 master-weight loop.
  if (s.parallel.zero != 0 && s.parallel.sharding != Sharding::fsdp2)  // (fsdp2 sets zero 3 itself)
    refuse("parallel.zero", stack + " has no ZeroRedundancyOptimizer (it shards with FSDP2)");
  if (!titan && !lit && s.parallel.sharding == Sharding::none && s.parallel.data > 1)
    refuse("parallel.data", "torchtune's distributed recipes shard with FSDP2 (no DDP): add "
                            "parallel.sharding: fsdp2");
  if (s.precision.master_weights)
    refuse("precision.master_weights",
           stack + " keeps no separate fp32 master copy (bf16 parameters, or FSDP2's "
           "MixedPrecisionPolicy over fp32 shards)");
  {
    const OptimizerType t = s.optimizer.type;
    if (t != OptimizerType::adamw && t != OptimizerType::adam && t != OptimizerType::sgd &&
        t != OptimizerType::none)
      refuse("optimizer.type", "only torch's Adam, AdamW and SGD are modelled with " + stack);
    if (s.optimizer.impl == OptimizerImpl::out_of_place || s.optimizer.impl == OptimizerImpl::cs336)
      refuse("optimizer.impl", "only torch.optim's for-loop, foreach and fused implementations "
                               "are modelled with " + stack);
  }
  // torchtitan compiles per block (its compile.enable: apply_compile wraps each
  // TransformerBlock): modelled as the hf rows' block scope (graph/models/decoder_impl.cpp
  // forward_titan; docs/compile.md "torchtitan's model code"). torch.compile(model) over
  // its code is not what torchtitan does; torchtune and litgpt compile the whole model.
  if (s.step.compile && titan && s.step.compile_scope != CompileRegions::block)
    refuse("step.compile_scope",
           "torchtitan compiles each TransformerBlock (apply_compile); torch.compile of its "
           "whole model is not modelled: use step.compile_scope: block");
  // torchtune's `compile: True` (torchtune a6290a5b recipes/full_finetune_*.py):
  // training.compile_model compiles each TransformerSelfAttentionLayer in place (block
  // scope) and training.compile_loss the chunked loss's compute_cross_entropy
  // (docs/compile.md "torchtune's code"). Its recipes apply activation checkpointing
  // (full: every layer) *after* compiling, so torch.utils.checkpoint runs eagerly around
  // each compiled layer: the compiled forward's saved set becomes the checkpoint's
  // placeholders and is recomputed by re-running the compiled forward (graph/compile.h
  // 4c; docs/compile.md "torchtune: checkpointing around the compiled layers").
  if (s.step.compile && !titan && !lit && s.step.compile_scope != CompileRegions::block)
    refuse("step.compile_scope",
           "torchtune's compile_model compiles each TransformerSelfAttentionLayer "
           "(m.compile()); torch.compile of its whole model is not what its recipes do: "
           "use step.compile_scope: block");
  // LitGPT compiles in pretrain.py only (`model = torch.compile(model)` before
  // fabric.setup; finetune/*.py never call torch.compile): with step.compile the run is
  // pretrain.py's, whose whole GPT.forward is one graph with the loss outside it
  // (graph/models/decoder_litgpt.cpp, docs/compile.md "LitGPT").
  if (s.step.compile && lit) {
    if (s.step.compile_scope != CompileRegions::model)
      refuse("step.compile_scope",
             "litgpt pretrain.py compiles the whole GPT (torch.compile(model)); per-block "
             "compile is not what it does: use step.compile_scope: model");
    if (s.lora.rank > 0)
      refuse("lora.rank", "litgpt compiles in pretrain.py only, which trains every parameter "
                          "(finetune/lora.py does not call torch.compile)");
    if (s.optimizer.type != OptimizerType::none && s.optimizer.impl != OptimizerImpl::fused)
      refuse("optimizer.impl", "litgpt pretrain.py (the script that compiles) builds its optimizer "
                               "with fused=True on CUDA; give optimizer.impl: fused");
    if (!s.optimizer.max_grad_norm)
      refuse("optimizer.max_grad_norm",
             "litgpt pretrain.py (the script that compiles) clips every step "
             "(fabric.clip_gradients(model, optimizer, max_norm=train.max_norm), default 1.0); "
             "give optimizer.max_grad_norm");
    // Lightning Fabric 2.6.5 (be98784a) Fabric.clip_gradients(..., error_if_nonfinite=True)
    // -> Strategy.clip_gradients_norm -> torch.nn.utils.clip_grad_norm_(...,
    // error_if_nonfinite); pretrain.py drops the returned norm.
    if (!s.optimizer.clip_error_if_nonfinite)
      refuse("optimizer.clip_error_if_nonfinite",
             "Fabric's clip_gradients passes error_if_nonfinite=True; give "
             "optimizer.clip_error_if_nonfinite: true");
    if (s.optimizer.clip_keep_norm)
      refuse("optimizer.clip_keep_norm", "litgpt pretrain.py does not keep the norm "
                                         "fabric.clip_gradients returns");
  }
  if (!titan && !lit && s.batch.seq_len % 8 != 0)  // torchtune only (litgpt's chunks are 128 rows)
    refuse("batch.seq_len",
           "torchtune's output is h.chunk(8, dim=1): uneven chunks (seq_len not a multiple of 8) "
           "are not modelled");
}

}  // namespace memsim::scenario_detail

namespace memsim {
const char* to_string(graph::ModelImpl impl) { return scenario_detail::spelling(impl); }
}  // namespace memsim
