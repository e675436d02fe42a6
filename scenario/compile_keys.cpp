#include "scenario/compile_keys.h"

#include <string>

#include "scenario/scenario_family.h"
#include "scenario/yaml_fields.h"

namespace memsim {
namespace scenario_detail {

void read_compile(const Doc& d, StepConfig& s) {
  const Field* on = d.find("step.compile");
  if (on != nullptr) {
    s.compile = read_bool(*on, "step.compile");
    s.compile_where = on->where;
  }
  if (const Field* f = d.find("step.compile_scope")) {
    if (!s.compile) fail(f->where, "step.compile_scope", "applies with step.compile: true only");
    static const std::vector<std::pair<std::string, CompileRegions>> kScopes = {
        {"model", CompileRegions::model}, {"block", CompileRegions::block}};
    s.compile_scope = read_enum(*f, "step.compile_scope", kScopes);
  }
  if (const Field* f = d.find("step.compile_memory_budget")) {
    if (!s.compile)
      fail(f->where, "step.compile_memory_budget", "applies with step.compile: true only");
    const double b = read_number(*f, "step.compile_memory_budget");
    // torch: "The valid ranges for memory budget are 0 <= m <= 1"
    if (!(b >= 0.0 && b <= 1.0))
      fail(f->where, "step.compile_memory_budget",
           "torch._functorch.config.activation_memory_budget must be in [0, 1], got " +
               std::to_string(b));
    s.compile_memory_budget = b;
  }
}

}  // namespace scenario_detail

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  const std::string where = s.step.compile_where.empty() ? s.source : s.step.compile_where;
  throw ScenarioError(where + ": " + key + ": " + why);
}
}  // namespace

void require_compile_modelled(const Scenario& s) {
  if (!s.step.compile) return;
  const FamilyRow& family = family_row(s.model.family);
  if (!family.hf)
    refuse(s, "model.family",
           std::string("step.compile is modelled for the hf-llama and hf-gpt2 families (and "
                       "their architecture rows) only, not '") +
               to_string(s.model.family) + "'; use step.compile: false");
  // Mixture of experts: transformers' eager experts loop picks the hit experts with
  // nonzero() (a data-dependent shape, where dynamo breaks the graph), and what the
  // partitioner saves around the router, the token gathers and _grouped_mm / the batched
  // gathers is checked against nothing (torch 1.13's functorch has no _grouped_mm; no GPU run
  // compiled a MoE model). Not approximated with the dense rules.
  if (s.model.arch.moe.experts > 0)
    refuse(s, "step.compile",
           "step.compile on a mixture-of-experts row is not modelled (the eager experts loop "
           "graph-breaks at its nonzero() expert selection; the partition around the routing, "
           "the token gathers and _grouped_mm is not checked); use step.compile: false");
  // LoRA adapters inside the compiled layers: torchtune's lora_finetune recipes
  // (set_trainable_params, then compile_model, then set_activation_checkpointing, then
  // shard_model). With frozen base weights the partition needs no rule of its own (the
  // recorded graph has eager's saves, which follow requires_grad; docs/compile.md "LoRA
  // inside the compiled layers", torch 1.13 fixture partition_hf_llama_lora.json).
  if (s.lora.rank > 0 && s.model.arch.impl != graph::ModelImpl::torchtune)
    refuse(s, "lora.rank",
           "step.compile with LoRA is modelled on torchtune's code only (model.implementation: "
           "torchtune, its lora_finetune recipes); PEFT's adapters on transformers' code under "
           "torch.compile are not checked end to end: use step.compile: false");
  if (s.lora.rank > 0 && s.lora.dropout > 0.0)
    refuse(s, "lora.dropout",
           "step.compile with LoRA dropout is not modelled (the adapters' random masks inside "
           "the compiled layer); torchtune's LoRA configs use lora_dropout: 0.0");
  const ParallelConfig& p = s.parallel;
  // FSDP2 composes with per-block compile as torchtitan applies it (apply_compile, then
  // fully_shard on each compiled block): its hooks run eagerly around each block's graph
  // (docs/compile.md "With FSDP2"). FSDP1's flat parameters and DeepSpeed's hooks are not
  // modelled compiled.
  if (p.sharding != Sharding::none && p.sharding != Sharding::fsdp2)
    refuse(s, "parallel.sharding",
           "step.compile with FSDP1 or DeepSpeed is not modelled (their hooks bound and "
           "reorder the compiled graphs); use parallel.sharding: fsdp2 with "
           "step.compile_scope: block, or step.compile: false");
  if (p.sharding == Sharding::fsdp2 && s.step.compile_scope != CompileRegions::block)
    refuse(s, "step.compile_scope",
           "torch.compile(model) over fully_shard'ed blocks is not modelled (dynamo runs "
           "FSDP2's hooks eagerly, torch._dynamo.config.skip_fsdp_hooks, so the model's "
           "graph breaks at every block boundary); use step.compile_scope: block "
           "(torchtitan's apply_compile)");
  if (p.sharding == Sharding::fsdp2) {
    // FSDP2's shard group is parallel.data: no DDP, no DDPOptimizer.
  } else if (p.data > 1 || p.zero != 0)
    refuse(s, p.data > 1 ? "parallel.data" : "parallel.zero",
           "step.compile with data parallelism is not modelled (DDPOptimizer splits the graph "
           "at bucket boundaries); simulate one GPU or use step.compile: false");
  // Activation checkpointing of whole blocks, each compiled alone (torchtitan: apply_ac,
  // then apply_compile on the wrapped block): the block's ops are the partitioner's
  // must-recompute tags (docs/compile.md "With activation checkpointing").
  const CheckpointConfig& c = s.checkpoint;
  if (c.policy != CheckpointPolicy::none) {
    if (c.policy != CheckpointPolicy::full && c.policy != CheckpointPolicy::sac_layer &&
        c.policy != CheckpointPolicy::sac_op)
      refuse(s, "checkpoint.policy",
             std::string("step.compile with checkpoint.policy ") + to_string(c.policy) +
                 " is not modelled (inside a compiled block, sub-block and multi-block "
                 "regions become the partitioner's tags, which memsim models for whole blocks "
                 "only); use full, sac-layer:N or sac-op, or step.compile: false");
    if (s.step.compile_scope != CompileRegions::block)
      refuse(s, "step.compile_scope",
             "torch.compile(model) over checkpointed blocks (several tagged regions in one "
             "graph) is not modelled; use step.compile_scope: block (torchtitan's "
             "apply_compile after apply_ac)");
    if (c.reentrant.value_or(false))
      refuse(s, "checkpoint.reentrant",
             "the reentrant checkpoint runs its block under no_grad (dynamo cannot trace "
             "it as a tagged region); use checkpoint.reentrant: false");
    if (s.model.dropout > 0.0)
      refuse(s, "model.dropout",
             "step.compile with checkpointing and dropout is not modelled (the recomputed "
             "random ops replay their RNG state); use model.dropout: 0");
  }
  if (s.precision.autocast.has_value())
    refuse(s, "precision.autocast",
           "step.compile with torch.autocast is not modelled; use precision.params bf16 "
           "(pure bf16 training) or step.compile: false");
  // Forward-only steps without grad: the compiled graph needs no backward, so no partition;
  // graph/compile.cpp runs such forwards eagerly, which is not what Inductor would allocate.
  if (s.step.kind == StepKind::forward_no_grad)
    refuse(s, "step.kind",
           "step.compile with forward-no-grad (an inference graph, no partition) is not "
           "modelled; use step.kind forward / train or step.compile: false");
  // loss.impl chunked:N / liger hand the model's hidden states to a loss that runs the head
  // per chunk (graph/models/chunked_loss.h, ops_liger.h): the compiled region would then end
  // at the hidden states and the head would be traced or not depending on the loss's own
  // torch.compile use; neither is modelled.
  if (s.loss.impl == LossFunction::chunked || s.loss.impl == LossFunction::liger)
    refuse(s, "loss.impl",
           "step.compile with a chunked or fused-linear loss is not modelled (the head runs "
           "outside the compiled model, chunk by chunk); use loss.impl: torch or "
           "step.compile: false");
}

}  // namespace memsim
