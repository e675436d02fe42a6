#include "sim/parallel/fsdp.h"

#include <string>
#include <stdexcept>
#include <unordered_map>

#include "scenario/fsdp_precision.h"
#include "sim/parallel/wrap_units.h"
#include "sim/parallel/zero_sharding.h"

namespace memsim {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

Fsdp::Fsdp(Runtime& rt, const Scenario& s)
    : rt_(&rt),
      d_(static_cast<uint64_t>(s.parallel.data)),
      elem_(static_cast<uint64_t>(dtype_bytes(s.precision.params))),
      compute_elem_(model_compute_elem(s)),
      reshard_after_forward_(s.parallel.reshard_after_forward),
      offload_(s.parallel.cpu_offload) {
  Program& program = rt.program();
  // Which layer each parameter was created in: the auto-wrap units (sim/parallel/wrap_units.h).
  const ParameterLayers wrap = parameter_layers(program);
  units_.resize(1 + static_cast<size_t>(wrap.layers));
  const size_t n = rt.parameters().size();
  unit_of_param_.resize(n);
  stamp_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const size_t u = unit_of_layer(wrap.layer_of_storage.at(rt.parameters()[i].storage));
    unit_of_param_[i] = u;
    units_[u].params.push_back(static_cast<int32_t>(i));
  }
  // MixedPrecision: the model's graph was built in param_dtype (the gathered parameters
  // it computes with), but the module is created, wrapped and sharded in
  // precision.params: its construction allocations are that size. The original
  // parameters keep their param_dtype size (what their views and gradients are).
  if (compute_elem_ != elem_) {
    for (MemoryEvent& e : program.events) {
      if (e.type != EventType::alloc || e.kind != TensorKind::parameter) continue;
      e.bytes = e.bytes / compute_elem_ * elem_;
      program.tensors[e.tensor].bytes = e.bytes;
    }
    for (graph::Parameter& p : rt.parameters()) p.elem = static_cast<uint8_t>(compute_elem_);
  }
  // fsdp_init cpu: the model was built off the GPU; FSDP(device_id=...) moves each unit
  // to the GPU just before flattening it. The parameters' GPU allocations, emitted by
  // the model's construction, move from there to their unit's wrap (setup events only:
  // each allocation stays before its free).
  std::vector<std::vector<MemoryEvent>> moved(units_.size());
  if (s.parallel.fsdp_init_on_cpu) {
    std::vector<MemoryEvent> kept;
    kept.reserve(program.events.size());
    for (const MemoryEvent& e : program.events) {
      if (e.type == EventType::alloc && e.kind == TensorKind::parameter)
        moved[unit_of_layer(e.layer)].push_back(e);
      else
        kept.push_back(e);
    }
    program.events.swap(kept);
  }
  // Wrap: inner units first (auto_wrap_policy wraps children before the root).
  const graph::OpContext saved = rt.ctx;
  rt.ctx.phase = Phase::setup;
  rt.ctx.module = graph::Module::none;
  const uint32_t wrap_op = program.intern("FSDP flatten");
  const uint32_t offload_op = program.intern("FSDP flat_param_to(cpu)");
  for (size_t k = 1; k <= units_.size(); ++k) {
    const size_t u = k % units_.size();  // layers 0.., then the root
    Unit& unit = units_[u];
    rt.ctx.layer = u == 0 ? -1 : static_cast<int32_t>(u - 1);
    for (const MemoryEvent& e : moved[u]) program.events.push_back(e);  // unit.to(device)
    uint64_t numel = 0;
    for (int32_t p : unit.params) numel += rt.parameters()[p].bytes / compute_elem_;
    unit.padded_numel = padded_numel(numel, static_cast<int64_t>(d_));
    unit.padded_bytes = unit.padded_numel * elem_;
    Tensor flat = named(rt, rt.alloc(unit.padded_bytes, TensorKind::parameter, OpKind::other), u,
                        "FlatParameter (wrap)");
    // The original parameters become views of the flat parameter: their storages go.
    // (The Runtime's module reference stays, so they are never freed a second time.)
    for (int32_t p : unit.params)
      program.free(rt.parameters()[p].storage, Phase::setup, wrap_op, rt.ctx.layer);
    // What the optimizer steps: its Adam state is named after it ("exp_avg of FSDP
    // flat_param shard of block 7").
    unit.shard = rt.add_parameter(unit.padded_bytes / d_,
                                  u == 0 ? std::string("FSDP flat_param shard of the root")
                                         : "FSDP flat_param shard of block " + std::to_string(u - 1));
    flat.reset();
    // cpu_offload: handle.flat_param_to(cpu) after shard(): the GPU shard goes (the
    // Runtime's parameter entry stays, its storage is never freed a second time).
    if (offload_)
      program.free(rt.parameters()[unit.shard].storage, Phase::setup, offload_op, rt.ctx.layer);
  }
  rt.ctx = saved;
  unit_of_param_.resize(rt.parameters().size(), 0);  // shards: never get autograd grads
  stamp_.resize(rt.parameters().size(), 0);
  rt.hooks = this;
}

Fsdp::~Fsdp() {
  if (rt_->hooks == this) rt_->hooks = nullptr;
}

namespace {
// "<what> of block 7" (the unit wrapping layer 7) / "<what> of the root" (unit 0: the
// embedding, final norm and head), for the names in the reports (program/tensor_names.h).
uint32_t unit_name(Runtime& rt, size_t u, const char* what) {
  return rt.program().intern(std::string(what) +
                             (u == 0 ? " of the root" : " of block " + std::to_string(u - 1)));
}
}  // namespace

Tensor Fsdp::named(Runtime& rt, Tensor t, size_t u, const char* what) {
  rt.name(t.storage, unit_name(rt, u, what));
  return t;
}

void Fsdp::gather(Runtime& rt, size_t u) {
  Unit& unit = units_[u];
  if (unit.full.defined()) return;
  const uint64_t shard_numel = unit.padded_numel / d_;
  // pre_unshard. MixedPrecision: _use_low_precision_shard allocates _mp_shard and copies
  // the shard into it (cpu_offload: via a full-precision GPU copy, local_shard.to(device),
  // gone once copied). cpu_offload alone: flat_param_to(device), the all-gather input.
  Tensor staged;
  if (compute_elem_ != elem_) {
    staged = named(rt, rt.alloc(shard_numel * compute_elem_, TensorKind::parameter, OpKind::other),
                   u, "FSDP _mp_shard (low-precision shard)");
    if (offload_) {
      Tensor copy = named(rt, rt.alloc(shard_numel * elem_, TensorKind::parameter, OpKind::other),
                          u, "FSDP shard copied to GPU (flat_param_to(device))");
    }
  } else if (offload_) {
    staged = named(rt, rt.alloc(shard_numel * elem_, TensorKind::parameter, OpKind::other), u,
                   "FSDP shard copied to GPU (flat_param_to(device))");
  }
  unit.full = named(rt, rt.alloc(unit.padded_numel * compute_elem_, TensorKind::parameter,
                                 OpKind::other),
                    u, "FSDP all-gather");  // the unsharded flat_param
  // _use_unsharded_flat_param: flat_param.data now views the gathered tensor; the GPU
  // copy of the shard loses its last reference (MixedPrecision: post_unshard frees
  // _mp_shard).
  staged.reset();
}

void Fsdp::reshard(Runtime&, size_t u) { units_[u].full.reset(); }

void Fsdp::reduce_scatter(Runtime& rt, size_t u) {
  Unit& unit = units_[u];
  // SplitWithSizesBackward: the per-parameter gradients concatenated into the
  // FlatParameter's full gradient (param_dtype under MixedPrecision), then they die.
  const uint64_t shard_numel = unit.padded_numel / d_;
  Tensor flat = named(rt, rt.alloc(unit.padded_numel * compute_elem_, TensorKind::gradient,
                                   OpKind::other),
                      u, "FlatParameter.grad (unsharded)");
  for (int32_t p : unit.params) {
    graph::Parameter& param = rt.parameters()[p];
    if (param.grad == graph::kNoStorage) continue;
    const uint32_t g = param.grad;
    param.grad = graph::kNoStorage;
    rt.release(g);
  }
  // Reduce-scatter into a new shard (reduce_dtype = param_dtype under MixedPrecision);
  // accumulated into the saved shard if there is one.
  uint32_t shard_grad =
      rt.alloc_raw(shard_numel * compute_elem_, TensorKind::gradient, OpKind::other);
  rt.name(shard_grad, unit_name(rt, u, "FSDP sharded grad"));
  if (compute_elem_ != elem_) {
    // _cast_grad_to_param_dtype: sharded_grad.data = sharded_grad.to(fp32 param dtype).
    const uint32_t low = shard_grad;
    shard_grad = rt.alloc_raw(shard_numel * elem_, TensorKind::gradient, OpKind::other);
    rt.name(shard_grad, unit_name(rt, u, "FSDP sharded grad"));
    rt.release(low);
  }
  flat.reset();
  if (offload_) {
    // _saved_grad_shard stays on the GPU (copied into the pinned CPU .grad) until the
    // final callback; one post-backward per unit and backward, so nothing to add into.
    unit.saved_grad = shard_grad;
    return;
  }
  graph::Parameter& shard = rt.parameters()[unit.shard];
  if (shard.grad == graph::kNoStorage)
    shard.grad = shard_grad;
  else
    rt.release(shard_grad);
}

void Fsdp::pre_forward(Runtime& rt) {
  ++iteration_;
  for (Unit& unit : units_) {
    unit.ready = 0;
    unit.forward_done = false;
    unit.backward_done = false;
  }
  forward_unit_ = 0;
  backward_started_ = false;
  if (iteration_ == 1) lazy_init(rt);
  gather(rt, 0);
}

void Fsdp::lazy_init(Runtime& rt) {
  // _lazy_init -> init_flat_param_attributes, the root's handle first, then the others in
  // module order: each unsharded buffer the handle will gather into is created with
  // torch.zeros on the GPU and its storage freed at once (_free_storage), so that later
  // all-gathers only resize it; MixedPrecision also creates and frees _mp_shard and the
  // full-precision padded buffer. Transient, but they pass through the caching allocator.
  const uint32_t name = rt.program().intern("FSDP lazy init (zeros, storage freed at once)");
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    const uint64_t sizes[3] = {compute_elem_ != elem_ ? unit.padded_numel / d_ * compute_elem_ : 0,
                               unit.padded_numel * compute_elem_,
                               compute_elem_ != elem_ ? unit.padded_numel * elem_ : 0};
    for (uint64_t bytes : sizes) {
      if (bytes == 0) continue;
      Tensor t = rt.alloc(bytes, TensorKind::parameter, OpKind::other);
      rt.program().tensors[t.storage].name = name;
    }
  }
}

void Fsdp::layer_entered(Runtime& rt, int32_t layer) {
  const size_t u = unit_of_layer(layer);
  if (u >= units_.size()) return;
  if (rt.ctx.phase == Phase::forward && !rt.recomputing) {
    if (units_[u].forward_done) return;  // an op of a finished layer: no hook fires
    if (forward_unit_ != 0 && forward_unit_ != u) {
      if (reshard_after_forward_) reshard(rt, forward_unit_);  // post-forward
      units_[forward_unit_].forward_done = true;
    }
    if (u != 0) gather(rt, u);  // pre-forward
    forward_unit_ = u;
  } else if (rt.ctx.phase == Phase::backward || rt.recomputing) {
    if (!backward_started_ && rt.ctx.module == graph::Module::head) root_pre_backward(rt);
    if (u == 0 || units_[u].backward_done) return;
    gather(rt, u);                                              // pre-backward
    if (u > 1 && !units_[u - 1].backward_done) gather(rt, u - 1);  // BACKWARD_PRE prefetch
  }
}

void Fsdp::root_pre_backward(Runtime& rt) {
  // The root's pre-backward hook (on its output, the logits): prefetch the last layer.
  backward_started_ = true;
  if (units_.size() > 1) gather(rt, units_.size() - 1);
}

void Fsdp::grad_ready(Runtime& rt, int32_t param) {
  if (!backward_started_) root_pre_backward(rt);  // a model whose head allocates nothing
  const size_t i = static_cast<size_t>(param);
  const size_t u = unit_of_param_[i];
  if (stamp_[i] != iteration_) {
    stamp_[i] = iteration_;
    ++units_[u].ready;
  }
  Unit& unit = units_[u];
  if (u != 0 && !unit.backward_done && unit.ready == unit.params.size()) {
    reduce_scatter(rt, u);  // post-backward
    reshard(rt, u);
    unit.backward_done = true;
  }
}

void Fsdp::post_backward(Runtime& rt) {
  Unit& root = units_[0];
  if (root.ready > 0 && !root.backward_done) {
    reduce_scatter(rt, 0);
    root.backward_done = true;
  }
  // _post_backward_final_callback, per FSDP state (root first): _catch_all_reshard, then
  // _finalize_params (cpu_offload: .grad = the CPU gradient, _saved_grad_shard deleted).
  for (size_t u = 0; u < units_.size(); ++u) {
    reshard(rt, u);
    if (units_[u].saved_grad != graph::kNoStorage) rt.release(units_[u].saved_grad);
    units_[u].saved_grad = graph::kNoStorage;
  }
}

namespace {
class CpuOffloadedOptimizer final : public OptimizerSim {
 public:
  void step(Runtime&) override {}  // CPU tensors only
};
}  // namespace

std::unique_ptr<OptimizerSim> make_cpu_offloaded_optimizer() {
  return std::make_unique<CpuOffloadedOptimizer>();
}

}  // namespace memsim
