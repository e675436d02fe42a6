#include "tools/cli/scenario_facts.h"

#include <cstdio>

#include "allocator/units.h"
#include "scenario/device_defaults.h"
#include "scenario/loss_impl.h"
#include "scenario/lora_compute_dtype_key.h"
#include "scenario/model_architecture.h"
#include "scenario/offload_keys.h"
#include "scenario/offload_activations_key.h"
#include "scenario/scenario_family.h"
#include "sim/analysis/parameter_count.h"
#include "sim/parallel/accelerate_amp.h"

namespace memsim::cli {

namespace {

// 6738415616 -> "6.74B", 4194304 -> "4.19M".
std::string count_text(int64_t n) {
  char text[32];
  const double v = static_cast<double>(n);
  if (v >= 1e9) std::snprintf(text, sizeof text, "%.2fB", v / 1e9);
  else if (v >= 1e6) std::snprintf(text, sizeof text, "%.2fM", v / 1e6);
  else if (v >= 1e4) std::snprintf(text, sizeof text, "%.1fK", v / 1e3);
  else std::snprintf(text, sizeof text, "%lld", static_cast<long long>(n));
  return text;
}

std::string model_line(const Scenario& sc, const RankInfo* rank) {
  const ModelConfig& m = sc.model;
  std::string s = m.preset.empty() ? std::string() : m.preset + ": ";
  if (!m.hf_config.empty()) s += m.hf_config + ": ";
  const bool hf = family_row(m.family).hf;
  s += std::string(to_string(m.family));
  // The architecture, when it is not the family's own (Llama for hf-llama, GPT-2 for hf-gpt2).
  if (hf && std::string(m.arch.architecture) != default_architecture(m.family).name)
    s += " (" + std::string(m.arch.architecture) + ")";
  // model.implementation, when not transformers' code.
  if (hf && m.arch.impl != graph::ModelImpl::hf) s += " as " + std::string(to_string(m.arch.impl)) + "'s code";
  s += ", " + std::to_string(m.layers) + " layers, d_model " + std::to_string(m.d_model) + ", " +
       std::to_string(m.heads) + " heads";
  if (m.kv_heads != m.heads) s += " (" + std::to_string(m.kv_heads) + " KV)";
  if (hf && m.arch.head_dim > 0 && m.arch.head_dim * m.heads != m.d_model)
    s += ", head_dim " + std::to_string(m.arch.head_dim);
  s += ", d_ff " + std::to_string(m.d_ff) + ", vocab " + std::to_string(m.vocab) + ", " +
       to_string(m.attention) + " attention";
  // cs336 hand-written variants (scenario keys model.softmax / model.sdpa / model.swiglu), when not staff.
  if (m.softmax == SoftmaxImpl::exp_twice) s += ", softmax exp-twice";
  if (m.sdpa == SdpaImpl::masked_fill) s += ", sdpa masked-fill";
  if (m.swiglu == SwigluImpl::projections_first) s += ", swiglu projections-first";
  if (hf && m.arch.sliding_window > 0) s += ", sliding window " + std::to_string(m.arch.sliding_window);
  if ((hf || m.family == ModelFamily::megatron) && m.arch.moe.experts > 0) {  // docs/moe.md, moe-megatron.md
    const graph::MoeSpec& e = m.arch.moe;
    s += ", MoE " + std::to_string(e.experts) + " experts of d_ff " + std::to_string(e.expert_d_ff) +
         ", top " + std::to_string(e.top_k);
    if (e.shared_d_ff > 0) s += ", shared expert d_ff " + std::to_string(e.shared_d_ff);
    if (e.first_dense_layers > 0) s += ", " + std::to_string(e.first_dense_layers) + " dense first layers";
  }
  const int64_t total = parameter_count(m);
  s += ", " + count_text(total) + " parameters";
  if (sc.lora.rank > 0) s += " (" + count_text(trainable_parameter_count(sc)) + " trainable)";
  if (rank) {
    const int64_t held = parameter_count_per_rank(sc, rank->pipeline_stage);
    if (held != total) s += ", " + count_text(held) + " on this rank";
  }
  return s;
}

std::string batch_line(const Scenario& s) {
  std::string line = "micro_batch " + std::to_string(s.batch.micro_batch) + " x seq_len " +
                     std::to_string(s.batch.seq_len);
  if (s.batch.grad_accum != 1) line += ", grad_accum " + std::to_string(s.batch.grad_accum);
  line += "; params " + std::string(to_string(s.precision.params));
  line += s.precision.autocast ? ", autocast " + std::string(to_string(*s.precision.autocast))
                               : std::string(", no autocast");
  if (s.precision.master_weights) line += ", master weights";
  if (s.precision.grad_scaler) line += ", GradScaler";
  return line;
}

std::string training_line(const Scenario& s) {
  std::string line = std::string("step ") + to_string(s.step.kind);
  if (s.optimizer.type != OptimizerType::none) {
    line += ", " + std::string(to_string(s.optimizer.type));
    const bool bnb = s.optimizer.type == OptimizerType::adam8bit || s.optimizer.type == OptimizerType::adamw8bit;
    const bool hf = s.optimizer.type == OptimizerType::adafactor;
    line += bnb  ? std::string(" (bitsandbytes)")
            : hf ? std::string(" (transformers)")
                 : " (" + std::string(to_string(s.optimizer.impl)) + ")";
    if (s.optimizer.max_grad_norm) {  // sim/step/clip_grad.h
      char norm[32];
      std::snprintf(norm, sizeof norm, "%g", *s.optimizer.max_grad_norm);
      // DeepSpeed clips in its ZeRO optimizer (ds.json gradient_clipping, sim/parallel/deepspeed_norm.h).
      line += std::string(s.parallel.sharding == Sharding::deepspeed ? ", gradient_clipping " : ", clip_grad_norm_ ") + norm;
    }
  }
  if (s.lora.rank > 0) {
    line += ", lora r" + std::to_string(s.lora.rank) + " (";
    for (size_t i = 0; i < s.lora.targets.size(); ++i) line += (i ? "," : "") + s.lora.targets[i];
    line += std::string(")") + (s.lora.base_nf4 ? " nf4 base" : "");
    // bitsandbytes' dtypes where they differ from precision.params (lora_compute_dtype_key.h).
    if (s.lora.base_nf4 && kbit_compute_dtype(s) != s.precision.params)
      line += std::string(", compute ") + to_string(kbit_compute_dtype(s));
    if (s.lora.base_nf4 && kbit_model_dtype(s) != s.precision.params)
      line += std::string(", prepare_kbit: ") + to_string(kbit_model_dtype(s)) + " after setup";
  }
  // The loss of a hand-written loop (scenario keys loss.impl / loss.positions), when set.
  const bool one_hot = s.loss.impl == LossFunction::one_hot;
  const bool last = s.loss.positions == LossPositions::last;
  if (one_hot || last)
    line += std::string(one_hot ? ", one-hot loss" : ", loss") + (last ? " on the last position" : "");
  // hf-*: a loss computed outside the model (loss.impl; docs/losses.md).
  if (family_row(s.model.family).hf && s.loss.impl != LossFunction::automatic)
    line += ", loss " + loss_impl_label(s.loss);
  if (s.step.measure_whole_run) line += ", peaks over the whole run";
  line += std::string(", checkpoint ") + to_string(s.checkpoint.policy);
  // Megatron's CheckpointFunction is always reentrant; elsewhere only when asked.
  if (s.checkpoint.policy != CheckpointPolicy::none &&
      (family_row(s.model.family).reentrant_checkpoint_only ||
       s.checkpoint.reentrant.value_or(false)))
    line += " (reentrant)";
  if (offloads(s.checkpoint)) line += ", offload layers " + offload_label(s.checkpoint);  // save_on_cpu
  if (offloads_activations(s)) line += ", offload_activations (torchtune)";
  const ParallelConfig& p = s.parallel;
  if (p.data != 1 || p.tensor != 1 || p.pipeline != 1 || p.zero != 0) {
    line += ", parallel dp " + std::to_string(p.data) + " tp " + std::to_string(p.tensor) +
            " pp " + std::to_string(p.pipeline) + " zero " + std::to_string(p.zero);
    if (p.context > 1)  // context parallelism (graph/ops/ops_ring.h)
      line += " cp " + std::to_string(p.context) + " (ring attention, K/V " +
              (p.context_rotate == ContextRotate::alltoall ? "alltoall" : "allgather") + ")";
    if (p.pipeline > 1) {
      line += std::string(" (") + to_string(p.pipeline_schedule);
      if (p.pipeline_schedule == PipelineSchedule::interleaved)
        line += ", " + std::to_string(p.virtual_stages) + " chunks per rank";
      line += p.sequence ? ", sequence parallel)" : ")";
    } else if (p.sequence) {
      line += " (sequence parallel)";
    }
    if (p.sharding == Sharding::fsdp)
      line += std::string(p.reshard_after_forward ? " (FSDP FULL_SHARD" : " (FSDP SHARD_GRAD_OP") +
              (p.fsdp_mixed_precision
                   ? std::string(", ") + to_string(*p.fsdp_mixed_precision) + " MixedPrecision"
                   : std::string()) +
              (accelerate_fsdp1_upcast(s) ? ", loaded in " + std::string(to_string(s.precision.params)) +
                                                " and upcast to fp32 shards by Accelerate"
                                          : std::string()) +
              (p.cpu_offload ? ", CPU offload)" : ")");
    else if (p.sharding == Sharding::fsdp2)  // sim/parallel/fsdp2.h
      line += std::string(" (FSDP2 fully_shard, reshard_after_forward ") +
              (p.reshard_after_forward_ranks > 0 ? std::to_string(p.reshard_after_forward_ranks)
                                                 : p.reshard_after_forward ? "true" : "false") +
              (p.replicate > 1 ? ", HSDP " + std::to_string(p.replicate) + " replicas" : "") +
              (p.fsdp_mixed_precision
                   ? std::string(", param_dtype ") + to_string(*p.fsdp_mixed_precision)
                   : std::string()) +
              (p.reduce_dtype ? std::string(", reduce_dtype ") + to_string(*p.reduce_dtype)
                              : std::string()) +
              (p.cpu_offload ? ", CPUOffloadPolicy)" : ")");
    else if (p.zero == 1)
      line += !family_row(s.model.family).torch_data_parallel ? " (distributed optimizer)"
                                                               : " (DDP + ZeroRedundancyOptimizer)";
    else if (p.gradient_as_bucket_view)
      line += " (DDP gradient_as_bucket_view)";
  }
  return line;
}

std::string device_line(const DeviceConfig& d) {
  std::string line = d.preset.empty() ? std::string() : d.preset + ": ";
  if (d.capacity == 0) return line + "unlimited capacity";
  return line + human_bytes(d.capacity) + " total, " + human_bytes(d.cuda_context) +
         " CUDA context" +
         (cuda_context_is_default(d)
              ? " (the default without device.preset: measured on an H100; set device.cuda_context)"
              : "");
}

}  // namespace

std::vector<std::pair<std::string, std::string>> scenario_facts(const Scenario& s,
                                                                const RankInfo* rank) {
  return {{"model", model_line(s, rank)},
          {"batch", batch_line(s)},
          {"training", training_line(s)},
          {"device", device_line(s.device)}};
}

}  // namespace memsim::cli
