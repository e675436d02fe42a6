// DeepSpeed ZeRO 1/2/3 on rank 0 (the contract and the sources are in deepspeed_zero.h).
#include "sim/parallel/deepspeed_zero.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "allocator/units.h"
#include "program/tensor_names.h"

namespace memsim {

using graph::Module;
using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Module hooks are off while DeepSpeed's own code allocates (epilogue, step): those
// allocations are not a module running.
struct Busy {
  explicit Busy(bool& flag) : flag_(flag) { flag_ = true; }
  ~Busy() { flag_ = false; }
  bool& flag_;
};

// The module a parameter belongs to, from its Hugging Face / CS336 name: the simulated
// graph's ops carry the same Module while they run.
Module module_of_name(const std::string& n) {
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("lm_head")) return Module::head;
  if (has("embed") || has("wte") || has("wpe")) return Module::embedding;
  if (has("attn")) return Module::attention;
  if (has("mlp") || has("ffn")) return Module::mlp;
  if (has("norm") || has("ln")) return Module::norm;
  return Module::none;
}

// The engine's optimizer: DeepSpeed's step around the fp32 partitions' optimizer.
class DeepSpeedStep final : public OptimizerSim {
 public:
  DeepSpeedStep(DeepSpeedZero* zero, std::unique_ptr<OptimizerSim> inner)
      : zero_(zero), inner_(std::move(inner)) {}
  void construct(Runtime& rt) override {
    if (inner_) inner_->construct(rt);
  }
  void step(Runtime& rt) override { zero_->step(rt, inner_.get()); }

 private:
  DeepSpeedZero* zero_;
  std::unique_ptr<OptimizerSim> inner_;
};

// ops/adam/fused_adam.py FusedAdam: exp_avg, exp_avg_sq = zeros_like(p.data) at the first
// step (step is a Python int), one multi-tensor kernel, no temporaries.
class DeepSpeedFusedAdam final : public OptimizerSim {
 public:
  void step(Runtime& rt) override {
    auto& params = rt.parameters();
    if (m_.size() < params.size()) {
      m_.resize(params.size());
      v_.resize(params.size());
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad == graph::kNoStorage || m_[i].defined()) continue;
      // Named after the parameter they belong to: the fp32 partition's name
      // ("exp_avg of fp32 partition of group 0 (ZeRO-2)").
      m_[i] = rt.alloc(params[i].bytes, TensorKind::optimizer_state, OpKind::optimizer_math);
      rt.name_as(m_[i].storage, static_cast<int32_t>(i), NameRole::exp_avg);
      v_[i] = rt.alloc(params[i].bytes, TensorKind::optimizer_state, OpKind::optimizer_math);
      rt.name_as(v_[i].storage, static_cast<int32_t>(i), NameRole::exp_avg_sq);
    }
  }

 private:
  std::vector<Tensor> m_, v_;
};

}  // namespace

uint32_t DeepSpeedZero::named(Runtime& rt, uint32_t storage, std::string_view name) {
  rt.name(storage, rt.program().intern(name));
  return storage;
}

template <class Make>
uint32_t DeepSpeedZero::cached_name(Runtime& rt, NameSlot slot, size_t index, Make make) {
  std::vector<uint32_t>& cache = name_cache_[slot];
  if (cache.size() <= index) cache.resize(index + 1, 0);
  if (cache[index] == 0) cache[index] = rt.program().intern(make());
  return cache[index];
}

uint32_t DeepSpeedZero::alloc(Runtime& rt, uint64_t bytes, TensorKind kind, uint32_t name_id,
                              uint8_t stream) {
  const uint32_t s = rt.alloc_raw(bytes, kind, OpKind::other);
  if (stream != 0) rt.program().events.back().stream = stream;  // the alloc just appended
  rt.name(s, name_id);
  return s;
}

uint32_t DeepSpeedZero::alloc(Runtime& rt, uint64_t bytes, TensorKind kind, std::string_view name,
                              uint8_t stream) {
  const uint32_t s = rt.alloc_raw(bytes, kind, OpKind::other);
  if (stream != 0) rt.program().events.back().stream = stream;  // the alloc just appended
  return named(rt, s, name);
}

DeepSpeedZero::DeepSpeedZero(Runtime& rt, const Scenario& s)
    : rt_(&rt),
      stage_(static_cast<int>(s.parallel.zero)),
      d_(static_cast<uint64_t>(s.parallel.data)),
      elem_(static_cast<uint64_t>(dtype_bytes(s.precision.params))),
      c_(s.deepspeed),
      offload_opt_(s.deepspeed.offload_optimizer != DsOffload::none),
      offload_param_(s.deepspeed.offload_param != DsOffload::none),
      zero_("ZeRO-" + std::to_string(stage_)),
      bits_(to_string(s.precision.params)),
      gas_(static_cast<uint64_t>(std::max<int64_t>(1, s.batch.grad_accum))) {
  const size_t n = rt.parameters().size();
  numel_.resize(n);
  is_trainable_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const graph::Parameter& p = rt.parameters()[i];
    numel_[i] = p.bytes / (p.elem != 0 ? p.elem : elem_);
    is_trainable_[i] = !p.frozen;
    if (!p.frozen) {
      trainable_.push_back(static_cast<int32_t>(i));
      largest_param_ = std::max(largest_param_, numel_[i]);
    }
  }
  if (trainable_.empty()) throw std::logic_error("DeepSpeedZero: no parameter requires a gradient");
  norm_ = std::make_unique<DeepSpeedNorm>(rt, s);
  const graph::OpContext saved = rt.ctx;
  rt.ctx.phase = Phase::setup;
  rt.ctx.layer = -1;
  rt.ctx.module = Module::none;
  if (stage_ == 3)
    setup_stage3(rt, s);
  else
    setup_stage12(rt);
  rt.ctx = saved;
  compute_host(s);
  rt.program().host = host_;
  rt.hooks = this;
}

DeepSpeedZero::~DeepSpeedZero() {
  if (rt_->hooks == this) rt_->hooks = nullptr;
}

// ---------------------------------------------------------------- stage 1 / 2 setup
void DeepSpeedZero::setup_stage12(Runtime& rt) {
  Program& program = rt.program();
  // stage_1_and_2.py __init__, per param group: empty_cache(), then
  // flatten_dense_tensors_aligned(params, 2 * d).
  program.empty_cache(Phase::setup);
  uint64_t total = 0;
  for (int32_t p : trainable_) total += numel_[static_cast<size_t>(p)];
  const uint64_t alignment = 2 * d_;  // nccl_start_alignment_factor * world size
  flat_numel_ = ceil_div(total, alignment) * alignment;
  partition_numel_ = flat_numel_ / d_;
  uint32_t pad = graph::kNoStorage;
  if (flat_numel_ > total)
    pad = alloc(rt, (flat_numel_ - total) * elem_, TensorKind::temporary,
                bits_ + " alignment padding of flat group 0 (" + zero_ + ")");
  // The flat buffer lives for the run (its reference is never dropped).
  alloc(rt, flat_numel_ * elem_, TensorKind::parameter,
        bits_ + " flat parameters of group 0 (" + zero_ + " bit16_groups_flat)");
  if (pad != graph::kNoStorage) rt.release(pad);
  // _update_model_bit16_weights: the parameters become views of the flat buffer.
  const uint32_t op = program.intern("DeepSpeed flatten (param.data = view)");
  for (int32_t p : trainable_)
    program.free(rt.parameters()[static_cast<size_t>(p)].storage, Phase::setup, op, -1);
  // Which parameters overlap rank 0's partition [0, P) (get_partition_info).
  in_partition_.assign(rt.parameters().size(), false);
  in_partition_numel_.assign(rt.parameters().size(), 0);
  uint64_t offset = 0;
  for (int32_t p : trainable_) {
    if (offset < partition_numel_) {
      in_partition_[static_cast<size_t>(p)] = true;
      grads_in_partition_numel_ += numel_[static_cast<size_t>(p)];
      // get_flat_partition: the gradient's slice inside [0, P) (a view; rank 0's first
      // offset is 0, the last parameter may be cut by the partition's end).
      const uint64_t n = std::min(numel_[static_cast<size_t>(p)], partition_numel_ - offset);
      in_partition_numel_[static_cast<size_t>(p)] = n;
      partition_grads_.push_back(n);
    }
    offset += numel_[static_cast<size_t>(p)];
  }
  // weights_partition = partition.detach().clone().to(device, fp32): the clone is bit16 on
  // the GPU; with elem 4 and no offload .to() returns it (the clone is the master).
  const uint64_t P = partition_numel_;
  // single_partition_of_fp32_groups[0]: what the optimizer steps; its Adam state and
  // gradient are named after it ("exp_avg of fp32 partition of group 0 (ZeRO-2)").
  const std::string master = "fp32 partition of group 0 (" + zero_ + ")";
  if (!offload_opt_ && elem_ == 4) {
    master_ = rt.add_parameter(P * 4, master);
  } else {
    const uint32_t clone = alloc(rt, P * elem_, TensorKind::temporary,
                                 bits_ + " clone of group 0's partition (" + zero_ + ")");
    if (!offload_opt_) master_ = rt.add_parameter(P * 4, master);
    rt.release(clone);
  }
  if (master_ >= 0) {
    graph::Parameter& m = rt.parameters()[static_cast<size_t>(master_)];
    m.elem = 4;
    program.tensors[m.storage].kind = TensorKind::optimizer_state;
    // The master's own alloc event: with a 16-bit clone the last event is the clone's free.
    for (auto it = program.events.rbegin(); it != program.events.rend(); ++it) {
      if (it->type == EventType::alloc && it->tensor == m.storage) {
        it->kind = TensorKind::optimizer_state;
        break;
      }
    }
    // initialize_optimizer_states: an fp32 zeros(P) .grad, set to None at once.
    rt.release(alloc(rt, P * 4, TensorKind::gradient,
                     "zeros grad of " + master + " (initialize_optimizer_states)"));
  } else {
    // cpu_offload: temp_grad_buffer_for_gpu_offload (largest parameter, bit16) stays.
    alloc(rt, largest_param_ * elem_, TensorKind::gradient,
          bits_ + " gradient staging buffer for the host (" + zero_ + " temp_grad_buffer_for_gpu_offload)");
  }
}

// ---------------------------------------------------------------- stage 3 setup
size_t DeepSpeedZero::unit_for(int32_t layer, Module module) {
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].layer == layer && units_[u].module == module) return u;
  units_.push_back(Unit{layer, module, {}});
  return units_.size() - 1;
}

void DeepSpeedZero::setup_stage3(Runtime& rt, const Scenario& s) {
  Program& program = rt.program();
  const size_t n = numel_.size();
  persistent_.resize(n);
  for (size_t i = 0; i < n; ++i)
    persistent_[i] = numel_[i] <= static_cast<uint64_t>(c_.stage3_param_persistence_threshold);
  // Units: the (layer, module) each parameter is used in (its creation layer, its name).
  std::unordered_map<uint32_t, int32_t> layer_of_storage;
  std::unordered_map<uint32_t, size_t> alloc_index;
  for (size_t k = 0; k < program.events.size(); ++k) {
    const MemoryEvent& e = program.events[k];
    if (e.type == EventType::alloc && e.kind == TensorKind::parameter) {
      layer_of_storage[e.tensor] = e.layer;
      alloc_index[e.tensor] = k;
    }
  }
  units_of_param_.resize(n);
  int32_t embedding = -1;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t st = rt.parameters()[i].storage;
    const std::string& name = program.str(program.tensors[st].name);
    const Module m = module_of_name(name);
    if (m == Module::embedding && embedding < 0 && name.find("wpe") == std::string::npos)
      embedding = static_cast<int32_t>(i);
    const size_t u = unit_for(layer_of_storage.at(st), m);
    units_of_param_[i].push_back(u);
    if (!persistent_[i]) units_[u].params.push_back(static_cast<int32_t>(i));
  }
  // A tied LM head runs with the embedding's weight.
  if (s.model.tied_embeddings && embedding >= 0) {
    const size_t u = unit_for(-1, Module::head);
    units_of_param_[static_cast<size_t>(embedding)].push_back(u);
    if (!persistent_[static_cast<size_t>(embedding)]) units_[u].params.push_back(embedding);
  }
  gather_of_.assign(n, -1);
  fetched_for_.assign(n, 0);
  // _partition_param: ds_tensor = empty(ceil(n/d)) (on the GPU; on the host with
  // offload_param unless persistent), the rank's slice copied, the data freed (free_param)
  // unless persistent. Under zero.Init right after each parameter is made (LoRA adapters,
  // made by PEFT after from_pretrained, at deepspeed.initialize).
  const size_t before = program.events.size();
  std::vector<uint32_t> partition(n, graph::kNoStorage);
  std::vector<std::vector<MemoryEvent>> after_param(n);
  const uint32_t free_op = program.intern("DeepSpeed free_param (partitioned)");
  const bool lora = s.lora.rank > 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t st = rt.parameters()[i].storage;
    const size_t mark = program.events.size();
    rt.ctx.layer = layer_of_storage.at(st);
    if (persistent_[i] || !offload_param_)
      partition[i] = alloc(rt, ceil_div(numel_[i], d_) * elem_, TensorKind::parameter,
                           "ZeRO-3 partition of " + rt.param_name(static_cast<int32_t>(i)) +
                               (persistent_[i] ? " (ds_tensor of a persistent parameter)" : " (ds_tensor)"));
    if (!persistent_[i]) program.free(st, Phase::setup, free_op, rt.ctx.layer);
    const bool under_init = c_.zero_init && !(lora && is_trainable_[i]);
    if (under_init) {
      after_param[i].assign(program.events.begin() + static_cast<std::ptrdiff_t>(mark), program.events.end());
      program.events.resize(mark);
    }
  }
  rt.ctx.layer = -1;
  // DeepSpeedZeroOptimizer_Stage3.__init__ (after DeepSpeedZeRoOffload partitioned the
  // adapters, before the defragmentation): inf_or_nan_tracker, kept (self.device: the GPU
  // unless offload_optimizer).
  if (!offload_opt_) norm_->make_tracker(rt);
  if (c_.zero_init) {
    // Splice each parameter's partitioning right after its creation (setup events only).
    std::vector<size_t> param_of_alloc(program.events.size(), SIZE_MAX);
    for (size_t i = 0; i < n; ++i) param_of_alloc[alloc_index.at(rt.parameters()[i].storage)] = i;
    std::vector<MemoryEvent> out;
    out.reserve(program.events.size() + 2 * n);
    for (size_t k = 0; k < program.events.size(); ++k) {
      out.push_back(program.events[k]);
      if (k < before && param_of_alloc[k] != SIZE_MAX)
        for (const MemoryEvent& e : after_param[param_of_alloc[k]]) out.push_back(e);
    }
    program.events.swap(out);
  }
  // _create_fp16_partitions_with_defragmentation: the trainable partitions move into one
  // flat buffer (defragment), the old ones freed. Sub groups split it by sub_group_size.
  uint64_t total = 0, sub = 0;
  std::vector<uint64_t> parts;  // this sub group's partitions (averaged_gradients[i])
  for (int32_t p : trainable_) {
    const uint64_t part = ceil_div(numel_[static_cast<size_t>(p)], d_);
    total += part;
    sub += part;
    parts.push_back(part);
    if (sub >= static_cast<uint64_t>(c_.sub_group_size)) {
      sub_groups_.push_back(sub);
      sub_group_parts_.push_back(std::move(parts));
      parts.clear();
      sub = 0;
    }
  }
  if (sub > 0) {
    sub_groups_.push_back(sub);
    sub_group_parts_.push_back(std::move(parts));
  }
  for (const std::vector<uint64_t>& g : sub_group_parts_) sub_group_counts_.push_back(g.size());
  partition_numel_ = total;
  if (!offload_param_) {
    alloc(rt, total * elem_, TensorKind::parameter,
          bits_ + " partitions of the trainable parameters (ZeRO-3 lp_param_buffer)");
    for (int32_t p : trainable_)
      if (partition[static_cast<size_t>(p)] != graph::kNoStorage) rt.release(partition[static_cast<size_t>(p)]);
  } else {
    // offload_param: the partitions go to param_groups_fp16_flat_cpu_memory; the persistent
    // ones' GPU partitions move there too.
    for (int32_t p : trainable_)
      if (partition[static_cast<size_t>(p)] != graph::kNoStorage) rt.release(partition[static_cast<size_t>(p)]);
  }
  // _create_fp32_partitions: converted = flat.to(device, fp32); master = converted.clone().
  uint64_t largest_sub = 0;
  for (size_t k = 0; k < sub_groups_.size(); ++k) {
    const uint64_t g = sub_groups_[k];
    const std::string sub_group = "sub group " + std::to_string(k);
    largest_sub = std::max(largest_sub, g);
    if (offload_opt_) {
      // A GPU bit16 partition cast for the host: the cast runs on the GPU (copy_ across
      // devices converts on the source device first). With offload_param it is a host copy.
      if (!offload_param_)
        rt.release(alloc(rt, g * 4, TensorKind::temporary,
                         "fp32 cast of " + sub_group + " for the host (ZeRO-3 offload_optimizer)"));
      continue;
    }
    const uint32_t converted =
        alloc(rt, g * 4, TensorKind::temporary, "fp32 cast of " + sub_group + "'s " + bits_ + " partition (ZeRO-3)");
    // fp32_partitioned_groups_flat[k]: Adam's state and the gradient are named after it.
    const int32_t m = rt.add_parameter(g * 4, "fp32 partition of " + sub_group + " (ZeRO-3)");
    rt.parameters()[static_cast<size_t>(m)].elem = 4;
    program.tensors[rt.parameters()[static_cast<size_t>(m)].storage].kind = TensorKind::optimizer_state;
    program.events.back().kind = TensorKind::optimizer_state;
    masters3_.push_back(m);
    rt.release(converted);
  }
  // initialize_optimizer_states: gradient_buffer = zeros(largest sub group, fp32) on
  // self.device, dropped when it returns (with offload: pinned host buffers per sub group).
  if (!offload_opt_)
    rt.release(alloc(rt, largest_sub * 4, TensorKind::gradient,
                     "fp32 gradient buffer of the largest sub group (ZeRO-3 initialize_optimizer_states)"));
  // IPG bucket, then grad_partitions_flat_buffer (on the host with offload_optimizer).
  ipg_.push_back(alloc(rt, static_cast<uint64_t>(c_.reduce_bucket_size) * elem_, TensorKind::gradient,
                       bits_ + " IPG gradient bucket (ZeRO-3 __ipg_bucket_flat_buffer)"));
  if (!offload_opt_)
    alloc(rt, total * elem_, TensorKind::gradient,
          bits_ + " gradient partitions of the trainable parameters (ZeRO-3 grad_partitions_flat_buffer)");
}

// ---------------------------------------------------------------- host memory
void DeepSpeedZero::compute_host(const Scenario& s) {
  HostMemory h;
  h.ranks_per_node = static_cast<int>(c_.ranks_per_node > 0 ? c_.ranks_per_node
                                                            : std::min<int64_t>(s.parallel.data, 8));
  const uint64_t P = partition_numel_;
  auto add = [&](uint64_t bytes, bool pinned, const std::string& what) {
    if (bytes == 0) return;
    (pinned ? h.pinned : h.pageable) += bytes;
    h.what += (h.what.empty() ? "" : "; ") + what + " " + human_bytes(bytes) +
              (pinned ? " pinned" : " pageable");
  };
  const bool pin = c_.offload_pin_memory;
  if (offload_opt_ && stage_ < 3) {
    // stage_1_and_2.py: fp32 partition and its .grad (pin_memory), the bit16 staging
    // partition, temp_grad_buffer_for_cpu_offload; CPUAdam's exp_avg / exp_avg_sq.
    add(P * 4, pin, "fp32 master partition");
    add(P * 4, pin, "fp32 gradient partition");
    add(P * elem_, pin, "bit16 staging partition");
    add(largest_param_ * elem_, pin, "largest-parameter gradient buffer");
    add(2 * P * 4, false, "CPUAdam exp_avg + exp_avg_sq");
    // Gradient accumulation: accumulated_grads_in_cpu, one zeros(param.numel()) in the
    // parameters' dtype per parameter in the partition (whole parameters), made at the first
    // non-boundary micro-batch and kept (async_accumulate_grad_in_cpu_via_gpu).
    if (gas_ > 1) add(grads_in_partition_numel_ * elem_, pin, "accumulated_grads_in_cpu");
  }
  if (offload_opt_ && stage_ == 3) {
    add(P * elem_, pin, "grad_partitions_flat_buffer");
    if (c_.offload_optimizer == DsOffload::cpu) {
      add(P * 4, false, "fp32 master partitions");
      add(P * 4, pin, "fp32 gradient buffers (per sub group)");
      add(2 * P * 4, false, "CPUAdam exp_avg + exp_avg_sq");
    } else {
      uint64_t largest = 0;
      for (uint64_t g : sub_groups_) largest = std::max(largest, g);
      add(static_cast<uint64_t>(c_.nvme_optimizer_buffer_count) * largest * 4, true,
          "NVMe optimizer swap buffers (buffer_count x largest sub group, fp32)");
      h.nvme += 4 * P * 4;  // fp32 master, its gradient, exp_avg, exp_avg_sq
    }
  }
  if (offload_param_) {
    uint64_t all = 0;
    for (size_t i = 0; i < numel_.size(); ++i)
      if (!persistent_[i]) all += ceil_div(numel_[i], d_);
    if (c_.offload_param == DsOffload::cpu) {
      add(all * elem_, pin, "bit16 parameter partitions");
    } else {
      add(static_cast<uint64_t>(c_.nvme_param_buffer_count * c_.nvme_param_buffer_size) * elem_, true,
          "NVMe parameter swap buffers (buffer_count x buffer_size)");
      h.nvme += all * elem_;
    }
  }
  host_ = h;
}

// ---------------------------------------------------------------- iteration hooks
void DeepSpeedZero::pre_forward(Runtime& rt) {
  backward_seen_ = false;
  if (stage_ != 3) return;
  // A new forward calls the module hooks afresh: its first module is entered even when the
  // previous backward ended in the same one (the embedding, with gradient accumulation, where
  // no step lies between), which the Runtime's change-of-module test would not report.
  rt.hook_countdown = 1;
  // reset_step: a recorded iteration becomes the trace; the prefetch queue is rebuilt.
  if (!trace_complete_ && !recording_.empty()) {
    trace_ = recording_;
    trace_complete_ = true;
  }
  recording_.clear();
  step_ = 0;
  current_ = SIZE_MAX;
  std::fill(fetched_for_.begin(), fetched_for_.end(), 0);
  queue_.clear();
  queue_pos_ = 0;
  if (trace_complete_)
    for (size_t t = 0; t < trace_.size(); ++t)
      for (int32_t p : units_[trace_[t]].params) queue_.emplace_back(t, p);
}

void DeepSpeedZero::countdown_done(Runtime& rt) { layer_entered(rt, rt.ctx.layer); }

void DeepSpeedZero::layer_entered(Runtime& rt, int32_t layer) {
  if (stage_ != 3 || busy_) return;
  const Module m = rt.ctx.module;
  size_t u = SIZE_MAX;
  for (size_t k = 0; k < units_.size(); ++k)
    if (units_[k].layer == layer && units_[k].module == m) u = k;
  if (u == current_) return;
  visit(rt, u);
}

void DeepSpeedZero::visit(Runtime& rt, size_t u) {
  // Post-forward / post-backward of the module left: release_sub_module.
  if (current_ != SIZE_MAX && !units_[current_].params.empty()) {
    const size_t next = step_;  // the coordinator's step id, already past the module
    for (int32_t p : units_[current_].params) {
      if (gather_of_[static_cast<size_t>(p)] < 0) continue;
      bool keep = false;
      if (trace_complete_) {
        keep = fetched_for_[static_cast<size_t>(p)] > next;
        uint64_t traversed = 0;
        for (size_t t = next; !keep && t < trace_.size(); ++t) {
          if (traversed >= static_cast<uint64_t>(c_.stage3_max_reuse_distance)) break;
          for (int32_t q : units_[trace_[t]].params) {
            if (q == p) keep = true;
            traversed += numel_[static_cast<size_t>(q)];
          }
        }
      }
      if (!keep) release_param(rt, p);
    }
  }
  current_ = u;
  if (u == SIZE_MAX || units_[u].params.empty()) return;
  const size_t t = step_++;
  recording_.push_back(u);
  if (trace_complete_ && (t >= trace_.size() || trace_[t] != u)) {
    // The order differs from the recorded one: DeepSpeed invalidates the trace and records
    // again (no prefetch until it is complete).
    trace_complete_ = false;
    queue_.clear();
    queue_pos_ = 0;
  }
  // fetch_sub_module: all-gather what the module needs and is not available.
  std::vector<int32_t> need;
  for (int32_t p : units_[u].params)
    if (gather_of_[static_cast<size_t>(p)] < 0) need.push_back(p);
  fetch(rt, need, false);
  if (!trace_complete_) return;
  while (queue_pos_ < queue_.size() && queue_[queue_pos_].first <= t) {
    const auto& [at, p] = queue_[queue_pos_++];
    fetched_for_[static_cast<size_t>(p)] = std::max(fetched_for_[static_cast<size_t>(p)], at);
  }
  const uint64_t live_room = static_cast<uint64_t>(c_.stage3_max_live_parameters) > available_
                                 ? static_cast<uint64_t>(c_.stage3_max_live_parameters) - available_
                                 : 0;
  const uint64_t max_prefetch = std::min(live_room, static_cast<uint64_t>(c_.stage3_prefetch_bucket_size));
  if (max_prefetch == 0) return;
  std::vector<int32_t> prefetch;
  uint64_t numel = 0;
  while (queue_pos_ < queue_.size() && numel < max_prefetch) {
    const auto& [at, p] = queue_[queue_pos_++];
    const size_t i = static_cast<size_t>(p);
    const bool fresh = gather_of_[i] < 0 &&
                       std::find(prefetch.begin(), prefetch.end(), p) == prefetch.end();
    fetched_for_[i] = std::max(fetched_for_[i], at);
    if (fresh) {
      prefetch.push_back(p);
      numel += numel_[i];
    }
  }
  fetch(rt, prefetch, true);
}

uint32_t DeepSpeedZero::gather_name(Runtime& rt, const std::vector<int32_t>& params, bool prefetch) {
  // The same parameters are gathered every iteration: each distinct list's name is built
  // once (the key hashes the list; no string is made on a hit).
  uint64_t key = prefetch ? 0x9e3779b97f4a7c15ull : 0;
  for (int32_t p : params) key = (key ^ static_cast<uint64_t>(p + 1)) * 0x100000001b3ull;
  if (auto it = gather_names_.find(key); it != gather_names_.end()) return it->second;
  // "ZeRO-3 all-gather of model.layers.3.mlp.up_proj.weight", or of the parameters'
  // common module path with their count ("... of model.layers.3.self_attn (4 parameters)").
  std::string what = params.size() == 1 ? rt.param_name(params[0]) : std::string();
  if (params.size() > 1) {
    what = rt.param_name(params[0]);
    for (int32_t p : params) what = common_module_path(what, rt.param_name(p));
    what += (what.empty() ? "" : " ") + std::string("(") + std::to_string(params.size()) + " parameters)";
  }
  const uint32_t id = rt.program().intern((prefetch ? "ZeRO-3 prefetch all-gather of " : "ZeRO-3 all-gather of ") + what);
  gather_names_.emplace(key, id);
  return id;
}

void DeepSpeedZero::fetch(Runtime& rt, const std::vector<int32_t>& params, bool prefetch) {
  if (params.empty()) return;
  // _all_gather_dtype: flat_tensor = empty(sum(partition) * world); the parameters become
  // views of it. offload_param: each partition is first copied to the GPU.
  uint64_t elems = 0;
  for (int32_t p : params) elems += ceil_div(numel_[static_cast<size_t>(p)], d_) * d_;
  Gather g;
  g.storage = rt.alloc_raw(elems * elem_, TensorKind::parameter, OpKind::other);
  rt.name(g.storage, gather_name(rt, params, prefetch));
  g.live = static_cast<uint32_t>(params.size());
  if (offload_param_) {
    std::vector<uint32_t> copies;
    for (int32_t p : params)
      copies.push_back(alloc(rt, ceil_div(numel_[static_cast<size_t>(p)], d_) * elem_, TensorKind::temporary,
                             cached_name(rt, kToDevice, static_cast<size_t>(p), [&] {
                               return "ZeRO-3 partition of " + rt.param_name(p) + " copied to the GPU (offload_param)";
                             })));
    for (uint32_t c : copies) rt.release(c);
  }
  const int32_t id = static_cast<int32_t>(gathers_.size());
  gathers_.push_back(g);
  for (int32_t p : params) {
    gather_of_[static_cast<size_t>(p)] = id;
    available_ += numel_[static_cast<size_t>(p)];
  }
}

void DeepSpeedZero::release_param(Runtime& rt, int32_t p) {
  const size_t i = static_cast<size_t>(p);
  const int32_t g = gather_of_[i];
  if (g < 0) return;
  gather_of_[i] = -1;
  available_ -= numel_[i];
  Gather& gather = gathers_[static_cast<size_t>(g)];
  if (--gather.live == 0) rt.release(gather.storage);
}

void DeepSpeedZero::release_all(Runtime& rt) {
  for (size_t i = 0; i < gather_of_.size(); ++i) release_param(rt, static_cast<int32_t>(i));
  current_ = SIZE_MAX;
}

// ---------------------------------------------------------------- gradients
void DeepSpeedZero::ensure_buckets(Runtime& rt) {
  // stage 1/2 setup_buckets: the first gradient hook of a backward allocates the bucket(s).
  if (!ipg_.empty()) return;
  const int count = c_.overlap() ? 2 : 1;
  for (int k = 0; k < count; ++k)
    ipg_.push_back(alloc(rt, static_cast<uint64_t>(c_.reduce_bucket_size) * elem_, TensorKind::gradient,
                         cached_name(rt, kBucket, static_cast<size_t>(k), [&] {
                           return bits_ + " IPG gradient bucket " + std::to_string(k) + " (" + zero_ + " ipg_buffer)";
                         })));
}

void DeepSpeedZero::grad_ready(Runtime& rt, int32_t param) {
  const size_t i = static_cast<size_t>(param);
  if (i >= is_trainable_.size() || !is_trainable_[i]) return;
  graph::Parameter& p = rt.parameters()[i];
  const uint64_t n = numel_[i];
  const uint64_t rbs = static_cast<uint64_t>(c_.reduce_bucket_size);
  if (stage_ == 3) {
    if (bucket_elements_ + n > rbs) reduce_bucket3(rt);
    if (bucket_elements_ + n <= rbs) {
      // __add_grad_to_ipg_bucket: the gradient is copied into the bucket; .grad views it.
      const uint32_t fresh = p.grad;
      rt.retain(ipg_[0]);
      p.grad = ipg_[0];
      rt.release(fresh);
    }
    bucket_params_.push_back(param);
    bucket_elements_ += n;
    return;
  }
  ensure_buckets(rt);
  if (stage_ == 1) return;  // the hooks only set up the buckets; reduce_gradients reduces
  bucket_grad12(rt, param);
}

void DeepSpeedZero::bucket_grad12(Runtime& rt, int32_t param) {
  // reduce_independent_p_g_buckets_and_remove_grads (contiguous_gradients): a full bucket
  // is reduced first; the gradient is copied into the bucket and .grad views it.
  graph::Parameter& p = rt.parameters()[static_cast<size_t>(param)];
  const uint64_t n = numel_[static_cast<size_t>(param)];
  const uint64_t rbs = static_cast<uint64_t>(c_.reduce_bucket_size);
  if (bucket_elements_ + n > rbs) reduce_bucket12(rt);
  if (n > rbs) {
    extra_large_.push_back(param);  // reduced directly, keeps its own storage
  } else {
    const uint32_t fresh = p.grad;
    rt.retain(ipg_[0]);
    p.grad = ipg_[0];
    rt.release(fresh);
  }
  bucket_params_.push_back(param);
  bucket_elements_ += n;
}

void DeepSpeedZero::take_grad_into_partition(Runtime& rt, int32_t param) {
  graph::Parameter& p = rt.parameters()[static_cast<size_t>(param)];
  if (offload_opt_) {
    // copy_grads_in_partition with cpu_offload: before the boundary the gradient only goes
    // through accumulated_grads_in_cpu (async_accumulate_grad_in_cpu_via_gpu: a host buffer
    // and a view of temp_grad_buffer_for_gpu_offload, nothing new on the GPU). At the
    // boundary async_inplace_copy_grad_to_fp32_buffer_from_gpu: the partition's slice
    // .float() on the GPU, copied to the pinned fp32 gradient; .grad stays a view of the bucket.
    if (!boundary()) return;
    // set_norm_for_param_grad_in_gpu and update_offload_overflow_tracker_for_param_grad
    // first (sim/parallel/deepspeed_norm.h); the copy is of the partition's slice.
    norm_->offload_grad12(rt, in_partition_numel_[static_cast<size_t>(param)], numel_[static_cast<size_t>(param)]);
    rt.release(alloc(rt, in_partition_numel_[static_cast<size_t>(param)] * 4, TensorKind::temporary,
                     cached_name(rt, kGradHostCast, static_cast<size_t>(param), [&] {
                       return "fp32 cast of grad of " + rt.param_name(param) + " for the host (" + zero_ +
                              " offload_optimizer)";
                     })));
    return;
  }
  // copy_grads_in_partition: grads_in_partition allocated at the first copy.
  if (grads_in_partition_ == graph::kNoStorage)
    grads_in_partition_ = alloc(rt, grads_in_partition_numel_ * elem_, TensorKind::gradient,
                                cached_name(rt, kFixed, 0, [&] {
                                  return bits_ + " gradients in group 0's partition (" + zero_ + " grads_in_partition)";
                                }));
  const uint32_t old = p.grad;
  rt.retain(grads_in_partition_);
  p.grad = grads_in_partition_;
  rt.release(old);
}

void DeepSpeedZero::reduce_bucket12(Runtime& rt) {
  // reduce_ipg_grads (stage 2): in-place reduction; outside the partition the gradient is
  // dropped, inside it moves to grads_in_partition.
  for (int32_t q : bucket_params_) {
    graph::Parameter& p = rt.parameters()[static_cast<size_t>(q)];
    if (p.grad == graph::kNoStorage) continue;
    if (!in_partition_[static_cast<size_t>(q)]) {
      const uint32_t g = p.grad;
      p.grad = graph::kNoStorage;
      rt.release(g);
    } else {
      take_grad_into_partition(rt, q);
    }
  }
  bucket_params_.clear();
  extra_large_.clear();
  bucket_elements_ = 0;
}

void DeepSpeedZero::reduce_bucket3(Runtime& rt) {
  if (bucket_params_.empty()) return;
  // __avg_scatter_grads -> reduce_scatter_coalesced: the gradients' per-rank chunks,
  // padded to ceil(n/d), concatenated (torch.cat) on the reduce stream, unless the bucket
  // is one tensor divisible by d. Then partition_grads copies rank 0's chunks into the
  // grad partitions buffer and drops the gradients.
  uint64_t elems = 0;
  for (int32_t q : bucket_params_) elems += ceil_div(numel_[static_cast<size_t>(q)], d_) * d_;
  uint32_t flat = graph::kNoStorage;
  const bool one_even = bucket_params_.size() == 1 && numel_[static_cast<size_t>(bucket_params_[0])] % d_ == 0;
  if (!one_even)
    flat = alloc(rt, elems * elem_, TensorKind::temporary, cached_name(rt, kFixed, 1, [&] {
                   return bits_ + " reduce-scatter input of the IPG bucket (ZeRO-3 reduce_scatter_coalesced)";
                 }), 1);
  for (int32_t q : bucket_params_) {
    graph::Parameter& p = rt.parameters()[static_cast<size_t>(q)];
    if (offload_opt_) {
      // partition_grads with the buffer on the host: grad_buffer.to(device) (micro_step_id
      // 0: after the copy; later: the GPU copy the partition is add_ed into, then copied
      // back) and, at the accumulation boundary only (_offload_grad_partition_at_boundary),
      // its .to(fp32) before the copy to the host gradient.
      const uint64_t part = ceil_div(numel_[static_cast<size_t>(q)], d_);
      const size_t qi = static_cast<size_t>(q);
      const uint32_t a = alloc(rt, part * elem_, TensorKind::temporary, cached_name(rt, kGradToGpu, qi, [&] {
                                 return "ZeRO-3 grad partition of " + rt.param_name(q) + " on the GPU (offload_optimizer)";
                               }), 1);
      if (boundary()) {
        // _offload_grad_partition_at_boundary: the partition's norm first
        // (_constant_buffered_norm2, kept until the step), then the fp32 cast.
        norm_->offload_grad3(rt, part);
        rt.release(alloc(rt, part * 4, TensorKind::temporary, cached_name(rt, kGradFp32, qi, [&] {
                           return "fp32 cast of ZeRO-3 grad partition of " + rt.param_name(q) + " (offload_optimizer)";
                         }), 1));
      }
      rt.release(a);
    }
    if (p.grad != graph::kNoStorage) {
      const uint32_t g = p.grad;
      p.grad = graph::kNoStorage;
      rt.release(g);
    }
  }
  if (flat != graph::kNoStorage) rt.release(flat);
  bucket_params_.clear();
  bucket_elements_ = 0;
}

Tensor DeepSpeedZero::scale_loss(Runtime& rt, const Tensor& loss) {
  Busy busy(busy_);
  return norm_->scale_loss(rt, loss);
}

void DeepSpeedZero::post_backward(Runtime& rt) {
  {
    Busy busy(busy_);
    epilogue(rt);
  }
  ++backwards_;  // engine.step() after each backward counts the micro-step (micro_steps)
}

void DeepSpeedZero::epilogue(Runtime& rt) {
  if (stage_ == 3) {
    // independent_gradient_partition_epilogue: the last bucket (every micro-batch: stage 3
    // partitions gradients, engine.allreduce_gradients).
    reduce_bucket3(rt);
    // backward_epilogue -> release_backward_leftovers: the module still gathered (the one
    // the backward ended in, the embedding, whose post-backward hook never fires) is
    // released before the next forward (gradient accumulation) or the step.
    if (current_ != SIZE_MAX)
      for (int32_t p : units_[current_].params) release_param(rt, p);
    current_ = SIZE_MAX;
    return;
  }
  // Stage 1 (engine.allreduce_gradients: reduce_gradients only at the accumulation
  // boundary): before it nothing runs; the whole gradients accumulate and the bucket stays.
  if (stage_ == 1 && !boundary()) return;
  // Stage 1 reduce_gradients (no overlap_comm): every parameter with a gradient, in group
  // order, through the bucket path the stage-2 hooks take
  // (reduce_ready_partitions_and_remove_grads at the boundary); reduce_ipg_grads copies the
  // partition's gradients into grads_in_partition ("zero stage 1 - partition only optimizer
  // state" branch) and leaves the others as views of the bucket.
  if (stage_ == 1)
    for (int32_t q : trainable_)
      if (rt.parameters()[static_cast<size_t>(q)].grad != graph::kNoStorage) bucket_grad12(rt, q);
  // stage_1_and_2 independent_gradient_partition_epilogue: the last bucket.
  reduce_bucket12(rt);
  const bool first = held_.empty();
  if (!offload_opt_) {
    // all_grad_tensors: the partition's gradients (views of grads_in_partition), kept for
    // the step; a later micro-step adds into them (in place) and drops its own.
    if (first && grads_in_partition_ != graph::kNoStorage) {
      rt.retain(grads_in_partition_);
      held_.push_back(grads_in_partition_);
    }
  }
  // _release_ipg_buffers: the bucket(s) and grads_in_partition's own reference.
  for (uint32_t b : ipg_) rt.release(b);
  ipg_.clear();
  if (grads_in_partition_ != graph::kNoStorage) rt.release(grads_in_partition_);
  grads_in_partition_ = graph::kNoStorage;
  // _clear_param_grad_only.
  for (int32_t q : trainable_) {
    graph::Parameter& p = rt.parameters()[static_cast<size_t>(q)];
    if (p.grad == graph::kNoStorage) continue;
    const uint32_t g = p.grad;
    p.grad = graph::kNoStorage;
    rt.release(g);
  }
}

// ---------------------------------------------------------------- the step
std::unique_ptr<OptimizerSim> make_deepspeed_fused_adam() { return std::make_unique<DeepSpeedFusedAdam>(); }

std::unique_ptr<OptimizerSim> DeepSpeedZero::make_step(std::unique_ptr<OptimizerSim> inner) {
  if (!inner) return nullptr;
  if (offload_opt_) inner.reset();  // DeepSpeedCPUAdam steps host tensors
  return std::make_unique<DeepSpeedStep>(this, std::move(inner));
}

void DeepSpeedZero::step(Runtime& rt, OptimizerSim* inner) {
  Busy busy(busy_);
  if (stage_ == 3) {
    // _partition_all_parameters: every gathered parameter is released.
    release_all(rt);
    if (offload_opt_) {  // CPUAdam on the host; the bit16 copy-back is in place
      // The norms were taken at the boundary; each sub group's are summed on the GPU.
      norm_->offload_step3(rt, sub_group_counts_);
      norm_->step_done(rt);
      return;
    }
    // _overflow_check_and_loss_scale_update, _get_norm_groups, the global norm.
    norm_->norm3(rt, partition_numel_, sub_group_parts_);
    for (size_t g = 0; g < sub_groups_.size(); ++g) {
      // _prepare_fp32_grad_for_sub_group: flatten(averaged_gradients).to(fp32).
      const uint32_t flat = alloc(rt, sub_groups_[g] * elem_, TensorKind::gradient, cached_name(rt, kStepFlat, g, [&] {
                                    return bits_ + " flat grad of sub group " + std::to_string(g) + " (ZeRO-3)";
                                  }));
      const uint32_t fp32 = rt.alloc_raw(sub_groups_[g] * 4, TensorKind::gradient, OpKind::other);
      rt.name_as(fp32, masters3_[g], NameRole::grad);  // "grad of fp32 partition of sub group 0 (ZeRO-3)"
      rt.release(flat);
      graph::Parameter& m = rt.parameters()[static_cast<size_t>(masters3_[g])];
      m.grad = fp32;
      norm_->unscale_and_clip(rt);  // unscale_and_clip_grads(sub_group_id, ...)
      if (inner) inner->step(rt);
      m.grad = graph::kNoStorage;
      rt.release(fp32);  // _release_sub_group
    }
    norm_->step_done(rt);
    return;
  }
  if (offload_opt_) {
    held_.clear();
    norm_->offload_step12(rt);
    norm_->step_done(rt);  // reset_cpu_buffers drops the norms taken in backward
    return;
  }
  // check_overflow (fp16), scaled_global_norm over averaged_gradients, _global_grad_norm.
  norm_->norm12(rt, partition_grads_);
  // stage_1_and_2 step: flatten(averaged_gradients).to(fp32), the bit16 flat dropped, the
  // kept gradients freed (free_grad_in_param_list, averaged_gradients = None).
  const uint64_t P = partition_numel_;
  const uint32_t flat = alloc(rt, P * elem_, TensorKind::gradient, cached_name(rt, kFixed, 2, [&] {
                                return bits_ + " flat grad of group 0's partition (" + zero_ + ")";
                              }));
  uint32_t fp32 = flat;
  if (elem_ != 4) {
    fp32 = rt.alloc_raw(P * 4, TensorKind::gradient, OpKind::other);
    rt.release(flat);
  }
  rt.name_as(fp32, master_, NameRole::grad);  // "grad of fp32 partition of group 0 (ZeRO-2)"
  for (uint32_t g : held_) rt.release(g);
  held_.clear();
  graph::Parameter& m = rt.parameters()[static_cast<size_t>(master_)];
  m.grad = fp32;
  norm_->unscale_and_clip(rt);  // unscale_and_clip_grads([single_grad_partition], ...)
  if (inner) inner->step(rt);
  m.grad = graph::kNoStorage;
  rt.release(fp32);
  norm_->step_done(rt);
}

}  // namespace memsim

