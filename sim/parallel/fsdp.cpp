#include "sim/parallel/fsdp.h"

#include <algorithm>
#include <deque>
#include <string>
#include <stdexcept>
#include <unordered_map>

#include "scenario/fsdp_precision.h"
#include "sim/parallel/accelerate_amp.h"
#include "sim/parallel/fsdp_sync_states.h"
#include "sim/parallel/wrap_units.h"
#include "sim/step/loss_placement.h"
#include "sim/parallel/zero_sharding.h"

namespace memsim {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

Fsdp::Fsdp(Runtime& rt, const Scenario& s)
    : rt_(&rt),
      d_(static_cast<uint64_t>(s.parallel.data)),
      elem_(trained_param_elem(s)),
      load_elem_(static_cast<uint64_t>(dtype_bytes(s.precision.params))),
      compute_elem_(model_compute_elem(s)),
      reshard_after_forward_(s.parallel.reshard_after_forward),
      offload_(s.parallel.cpu_offload),
      orig_params_(s.parallel.use_orig_params),
      peft_wrap_(s.parallel.fsdp_wrap == FsdpWrap::peft),
      prefetch_(s.parallel.fsdp_backward_prefetch),
      loss_in_forward_(loss_in_model_forward(s)) {
  Program& program = rt.program();
  // _get_aligned_numel(unsharded_dtype=_fwd_bwd_param_dtype): 16 bytes of the compute dtype.
  if (orig_params_) aligned_numel_ = 16 / compute_elem_;
  assign_units(rt, s);
  // MixedPrecision: the model's graph was built in param_dtype (the gathered parameters
  // it computes with), but the module is created, wrapped and sharded in
  // precision.params: its construction allocations are that size. The original
  // parameters keep their param_dtype size (what their views and gradients are).
  // (Accelerate's upcast: the model is built in bf16 = param_dtype, nothing to resize.)
  if (compute_elem_ != load_elem_) {
    for (MemoryEvent& e : program.events) {
      if (e.type != EventType::alloc || e.kind != TensorKind::parameter) continue;
      e.bytes = e.bytes / compute_elem_ * load_elem_;
      program.tensors[e.tensor].bytes = e.bytes;
    }
  }
  if (compute_elem_ != elem_)
    for (graph::Parameter& p : rt.parameters()) p.elem = static_cast<uint8_t>(compute_elem_);
  // fsdp_init cpu: the model was built off the GPU; FSDP(device_id=...) moves each unit
  // to the GPU just before flattening it. The parameters' GPU allocations, emitted by
  // the model's construction, move from there to their unit's wrap (setup events only:
  // each allocation stays before its free).
  std::vector<std::vector<MemoryEvent>> moved(units_.size());
  if (s.parallel.fsdp_init_on_cpu) {
    std::unordered_map<uint32_t, size_t> unit_of_storage;
    for (size_t i = 0; i < unit_of_param_.size(); ++i)
      unit_of_storage[rt.parameters()[i].storage] = unit_of_param_[i];
    std::vector<MemoryEvent> kept;
    kept.reserve(program.events.size());
    for (const MemoryEvent& e : program.events) {
      if (e.type == EventType::alloc && e.kind == TensorKind::parameter) {
        const auto it = unit_of_storage.find(e.tensor);
        moved[it != unit_of_storage.end() ? it->second : unit_of_layer(e.layer)].push_back(e);
      } else {
        kept.push_back(e);
      }
    }
    program.events.swap(kept);
  }
  // sync_module_states: each unit's buffers (the model's live non-parameter allocations of
  // its construction: the rotary inv_freq buffers), by the layer they were built in; the
  // root takes the rest (module.buffers() minus those already synced).
  std::vector<std::vector<uint64_t>> buffer_bytes(units_.size());
  if (s.parallel.fsdp_sync_module_states) {
    std::vector<std::pair<uint32_t, int32_t>> allocs;  // (tensor, layer) in allocation order
    std::unordered_map<uint32_t, bool> freed;
    for (const MemoryEvent& e : program.events) {
      if (e.type == EventType::alloc && e.kind == TensorKind::other) allocs.emplace_back(e.tensor, e.layer);
      if (e.type == EventType::free) freed[e.tensor] = true;
    }
    for (const auto& [tensor, layer] : allocs) {
      if (freed.count(tensor) != 0) continue;
      const size_t u = layer >= 0 && static_cast<size_t>(layer) < blocks_ ? unit_of_layer(layer) : 0;
      buffer_bytes[u].push_back(program.tensors[tensor].bytes);
    }
  }
  // Wrap: inner units first (auto_wrap_policy wraps children before the root).
  const graph::OpContext saved = rt.ctx;
  rt.ctx.phase = Phase::setup;
  rt.ctx.module = graph::Module::none;
  const uint32_t wrap_op = program.intern("FSDP flatten");
  const uint32_t offload_op = program.intern("FSDP flat_param_to(cpu)");
  for (const size_t u : wrap_order_) {
    Unit& unit = units_[u];
    rt.ctx.layer = unit.layer;
    for (const MemoryEvent& e : moved[u]) program.events.push_back(e);  // unit.to(device)
    if (s.parallel.fsdp_sync_module_states) {  // broadcast from rank 0 (fsdp_sync_states.h)
      std::vector<uint64_t> states = buffer_bytes[u];  // buffers first, then parameters
      // Dtype keys (bytes per element): the buffers are fp32 rotary tables
      // (require_sync_module_states_modelled), the parameters as loaded.
      std::vector<int> dtypes(states.size(), 4);
      for (int32_t p : unit.params) {
        states.push_back(rt.parameters()[p].bytes / compute_elem_ * load_elem_);
        dtypes.push_back(static_cast<int>(load_elem_));
      }
      std::deque<Tensor> flats;
      for (const int64_t ev : sync_broadcast_events(states, kFsdpSyncBucketBytes, dtypes)) {
        if (ev > 0) {
          flats.push_back(named(rt, rt.alloc(static_cast<uint64_t>(ev), TensorKind::temporary, OpKind::other),
                                u, "sync_module_states broadcast bucket"));
        } else {
          flats.front().reset();
          flats.pop_front();
        }
      }
    }
    std::vector<uint64_t> numel;
    numel.reserve(unit.params.size());
    for (int32_t p : unit.params) numel.push_back(rt.parameters()[p].bytes / compute_elem_);
    const FlatLayout layout = flat_layout(numel, aligned_numel_, d_);
    unit.padded_numel = layout.padded_numel;
    unit.padded_bytes = unit.padded_numel * elem_;
    unit.padding = layout.padding;
    Tensor flat = named(rt, rt.alloc(unit.padded_numel * load_elem_, TensorKind::parameter, OpKind::other), u,
                        "FlatParameter (wrap)");
    // The original parameters become views of the flat parameter: their storages go.
    // (The Runtime's module reference stays, so they are never freed a second time.)
    for (int32_t p : unit.params)
      program.free(rt.parameters()[p].storage, Phase::setup, wrap_op, rt.ctx.layer);
    // What the optimizer steps: its Adam state is named after it ("exp_avg of FSDP
    // flat_param shard of block 7").
    unit.shard = rt.add_parameter(unit.padded_numel / d_ * load_elem_,
                                  rt.program().str(unit_name(rt, u, "FSDP flat_param shard")));
    // use_orig_params: where each original parameter lies in the flat parameter, for the
    // views the optimizer steps (add_views).
    for (size_t k = 0; k < unit.params.size(); ++k)
      offset_of_param_[static_cast<size_t>(unit.params[k])] = layout.params[k];
    flat.reset();
    // cpu_offload: handle.flat_param_to(cpu) after shard(): the GPU shard goes (the
    // Runtime's parameter entry stays, its storage is never freed a second time).
    if (offload_)
      program.free(rt.parameters()[unit.shard].storage, Phase::setup, offload_op, rt.ctx.layer);
  }
  if (elem_ != load_elem_) upcast_shards(rt);  // Accelerate's prepare_model, after FSDP(...)
  rt.ctx = saved;
  unit_of_param_.resize(rt.parameters().size(), 0);  // shards: never get autograd grads
  if (orig_params_) add_views(rt);  // of the (upcast) shards the optimizer steps
  unit_of_param_.resize(rt.parameters().size(), 0);  // views: never used by the graph
  stamp_.resize(rt.parameters().size(), 0);
  rt.hooks = this;
  rt.param_hooks = peft_wrap_;
}

void Fsdp::upcast_shards(Runtime& rt) {
  // accelerate @16cb6eb8 accelerator.py prepare_model: for module in FSDP.fsdp_modules(model)
  // (torch/distributed/fsdp/_traversal_utils.py _get_fsdp_states_with_modules: the
  // module.modules() order, the root first), `param.data = param.data.to(torch.float32)` on its
  // _flat_param (the bf16 shard): an fp32 copy allocated, the FlatParameter's data swapped
  // to it. The bf16 storage goes at once unless something else views it: with
  // use_orig_params=True the original parameters are 1-D views of it (pytorch/pytorch
  // @01caf79e torch/distributed/fsdp/_flat_param.py _use_sharded_views: `param.data =
  // flat_param[offset : offset + numel_in_shard]`), and they keep it until the unit's first
  // post-forward reshard re-points them at the fp32 shard (_use_sharded_flat_param ->
  // _use_sharded_views; the pre-unshard's _writeback_orig_params copies their values into
  // the fp32 shard in place first: no allocation). That includes the root, whose post-forward
  // reshard switches views without freeing the gathered parameters.
  Program& program = rt.program();
  const uint32_t op = program.intern("Accelerate upcast (param.data.to(float32))");
  for (const size_t u : module_order_) {
    Unit& unit = units_[u];
    if (!unit.requires_grad) continue;  // Accelerate upcasts only flat params requiring grad
    rt.ctx.layer = unit.layer;
    graph::Parameter& shard = rt.parameters()[unit.shard];
    const uint32_t loaded = shard.storage;
    const uint32_t fp32 = rt.alloc_raw(unit.padded_bytes / d_, TensorKind::parameter, OpKind::other);
    program.tensors[fp32].name = program.tensors[loaded].name;  // the parameter's name
    program.tensors[fp32].module = program.tensors[loaded].module;
    shard.storage = fp32;
    shard.bytes = unit.padded_bytes / d_;
    if (orig_params_) {
      unit.loaded_shard = loaded;  // freed by drop_loaded_shard at the unit's post-forward
      program.tensors[loaded].name = unit_name(rt, u, "FSDP bf16 shard viewed by the original parameters");
    } else {
      program.free(loaded, Phase::setup, op, rt.ctx.layer);
    }
  }
}

void Fsdp::drop_loaded_shard(Runtime& rt, size_t u) {
  Unit& unit = units_[u];
  if (unit.loaded_shard == graph::kNoStorage) return;
  rt.program().free(unit.loaded_shard, rt.ctx.phase,
                    rt.program().intern("FSDP _use_sharded_views (post-forward)"), rt.ctx.layer);
  unit.loaded_shard = graph::kNoStorage;
}

void Fsdp::post_forward(Runtime& rt) { drop_loaded_shard(rt, 0); }

void Fsdp::assign_units(Runtime& rt, const Scenario& s) {
  // Which layer each parameter was created in: the auto-wrap units (sim/parallel/wrap_units.h).
  const ParameterLayers wrap = parameter_layers(rt.program());
  const size_t blocks = static_cast<size_t>(wrap.layers);
  blocks_ = blocks;
  units_.resize(1 + blocks);
  for (size_t u = 1; u < units_.size(); ++u) units_[u].layer = static_cast<int32_t>(u - 1);
  const size_t n = rt.parameters().size();
  unit_of_param_.resize(n);
  stamp_.assign(n, 0);
  trainable_.resize(n);
  offset_of_param_.assign(n, FlatSegment{});
  // With LoRA the flatten order is PEFT's module order (each adapter after its base
  // layer's weight); memsim registers the adapters after every base parameter.
  const bool lora = s.lora.rank > 0;
  std::vector<int32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
  if (lora) {
    std::vector<std::string> names;
    names.reserve(n);
    for (size_t i = 0; i < n; ++i) names.push_back(rt.param_name(static_cast<int32_t>(i)));
    order = peft_flatten_order(order, names);
  }
  module_param_order_ = order;
  std::vector<std::vector<size_t>> adapters(blocks);  // peft: adapter units per block
  for (const int32_t id : order) {
    const size_t i = static_cast<size_t>(id);
    const int32_t layer = wrap.layer_of_storage.at(rt.parameters()[i].storage);
    trainable_[i] = !rt.parameters()[i].frozen;
    size_t u = unit_of_layer(layer);
    // PEFT's lambda_policy_fn: a leaf module whose weight requires grad is its own unit
    // (with LoRA: exactly the lora_A / lora_B Linears, one weight each).
    if (peft_wrap_ && layer >= 0 && trainable_[i]) {
      u = units_.size();
      units_.emplace_back();
      units_[u].layer = layer;
      units_[u].adapter = true;
      adapters[static_cast<size_t>(layer)].push_back(u);
    }
    unit_of_param_[i] = u;
    units_[u].params.push_back(id);
  }
  if (!lora) {
    // Registration order, as before (the frees of the original storages at wrap time).
    for (Unit& unit : units_) std::sort(unit.params.begin(), unit.params.end());
  }
  // FlatParameter.requires_grad = any of its parameters'. A unit that mixes frozen and
  // trainable parameters (fsdp_wrap block with LoRA) makes every weight a view of a
  // parameter that requires grad: autograd computes all their gradients.
  for (Unit& unit : units_) {
    bool any = false;
    for (int32_t p : unit.params) any = any || trainable_[static_cast<size_t>(p)];
    unit.requires_grad = any;
    if (any)
      for (int32_t p : unit.params) rt.parameters()[static_cast<size_t>(p)].frozen = false;
  }
  // Wrapping order (post-order: a block's adapters, then the block; the root last),
  // module pre-order (root, then each block followed by its adapters) and, for the
  // prefetches, post-forward order (each block's adapters, then the block; root last).
  for (size_t l = 0; l < blocks; ++l) {
    for (size_t a : adapters[l]) wrap_order_.push_back(a);
    wrap_order_.push_back(1 + l);
  }
  wrap_order_.push_back(0);
  post_forward_order_ = wrap_order_;
  module_order_.push_back(0);
  for (size_t l = 0; l < blocks; ++l) {
    module_order_.push_back(1 + l);
    for (size_t a : adapters[l]) module_order_.push_back(a);
  }
  order_pos_.assign(units_.size(), 0);
  for (size_t k = 0; k < post_forward_order_.size(); ++k) order_pos_[post_forward_order_[k]] = k;
}

void Fsdp::add_views(Runtime& rt) {
  // _use_sharded_views: each original parameter is a 1-D view of its part of rank 0's
  // shard; the optimizer (built over the parameters that require grad, in module order)
  // keeps state only for views with elements (_use_sharded_grad_views gives the others
  // no .grad, so torch.optim skips them).
  for (const int32_t id : module_param_order_) {
    const size_t i = static_cast<size_t>(id);
    if (!trainable_[i]) continue;
    Unit& unit = units_[unit_of_param_[i]];
    const uint64_t local = local_numel(offset_of_param_[i], unit.padded_numel / d_, 0);
    if (local == 0) continue;
    graph::Parameter v;
    v.storage = rt.parameters()[unit.shard].storage;
    v.bytes = local * elem_;
    v.elem = static_cast<uint8_t>(elem_);
    v.frozen = false;  // requires_grad=True (never read by the graph: no op takes it)
    rt.retain(v.storage);
    unit.views.push_back(static_cast<int32_t>(rt.parameters().size()));
    rt.parameters().push_back(v);
  }
}

std::vector<int32_t> Fsdp::clip_order() const {
  std::vector<int32_t> ids;
  for (const size_t u : module_order_) {
    const Unit& unit = units_[u];
    if (orig_params_)
      ids.insert(ids.end(), unit.views.begin(), unit.views.end());
    else if (unit.shard >= 0)
      ids.push_back(unit.shard);
  }
  return ids;
}

Fsdp::~Fsdp() {
  if (rt_->hooks == this) rt_->hooks = nullptr;
}

// "<what> of block 7" (the unit wrapping layer 7) / "<what> of the root" (unit 0: the
// embedding, final norm and head) / "<what> of model.layers.7.self_attn.q_proj.lora_A.
// default.weight" (an adapter's own unit), for the names in the reports
// (program/tensor_names.h).
uint32_t Fsdp::unit_name(Runtime& rt, size_t u, const char* what) const {
  const Unit& unit = units_[u];
  if (unit.adapter) return rt.program().intern(std::string(what) + " of " + rt.param_name(unit.params[0]));
  return rt.program().intern(std::string(what) +
                             (u == 0 ? " of the root" : " of block " + std::to_string(unit.layer)));
}

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
  // use_orig_params: the padding segments are outputs of the split too; having no
  // gradient, split_with_sizes_backward fills each with zeros before the cat.
  const uint64_t shard_numel = unit.padded_numel / d_;
  std::vector<Tensor> zeros;
  zeros.reserve(unit.padding.size());
  for (const FlatSegment& pad : unit.padding)
    zeros.push_back(named(rt, rt.alloc(pad.numel * compute_elem_, TensorKind::temporary, OpKind::other),
                          u, "FSDP padding grad (zeros)"));
  Tensor flat = named(rt, rt.alloc(unit.padded_numel * compute_elem_, TensorKind::gradient,
                                   OpKind::other),
                      u, "FlatParameter.grad (unsharded)");
  zeros.clear();
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
  if (orig_params_) {  // flat_param.grad; the optimizer's views get .grad views of it
    if (unit.flat_grad == graph::kNoStorage)
      unit.flat_grad = shard_grad;
    else
      rt.release(shard_grad);  // _saved_grad_shard += new_sharded_grad
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
  for (Unit& unit : units_) unit.pre_backward_ran = false;
  forward_unit_ = 0;
  backward_started_ = false;
  fwd_adapter_ = kNone;
  bwd_block_ = 0;
  if (iteration_ == 1) lazy_init(rt);
  // _root_pre_forward -> _clear_grads_if_needed (use_orig_params): flat_param.grad is
  // dropped once every original parameter's .grad is None (zero_grad(set_to_none=True)).
  for (Unit& unit : units_) {
    if (unit.flat_grad == graph::kNoStorage) continue;
    bool all_none = true;
    for (int32_t v : unit.views) all_none = all_none && rt.parameters()[v].grad == graph::kNoStorage;
    if (!all_none) continue;
    rt.release(unit.flat_grad);
    unit.flat_grad = graph::kNoStorage;
  }
  gather(rt, 0);
}

void Fsdp::lazy_init(Runtime& rt) {
  // _lazy_init -> init_flat_param_attributes, the root's handle first, then the others in
  // module order: each unsharded buffer the handle will gather into is created with
  // torch.zeros on the GPU and its storage freed at once (_free_storage), so that later
  // all-gathers only resize it; MixedPrecision also creates and frees _mp_shard and the
  // full-precision padded buffer. Transient, but they pass through the caching allocator.
  const uint32_t name = rt.program().intern("FSDP lazy init (zeros, storage freed at once)");
  for (const size_t u : module_order_) {
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
  if (u > blocks_) return;  // a layer without parameters (adapter units follow the blocks)
  if (rt.ctx.phase == Phase::forward && !rt.recomputing) {
    if (units_[u].forward_done) return;  // an op of a finished layer: no hook fires
    if (forward_unit_ != 0 && forward_unit_ != u) {
      reshard_forward_adapter(rt);  // peft: an adapter's post-forward comes first
      drop_loaded_shard(rt, forward_unit_);  // _use_sharded_views, before the free
      if (reshard_after_forward_) reshard(rt, forward_unit_);  // post-forward
      units_[forward_unit_].forward_done = true;
    }
    if (u != 0) gather(rt, u);  // pre-forward
    forward_unit_ = u;
  } else if (rt.ctx.phase == Phase::backward || rt.recomputing) {
    // The root's pre-backward hook is on every forward output that requires grad
    // (_register_pre_backward_hooks); when the model computed the loss in its forward
    // (sim/step/loss_placement.h) the loss is one, and autograd reaches it first.
    if (!backward_started_ &&
        (rt.ctx.module == graph::Module::head ||
         (loss_in_forward_ && rt.ctx.module == graph::Module::loss)))
      root_pre_backward(rt);
    if (peft_wrap_) {
      // The reshard-only hook of a frozen block (registered on its inputs): its input's
      // gradient is complete once the backward allocates in another layer.
      if (bwd_block_ != 0 && bwd_block_ != u && !units_[bwd_block_].requires_grad &&
          !units_[bwd_block_].backward_done) {
        reshard(rt, bwd_block_);
        units_[bwd_block_].backward_done = true;
      }
      if (u == 0 || units_[u].backward_done) return;
      bwd_block_ = u;
      pre_backward_peft(rt, u);
      return;
    }
    if (u == 0 || units_[u].backward_done) return;
    gather(rt, u);  // pre-backward
    if (prefetch_ && u > 1 && !units_[u - 1].backward_done) gather(rt, u - 1);  // BACKWARD_PRE
  }
}

void Fsdp::pre_backward_peft(Runtime& rt, size_t u) {
  // _pre_backward_hook: unshard (if not prefetched), then prefetch the unit before this
  // one in post-forward order (BACKWARD_PRE), once per backward.
  Unit& unit = units_[u];
  if (unit.pre_backward_ran) return;
  unit.pre_backward_ran = true;
  gather(rt, u);
  const size_t k = order_pos_[u];
  if (k == 0 || !prefetch_) return;
  const size_t prev = post_forward_order_[k - 1];
  if (prev != 0 && !units_[prev].backward_done) gather(rt, prev);
}

void Fsdp::param_used(Runtime& rt, int32_t param, bool backward) {
  const size_t u = unit_of_param_[static_cast<size_t>(param)];
  if (!units_[u].adapter) return;
  if (backward) {
    if (!units_[u].backward_done) pre_backward_peft(rt, u);
    return;
  }
  if (rt.recomputing) {  // a checkpoint's re-run: kept until the post-backward
    gather(rt, u);
    return;
  }
  if (rt.ctx.phase != Phase::forward || units_[u].forward_done) return;
  reshard_forward_adapter(rt);
  gather(rt, u);  // the adapter's pre-forward
  fwd_adapter_ = u;
  rt.hook_countdown = 2;  // its output's allocation, then the post-forward
}

void Fsdp::countdown_done(Runtime& rt) { reshard_forward_adapter(rt); }

void Fsdp::reshard_forward_adapter(Runtime& rt) {
  if (fwd_adapter_ == kNone) return;
  if (reshard_after_forward_) reshard(rt, fwd_adapter_);  // the adapter's post-forward
  units_[fwd_adapter_].forward_done = true;
  fwd_adapter_ = kNone;
}

void Fsdp::root_pre_backward(Runtime& rt) {
  // The root's pre-backward hook (on its output, the logits): prefetch the last layer
  // (BACKWARD_PRE; with no_prefetch the root's unshard is a no-op, nothing is gathered).
  backward_started_ = true;
  reshard_forward_adapter(rt);
  if (!prefetch_) return;
  if (peft_wrap_) {  // the unit before the root in post-forward order: the last block
    if (post_forward_order_.size() > 1) gather(rt, post_forward_order_[post_forward_order_.size() - 2]);
    return;
  }
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
    // use_orig_params (_use_sharded_grad_views): each view's .grad is a view of
    // flat_param.grad.
    if (units_[u].flat_grad == graph::kNoStorage) continue;
    for (int32_t v : units_[u].views) {
      graph::Parameter& view = rt.parameters()[v];
      if (view.grad != graph::kNoStorage) continue;
      view.grad = units_[u].flat_grad;
      rt.retain(view.grad);
    }
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
