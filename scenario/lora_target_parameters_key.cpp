#include "scenario/lora_target_parameters_key.h"

#include <algorithm>

#include "scenario/yaml_fields.h"

namespace memsim {

bool lora_target_parameters_checkpoint_modelled(const CheckpointConfig& c) {
  // Every mode of torch.utils.checkpoint around these regions: non-reentrant to the region's
  // end (torch 1.13, the *_ckpt_full / *_ckpt_mlp fixtures), reentrant (the *_reentrant
  // fixtures), and non-reentrant with torch >= 2.1's early stop (the default; argued from
  // torch/utils/checkpoint.py in docs/moe.md and checked for its structure in
  // tests/test_moe_lora.cpp: the stop unwinds through the wrappers' exits, which only free).
  if (c.policy == CheckpointPolicy::none || c.policy == CheckpointPolicy::full) return true;
  return c.policy == CheckpointPolicy::custom && c.custom.size() == 1 && c.custom[0] == "mlp";
}

bool lora_target_parameters_parallel_modelled(const ParallelConfig& p) {
  if (p.tensor > 1 || p.pipeline > 1 || p.context > 1) return false;
  if (p.sharding == Sharding::fsdp2) return true;
  return p.sharding == Sharding::none && p.zero == 0;
}

}  // namespace memsim

namespace memsim::scenario_detail {

namespace {

std::string where_or(const Doc& d, const char* key, const std::string& fallback) {
  const Field* f = d.find(key);
  return f ? f->where : fallback;
}

}  // namespace

void read_lora_target_parameters(const Doc& d, Scenario& s) {
  const Field* f = d.find("lora.target_parameters");
  if (f == nullptr) return;
  const std::string at = f->where;
  if (s.lora.rank <= 0) fail(at, "lora.target_parameters", "needs lora.rank");
  if (s.model.family != ModelFamily::hf_llama)
    fail(at, "lora.target_parameters",
         "PEFT's target_parameters is modelled on transformers' MoE rows (hf-llama with model.moe), "
         "not on '" + std::string(to_string(s.model.family)) + "'");
  const graph::MoeSpec& m = s.model.arch.moe;
  if (m.experts <= 0)
    fail(at, "lora.target_parameters",
         "PEFT's target_parameters adapts nn.Parameters such as the 3-D routed experts of a "
         "mixture-of-experts model; this model has none (model.moe): use lora.targets "
         "(nn.Linear modules)");
  // DeepSeek-V3 / V2 rows take it too: transformers 5.17's DeepseekV3MoE / DeepseekV2Moe
  // register the same fused 3-D experts module (DeepseekV3Experts, @use_experts_implementation:
  // gate_up_proj (E, 2F, D), down_proj (E, D, F)) under mlp.experts, which memsim runs with the
  // same eager loop (decoder_moe_deepseek.cpp); checked against the *_tp_* rows of
  // tests/data/torch_cpu_deepseek (docs/deepseek.md).
  // A YAML list, or one string with commas (--set).
  const std::vector<std::string> names = read_name_list(*f, "lora.target_parameters");
  if (names.empty())
    fail(at, "lora.target_parameters", "expected at least one of gate_up_proj, down_proj");
  for (const std::string& n : names) {
    std::string canonical;
    for (const char* p : {"gate_up_proj", "down_proj"})
      for (const std::string prefix : {"", "experts.", "mlp.experts."})
        if (n == prefix + p) canonical = std::string("mlp.experts.") + p;
    if (canonical.empty())
      fail(at, "lora.target_parameters",
           "'" + n + "' is not a parameter of transformers 5.x's experts module (expected "
           "gate_up_proj or down_proj, optionally as experts.NAME or mlp.experts.NAME: PEFT "
           "matches a suffix of the parameter's key, so every MoE layer's is adapted)");
    if (std::find(s.lora.targets.begin(), s.lora.targets.end(), canonical) == s.lora.targets.end())
      s.lora.targets.push_back(canonical);
  }
  // ParamWrapper.__init__ / update_layer raise for these (peft 5d602fdb layer.py).
  if (s.lora.dropout != 0.0)
    fail(where_or(d, "lora.dropout", at), "lora.dropout",
         "PEFT's ParamWrapper (lora.target_parameters) raises for lora_dropout != 0 (dropout "
         "cannot be factored out of the merged weight)");
  // Every experts implementation memsim runs (model.moe.experts_implementation; without it
  // transformers 5.x's default, grouped_mm): the ParamWrappers wrap the experts' forward
  // whichever function it dispatches to (graph/models/moe_param_lora.h). eager and batched_mm
  // are checked byte-exact against tests/data/torch_cpu_moe_lora (the *_batched_mm_* rows);
  // grouped_mm (torch 1.13 has no _grouped_mm) by hand in tests/test_moe_lora.cpp, docs/moe.md.
  // Autocast over fp32 parameters and fp32 adapters (HF Trainer's bf16=True): the einsum's
  // casts (CUDA's list), the fp32 delta and merged weight, the experts' slice casts, checked
  // against tests/data/torch_cpu_moe_lora/*_autocast.json. 16-bit parameters or adapters
  // under autocast are not checked.
  if (s.precision.autocast.has_value() && (s.precision.params != DType::fp32 || s.lora.adapter_dtype != DType::fp32))
    fail(where_or(d, "precision.autocast", at), "precision.autocast",
         "lora.target_parameters under autocast is modelled with fp32 parameters "
         "(precision.params: fp32) and fp32 adapters (lora.adapter_dtype) only");
  // checkpoint.policy full and custom [mlp], reentrant or not, with or without early stop:
  // the recompute re-enters the ParamWrappers (delta and merged weight made again), checked
  // byte-exact against tests/data/torch_cpu_moe_lora/*_ckpt_*.json (the early stop for its
  // structure). Other policies are not checked.
  if (!lora_target_parameters_checkpoint_modelled(s.checkpoint))
    fail(where_or(d, "checkpoint.policy", at), "checkpoint.policy",
         "activation checkpointing with lora.target_parameters is modelled for policy full and "
         "custom [mlp] only (other policies split the MoE block or its layer differently and are "
         "not checked against PyTorch)");
  if (!s.checkpoint.offload.empty() || s.checkpoint.offload_all)
    fail(where_or(d, "checkpoint.offload", at), "checkpoint.offload",
         "activation offload with lora.target_parameters is not modelled");
}

void check_lora_target_parameters(const Doc& d, const Scenario& s) {
  const Field* f = d.find("lora.target_parameters");
  if (f == nullptr) return;
  const std::string at = f->where;
  // Data parallelism (docs/moe.md "With DDP and FSDP2"). torch DDP buckets the parameters
  // that require grad (the adapters; the frozen 3-D experts have none): sim/parallel/
  // data_parallel.h, checked against tests/data/ddp_combos/tp_*.json. FSDP2 (fully_shard per
  // decoder layer, then the root: sim/parallel/fsdp2.h) puts a layer's adapters in its group,
  // so the layer's pre-forward all-gathers lora_A / lora_B and the frozen experts before
  // ParamWrapper reads them, and the parametrization wraps the unsharded nn.Parameter that
  // FSDP2's post-forward swaps back for its shard (pytorch 010ae4a8 _fsdp_param.py
  // unsafe_setattr_param writes module._parameters only, since pytorch#120340: an instance
  // attribute would trip parametrize's _inject_property assertion).
  const ParallelConfig& p = s.parallel;
  if (p.sharding == Sharding::fsdp)
    fail(where_or(d, "parallel.sharding", at), "parallel.sharding",
         "FSDP1 with lora.target_parameters is not modelled: with PEFT's fsdp_auto_wrap_policy "
         "(parallel.fsdp_wrap: peft) every lora_A / lora_B is its own unit, which ParamWrapper "
         "reads without calling it, so it sees the flat shard (huggingface/peft#3080: "
         "get_delta_weight's reshape fails); with one unit per layer FSDP1 sets the original "
         "parameters as plain tensor views in forward, which the parametrization would "
         "register as a buffer (not checked). Use parallel.sharding: fsdp2 or DDP");
  if (p.sharding == Sharding::deepspeed || (p.sharding == Sharding::none && p.zero > 0))
    fail(where_or(d, "parallel.zero", where_or(d, "parallel.sharding", at)), p.zero > 0 ? "parallel.zero" : "parallel.sharding",
         "ZeRO with lora.target_parameters is not modelled (ZeRO-3 gathers a module's own "
         "parameters in its forward hooks; ParamWrapper reads lora_A / lora_B without calling "
         "them; huggingface/peft#3576 fixed only the adapters' creation); use DDP or FSDP2");
  if (p.tensor > 1 || p.pipeline > 1)
    fail(where_or(d, p.tensor > 1 ? "parallel.tensor" : "parallel.pipeline", at),
         p.tensor > 1 ? "parallel.tensor" : "parallel.pipeline",
         "tensor or pipeline parallelism with lora.target_parameters is not modelled");
  if (p.context > 1)
    fail(where_or(d, "parallel.context", at), "parallel.context",
         "context parallelism with lora.target_parameters is not checked");
  if (!lora_target_parameters_parallel_modelled(p))  // what the cases above do not name
    fail(where_or(d, "parallel.sharding", at), "parallel.sharding",
         "this parallelism with lora.target_parameters is not modelled (one GPU, DDP or FSDP2)");
  if (s.step.compile)
    fail(where_or(d, "step.compile", at), "step.compile",
         "torch.compile with lora.target_parameters is not modelled (the parametrization under "
         "parametrize.cached() is not traced here)");
}

}  // namespace memsim::scenario_detail
