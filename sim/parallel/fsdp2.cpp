#include "sim/parallel/fsdp2.h"

#include <string>
#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "graph/ops/float8_cast.h"
#include "scenario/fsdp_precision.h"
#include "scenario/peft_input_grads_key.h"
#include "sim/parallel/fsdp2_layout.h"
#include "sim/parallel/wrap_units.h"
#include "sim/step/loss_placement.h"

namespace memsim {

using graph::kNoStorage;
using graph::OpKind;
using graph::Runtime;

namespace {
// The modules a layout can shard apart from the blocks, by parameter name: torchtitan's /
// torchtune's (graph/models/decoder_impl.cpp) and transformers' (graph/models/decoder.cpp).
bool starts_with(const std::string& name, const char* prefix) { return name.rfind(prefix, 0) == 0; }
bool is_embedding(const std::string& n) {
  return starts_with(n, "tok_embeddings.") || starts_with(n, "model.embed_tokens.");
}
bool is_output(const std::string& n) { return starts_with(n, "output.") || starts_with(n, "lm_head."); }
bool is_final_norm(const std::string& n) { return starts_with(n, "norm.") || starts_with(n, "model.norm."); }

// torch.promote_types over the floating dtypes memsim knows: equal stays, fp32 wins, and
// bf16 with fp16 promotes to fp32.
DType promote(DType a, DType b) { return a == b ? a : DType::fp32; }
}  // namespace

Fsdp2::Fsdp2(Runtime& rt, const Scenario& s) : rt_(&rt) {
  const ParallelConfig& pc = s.parallel;
  // With context parallelism torchtitan shards over the flattened dp_shard x cp mesh.
  ws_ = static_cast<uint64_t>(pc.data / pc.replicate * pc.context);
  post_ws_ = static_cast<uint64_t>(pc.reshard_after_forward_ranks);
  reshard_after_forward_ = pc.reshard_after_forward;
  offload_ = pc.cpu_offload;
  meta_init_ = pc.fsdp_init_on_cpu;
  hsdp_ = pc.replicate > 1;
  loss_in_forward_ = loss_in_model_forward(s);
  const Fsdp2Layout layout = fsdp2_layout(s);
  root_reshards_ = layout.root_reshards;
  tune_load_ = layout.torchtune_load;
  lora_to_empty_ = layout.lora_to_empty;
  norm_with_output_ = layout.norm_with_output;
  output_keeps_ = layout.output_keeps_after_forward;
  norm_with_emb_ = layout.norm_with_embedding;
  emb_keeps_ = layout.embedding_keeps_after_forward;
  if (tune_load_) meta_init_ = true;  // torchtune builds on the meta device
  hf_names_ = s.model.arch.impl == graph::ModelImpl::hf;
  const DType orig_dtype = s.precision.params;
  const uint64_t elem = static_cast<uint64_t>(dtype_bytes(orig_dtype));
  const uint64_t compute_elem = model_compute_elem(s);  // param_dtype (or precision.params)
  mixed_precision_ = pc.fsdp_mixed_precision.has_value() && *pc.fsdp_mixed_precision != orig_dtype;

  Program& program = rt.program();
  n_flat_in_ = program.intern("FSDP2 all-gather input (flat_foreach_copy_input, param_dtype)");
  n_offload_in_ = program.intern("FSDP2 all-gather input (CPU shard .to(device))");
  n_ag_out_ = program.intern("FSDP2 all-gather output (flat)");
  n_rs_in_ = program.intern("FSDP2 reduce-scatter input (chunk_cat)");
  n_rs_cast_ = program.intern("FSDP2 reduce-scatter grad buffer (narrowing cast)");
  n_rs_out_ = program.intern("FSDP2 reduce-scatter output");
  n_grad_cast_ = program.intern("FSDP2 sharded grad (cast to the param dtype)");
  n_f8_in_ = program.intern("FSDP2 float8 all-gather input (fsdp_pre_all_gather e4m3 shard)");
  n_f8_scale_ = program.intern("FSDP2 float8 weight scale (fsdp_pre_all_gather)");
  n_f8_op_ = program.intern("fsdp_pre_all_gather");
  n_f8_pre_op_ = program.intern("precompute_float8_dynamic_scale_for_fsdp");
  n_f8_vector_ = program.intern("FSDP2 float8 precomputed scales (precompute_float8_dynamic_scale_for_fsdp)");

  // Which layer each parameter was created in: the fully_shard groups (sim/parallel/wrap_units.h).
  const ParameterLayers wrap = parameter_layers(program);
  blocks_ = static_cast<size_t>(wrap.layers);
  size_t n_groups = 1 + blocks_;
  if (layout.separate_embedding) emb_group_ = n_groups++;
  if (layout.separate_output) out_group_ = n_groups++;
  groups_.resize(n_groups);
  groups_[0].post_backward_in_callback = true;  // the root's inputs need no grad
  if (emb_group_ != 0) groups_[emb_group_].post_backward_in_callback = true;  // token ids
  if (out_group_ != 0) groups_[out_group_].per_call = layout.output_per_call;
  // _state_ctx.all_states: the root, then the others in modules() order.
  state_order_.push_back(0);
  if (emb_group_ != 0) state_order_.push_back(emb_group_);
  for (size_t b = 1; b <= blocks_; ++b) state_order_.push_back(b);
  if (out_group_ != 0) state_order_.push_back(out_group_);
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].all_gather_name = program.intern("FSDP2 all-gather output (flat) of " + group_label(g));
    groups_[g].reduce_scatter_name = program.intern("FSDP2 reduce-scatter input (chunk_cat) of " + group_label(g));
  }
  const size_t n = rt.parameters().size();
  param_of_orig_.assign(n, -1);
  stamp_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const graph::Parameter& orig = rt.parameters()[i];
    Param p;
    p.orig = static_cast<int32_t>(i);
    p.trainable = !orig.frozen;
    // Element bytes: adapters carry their own (lora.adapter_dtype); everything else is
    // precision.params, and the graph was built in param_dtype under mixed precision.
    const uint64_t built_elem = orig.elem != 0 ? orig.elem : compute_elem;
    p.elem = orig.elem != 0 ? orig.elem : elem;
    p.unsharded_elem = mixed_precision_ ? compute_elem : p.elem;
    const uint64_t numel = orig.bytes / built_elem;
    const uint64_t rows = orig.rows != 0 ? orig.rows : numel;  // a vector: dim 0 = numel
    const uint64_t cols = numel / rows;
    p.shard_numel = (rows + ws_ - 1) / ws_ * cols;  // torch.chunk: chunk 0 is the largest
    p.full_numel = p.shard_numel * ws_;
    size_t g = group_at(wrap.layer_of_storage.at(orig.storage), graph::Module::none);
    if (g == 0) {  // get_shard_conditions: the module's name in custom_sharded_layers
      const std::string& name = rt.param_name(p.orig);
      if (emb_group_ != 0 && is_embedding(name)) g = emb_group_;
      if (out_group_ != 0 && is_output(name)) {
        g = out_group_;
        out_param_ = static_cast<int32_t>(i);
      }
      if (norm_with_output_ && is_final_norm(name)) g = out_group_;  // [norm, output]
      if (norm_with_emb_ && is_final_norm(name)) g = emb_group_;     // [norm, embed_tokens]
      if (layout.head_shares_embedding_shard && is_output(name)) head_param_ = static_cast<int32_t>(params_.size());
      if (layout.head_shares_embedding_shard && is_embedding(name)) emb_param_ = static_cast<int32_t>(params_.size());
    }
    p.group = g;
    groups_[g].params.push_back(params_.size());
    if (p.trainable) ++groups_[g].trainable;
    // Float8 all-gather: the Float8Linear weights are the blocks' matrices (the scenario
    // reader allows the bias-free llama row only; norms are vectors, rows 0).
    p.float8 = s.precision.float8_all_gather && g >= 1 && g <= blocks_ && orig.rows != 0;
    if (p.float8) ++n_float8_;
    param_of_orig_[i] = static_cast<int32_t>(params_.size());
    params_.push_back(p);
  }
  // fully_shard([final_norm, input_embed]): the group's parameters in the order of its
  // modules (_get_managed_modules), the norm's first.
  if (norm_with_emb_)
    std::stable_partition(groups_[emb_group_].params.begin(), groups_[emb_group_].params.end(),
                          [&](size_t i) { return is_final_norm(rt.param_name(params_[i].orig)); });
  if (layout.head_shares_embedding_shard && (head_param_ < 0 || emb_param_ < 0 || !meta_init_))
    throw std::logic_error("FSDP2 layout: a shared lm_head shard needs lm_head, the embedding "
                           "and the meta-device build (fsdp2_checks.cpp)");
  // A layout's separate groups must have found their modules (the names above).
  for (size_t g : {emb_group_, out_group_})
    if (g != 0 && groups_[g].params.empty())
      throw std::logic_error("FSDP2 layout: no parameter named for " + group_label(g));
  // Block 0's input is the embedding's output: it requires grad only when an embedding
  // parameter is trainable (full fine-tuning; not under LoRA) or PEFT's
  // enable_input_require_grads hook makes it (graph/models/decoder.cpp requires_grad_),
  // else block 0 registers no RegisterPostBackwardFunction. An embedding parameter was
  // created in Module::embedding (torchtune's tok_embeddings also by name).
  first_input_grad_ = lora_input_require_grads(s);
  for (const Param& p : params_) {
    if (!p.trainable) continue;
    const uint32_t storage = rt.parameters()[p.orig].storage;
    if (static_cast<graph::Module>(program.tensors[storage].module) == graph::Module::embedding ||
        rt.param_name(p.orig).rfind("tok_embeddings.", 0) == 0)
      first_input_grad_ = true;
  }
  if (s.precision.float8_all_gather && n_float8_ == 0)
    throw std::logic_error("FSDP2 float8 all-gather: the blocks have no matrices to convert");
  precompute_scale_ = s.precision.float8_precompute_scale;
  // The module was built in param_dtype (the unsharded parameters it computes with) but
  // lives in precision.params until fully_shard: its construction allocations are that size.
  if (mixed_precision_) {
    for (MemoryEvent& e : program.events) {
      if (e.type != EventType::alloc || e.kind != TensorKind::parameter) continue;
      e.bytes = e.bytes / compute_elem * elem;
      program.tensors[e.tensor].bytes = e.bytes;
    }
  }
  // Meta-device init: the originals never had storage (zero-byte allocations, which the
  // allocator never sees).
  if (meta_init_) {
    for (MemoryEvent& e : program.events) {
      if (e.type != EventType::alloc || e.kind != TensorKind::parameter) continue;
      e.bytes = 0;
      program.tensors[e.tensor].bytes = 0;
    }
  }

  const graph::OpContext saved = rt.ctx;
  rt.ctx.phase = Phase::setup;
  rt.ctx.module = graph::Module::none;
  std::vector<uint32_t> shard_storage(params_.size(), kNoStorage);
  // Each parameter's FSDP2 tensors are named after it (the optimizer's state after the
  // shard: "exp_avg of FSDP2 shard of P (padded chunk 0)").
  for (Param& p : params_) {
    const std::string name = rt.param_name(p.orig);  // a copy: intern() may move the table
    p.shard_name = program.intern("FSDP2 shard of " + name + " (padded chunk 0)");
    p.unsharded_name = program.intern("FSDP2 unsharded " + name + " (all_gather_outputs)");
    p.post_forward_name = program.intern("FSDP2 post-forward shard of " + name + " (reshard_after_forward N)");
  }
  if (meta_init_) {
    // model.to_empty(device): the sharded parameters in module order. torchtune:
    // load_from_full_model_state_dict, in state-dict (module) order: the full tensor on the
    // GPU, rank 0's chunk (distribute_tensor's scatter output; the shard group divides every
    // dim 0, scenario/torchtune_keys.cpp), the full copy dropped.
    const uint32_t full_name = program.intern(
        "torchtune full state-dict tensor (load_from_full_model_state_dict)");
    // lora_finetune_distributed _setup_model (recipes/lora_finetune_distributed.py @a6290a5b
    // lines 495-516): after shard_model, every LoRALinear's to_empty(lora_device) and
    // initialize_parameters() (in place) give the adapters their shards (on the CPU with
    // fsdp_cpu_offload); the base state dict is loaded afterwards and holds no adapter.
    if (lora_to_empty_) {
      for (size_t i = 0; i < params_.size(); ++i) {
        if (!params_[i].trainable) continue;
        rt.ctx.layer = -1;
        shard_storage[i] = alloc(rt, offload_ ? 0 : params_[i].shard_numel * params_[i].elem,
                                 TensorKind::parameter, 0, params_[i].shard_name);
      }
    }
    // Accelerate's tied lm_head: fsdp2_load_full_state_dict distributes the state dict's
    // "lm_head.weight" entry too (a shard of its own, which load_state_dict(assign=True)
    // makes lm_head's parameter) until model.tie_weights() makes lm_head's parameter the
    // embedding's again when the load returns; FSDPParam.reset_sharded_param (lazy_init)
    // then takes the embedding's shard for the root's parameter.
    uint32_t loaded_head = kNoStorage;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (shard_storage[i] != kNoStorage) continue;  // an adapter (above)
      rt.ctx.layer = -1;
      if (static_cast<int32_t>(i) == head_param_) {
        loaded_head = alloc(rt, params_[i].shard_numel * params_[i].elem, TensorKind::parameter, 0,
                            params_[i].shard_name);
        continue;
      }
      uint32_t full = kNoStorage;
      if (tune_load_) {
        full = alloc(rt, params_[i].full_numel * params_[i].elem, TensorKind::parameter, 0, full_name);
        // fsdp_cpu_offload: sharded_tensor.cpu(); the GPU chunk dies when the name is rebound.
        if (offload_)
          rt.release(alloc(rt, params_[i].shard_numel * params_[i].elem, TensorKind::parameter, 0,
                           params_[i].shard_name));
      }
      shard_storage[i] = alloc(rt, offload_ ? 0 : params_[i].shard_numel * params_[i].elem,
                               TensorKind::parameter, 0, params_[i].shard_name);
      if (full != kNoStorage) rt.release(full);
    }
    if (head_param_ >= 0) {
      shard_storage[static_cast<size_t>(head_param_)] = shard_storage[static_cast<size_t>(emb_param_)];
      rt.release(loaded_head);
    }
  } else {
    // fully_shard(block) for each block, then fully_shard(model).
    const uint32_t wrap_op = program.intern("FSDP2 fully_shard");
    for (size_t k = 1; k <= groups_.size(); ++k) {
      const size_t g = k % groups_.size();
      rt.ctx.layer = g == 0 ? -1 : static_cast<int32_t>(g - 1);
      for (size_t i : groups_[g].params) {
        shard_storage[i] = alloc(rt, params_[i].shard_numel * params_[i].elem,
                                 TensorKind::parameter, 0, params_[i].shard_name);
        // CPUOffloadPolicy: padded_sharded_param.cpu(); the GPU copy goes at once.
        if (offload_) rt.release(shard_storage[i]);
      }
      // fully_shard returns: its list of the original parameters was their last owner.
      // (The Runtime's module reference stays, so they are never freed a second time.)
      for (size_t i : groups_[g].params)
        program.free(rt.parameters()[params_[i].orig].storage, Phase::setup, wrap_op, rt.ctx.layer);
    }
  }
  rt.ctx = saved;
  // The optimizer sees the sharded parameters, in module order.
  for (size_t i = 0; i < params_.size(); ++i) {
    const graph::Parameter& orig = rt.parameters()[params_[i].orig];
    graph::Parameter shard;
    shard.storage = shard_storage[i];
    shard.bytes = params_[i].shard_numel * params_[i].elem;
    shard.frozen = orig.frozen;
    shard.elem = orig.elem;
    shard.rows = orig.rows != 0 ? (orig.rows + ws_ - 1) / ws_ : 0;
    params_[i].shard = static_cast<int32_t>(rt.parameters().size());
    rt.parameters().push_back(shard);
  }
  // Reduce dtypes: MixedPrecisionPolicy(param_dtype, reduce_dtype); a reduce_dtype equal
  // to param_dtype is None (init_dtype_attrs), None reduces in the gradients' dtype.
  grad_dtype_ = mixed_precision_ ? *pc.fsdp_mixed_precision : orig_dtype;
  if (s.lora.rank > 0) grad_dtype_ = s.lora.adapter_dtype;  // the trainable parameters'
  orig_grad_dtype_ = s.lora.rank > 0 ? s.lora.adapter_dtype : orig_dtype;
  reduce_dtype_ = pc.reduce_dtype.value_or(grad_dtype_);
  rt.hooks = this;
  // The output's calls are seen where its weight is read (Runtime::param) and where a
  // backward node computes its gradient.
  if (out_group_ != 0 && groups_[out_group_].per_call) rt.param_hooks = true;
}

Fsdp2::~Fsdp2() {
  if (rt_->hooks == this) rt_->hooks = nullptr;
}

std::string Fsdp2::group_label(size_t g) const {
  if (g == 0) return "the root";
  if (g == emb_group_)
    return hf_names_ ? (norm_with_emb_ ? "[model.norm, model.embed_tokens]" : "model.embed_tokens")
                     : "tok_embeddings";
  // (Accelerate >= 1.14 on a PeftModel: the tail is lm_head alone, fsdp2_layout.h.)
  if (g == out_group_) return hf_names_ ? (norm_with_output_ ? "[model.norm, lm_head]" : "[lm_head]") : "output";
  return "block " + std::to_string(g - 1);
}

uint32_t Fsdp2::alloc(Runtime& rt, uint64_t bytes, TensorKind kind, uint8_t stream,
                      uint32_t name) {
  const uint32_t id = rt.alloc_raw(bytes, kind, OpKind::other);
  // alloc_raw's own event is the last one (hooks run before it): put it on `stream`.
  rt.program().events.back().stream = stream;
  rt.program().tensors[id].name = name;
  return id;
}

uint64_t Fsdp2::shard_bytes(size_t g) const {
  uint64_t b = 0;
  for (size_t i : groups_[g].params) b += params_[i].shard_numel * params_[i].elem;
  return b;
}

uint64_t Fsdp2::unsharded_bytes(size_t g) const {
  uint64_t b = 0;
  for (size_t i : groups_[g].params) b += params_[i].full_numel * gather_elem(params_[i]);
  return b;
}

template <class F>
void Fsdp2::on_stream(Runtime& rt, uint8_t stream, uint32_t op, F&& f) {
  Program& program = rt.program();
  program.hold();  // nothing is handed to a sink meanwhile: the tail stays editable
  const size_t first = program.events.size();
  f();
  for (size_t e = first; e < program.events.size(); ++e) {
    program.events[e].stream = stream;
    if (program.events[e].type == EventType::alloc || program.events[e].type == EventType::free)
      program.events[e].op = op;  // the reports' op: FSDP2's, not the Float8Linear's
  }
  program.unhold();
}

uint32_t Fsdp2::float8_pre_all_gather(Runtime& rt, Param& p) {
  // WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather on the shard (its dtype, e bytes).
  const uint64_t n = p.shard_numel;
  uint32_t data = kNoStorage, scale = kNoStorage;
  on_stream(rt, kAllGatherStream, n_f8_op_, [&] {
    if (precomputed_ != kNoStorage) {
      // hp_tensor_and_scale_to_float8(self._tensor, self._precomputed_scale): the scale is
      // local_scale_tensor[i], a view of the precomputed vector.
      scale = precomputed_;
      rt.retain(precomputed_);
    } else {
      // hp_tensor_to_float8_dynamic(..., reduce_amax=True): tensor_to_scale with the
      // amax all-reduce over the shard mesh, then the cast.
      scale = graph::float8_scale(rt, n, 1, false, TensorKind::parameter, p.elem, true);
      rt.program().tensors[scale].name = n_f8_scale_;
    }
    data = graph::float8_data(rt, n, TensorKind::parameter, p.elem);
    rt.program().tensors[data].name = n_f8_in_;
  });
  // _extensions_data.all_gather_metadata = (scale,): a metadata a never-copied-out
  // all-gather left (a prefetch dropped by finalize_backward) dies now.
  if (p.pending_scale != kNoStorage) rt.release(p.pending_scale);
  p.pending_scale = scale;
  return data;
}

void Fsdp2::unshard(Runtime& rt, size_t g) {
  Group& group = groups_[g];
  // A module whose fully_shard found no parameter (torchtitan's root) has no param group.
  if (group.params.empty()) return;
  if (group.all_gather != kNoStorage || group.state == State::unsharded) return;
  const bool post = group.state == State::post_forward;
  const uint64_t world = post ? post_ws_ : ws_;
  // _get_param_all_gather_inputs, on the copy-in stream.
  std::vector<uint32_t> inputs;
  uint64_t input_bytes = 0;
  if (offload_ && !post) {
    for (size_t i : group.params) {
      const Param& p = params_[i];
      const uint32_t copy = alloc(rt, p.shard_numel * p.elem, TensorKind::parameter,
                                  kAllGatherStream, n_offload_in_);
      uint32_t in = copy;
      if (mixed_precision_) {  // _to_dtype_if_needed: the e copy dies once cast
        in = alloc(rt, p.shard_numel * p.unsharded_elem, TensorKind::parameter,
                   kAllGatherStream, n_offload_in_);
        rt.release(copy);
      }
      inputs.push_back(in);
      input_bytes += p.shard_numel * p.unsharded_elem;
    }
  } else {
    // 1st pass: the float8 parameters' fsdp_pre_all_gather (never post-forward: refused).
    for (size_t i : group.params) {
      Param& p = params_[i];
      if (!p.float8) continue;
      inputs.push_back(float8_pre_all_gather(rt, p));
      input_bytes += p.shard_numel;  // e4m3: 1 byte per element
    }
    uint64_t copy_bytes = 0;  // the others' inputs
    for (size_t i : group.params) {
      const Param& p = params_[i];
      if (p.float8) continue;
      copy_bytes += post ? p.full_numel / post_ws_ * p.unsharded_elem
                         : p.shard_numel * p.unsharded_elem;
    }
    input_bytes += copy_bytes;
    // 2nd pass, use_foreach_copy (param_dtype set, no offload): one flat param_dtype buffer
    // of the others. With offload a post-forward slice is already param_dtype on the GPU:
    // no copy.
    if (mixed_precision_ && !offload_ && (copy_bytes != 0 || inputs.empty()))
      inputs.push_back(alloc(rt, copy_bytes, TensorKind::parameter, kAllGatherStream, n_flat_in_));
  }
  // Mixed dtypes (float8 and bf16) gather as uint8: the output is the inputs' bytes x ws.
  group.all_gather =
      alloc(rt, input_bytes * world, TensorKind::parameter, kAllGatherStream, n_ag_out_);
  rt.name(group.all_gather, group.all_gather_name);
  for (uint32_t in : inputs) rt.release(in);  // foreach_all_gather returns
}

void Fsdp2::wait_for_unshard(Runtime& rt, size_t g, bool forward) {
  Group& group = groups_[g];
  if (group.all_gather == kNoStorage) return;  // no preceding unshard
  // Forward: the previous group's all-gather output goes before this copy-out.
  if (forward && all_gather_state_ != kNoStorage) {
    rt.release(all_gather_state_);
    all_gather_state_ = kNoStorage;
  }
  // foreach_all_gather_copy_out: alloc_all_gather_outputs per parameter.
  for (size_t i : group.params) {
    Param& p = params_[i];
    p.unsharded = alloc(rt, p.full_numel * gather_elem(p), TensorKind::parameter, 0, p.unsharded_name);
  }
  // init_unsharded_param: fsdp_post_all_gather(out=) sets the unsharded Float8TrainingTensor's
  // _scale to this all-gather's (all_gather_metadata is cleared); the previous scale dies
  // unless a saved Float8TrainingTensor still holds it.
  for (size_t i : group.params) {
    Param& p = params_[i];
    if (!p.float8 || p.pending_scale == kNoStorage) continue;
    if (p.scale != kNoStorage) rt.release(p.scale);
    p.scale = p.pending_scale;
    p.pending_scale = kNoStorage;
    rt.parameters()[p.orig].float8_scale = p.scale;
  }
  // _to_unsharded: a post-forward shard is freed after the copy-out.
  for (size_t i : group.params) {
    Param& p = params_[i];
    if (p.post_forward != kNoStorage) rt.release(p.post_forward);
    p.post_forward = kNoStorage;
  }
  group.state = State::unsharded;
  if (forward) {
    all_gather_state_ = group.all_gather;  // freed by the next copy-out / root post-forward
  } else {
    rt.release(group.all_gather);
  }
  group.all_gather = kNoStorage;
}

void Fsdp2::reshard(Runtime& rt, size_t g) {
  Group& group = groups_[g];
  if (group.state != State::unsharded) return;
  for (size_t i : group.params) {  // free_unsharded_param: storage.resize_(0)
    Param& p = params_[i];
    rt.release(p.unsharded);
    p.unsharded = kNoStorage;
  }
  group.state = State::sharded;
}

void Fsdp2::reshard_after_forward(Runtime& rt, size_t g) {
  Group& group = groups_[g];
  if (!reshard_after_forward_ || group.state != State::unsharded) return;
  if (g == out_group_ && output_keeps_) return;  // torchtitan's [norm, output]
  if (g == emb_group_ && emb_keeps_) return;      // Accelerate's tied [norm, embed_tokens]
  if (post_ws_ == 0) return reshard(rt, g);
  // to_sharded_post_forward, per parameter: clone this rank's 1/N, then free the rest.
  for (size_t i : group.params) {
    Param& p = params_[i];
    p.post_forward = alloc(rt, p.full_numel / post_ws_ * p.unsharded_elem, TensorKind::parameter,
                           0, p.post_forward_name);
    rt.release(p.unsharded);
    p.unsharded = kNoStorage;
  }
  group.state = State::post_forward;
}

void Fsdp2::pre_forward(Runtime& rt) {
  ++iteration_;
  for (Group& group : groups_) {
    group.ready = 0;
    group.forward_done = false;
    group.pre_backward_done = false;
    group.backward_done = false;
  }
  forward_group_ = 0;
  backward_block_ = 0;
  backward_started_ = false;
  final_norm_ran_ = false;
  out_post_forward_pending_ = false;
  out_post_backward_pending_ = false;
  post_forward_order_.clear();
  for (Group& group : groups_) group.post_forward_indices.clear();
  unshard(rt, 0);
  wait_for_unshard(rt, 0, true);
}

void Fsdp2::group_post_forward(Runtime& rt, size_t g) {
  // FSDPParamGroup.post_forward: reshard (the root only when given reshard_after_forward
  // explicitly), then _record_post_forward.
  if (g != 0) {
    reshard_after_forward(rt, g);
  } else if (root_reshards_) {
    reshard(rt, 0);
  }
  groups_[g].post_forward_indices.push_back(post_forward_order_.size());
  post_forward_order_.push_back(g);
}

void Fsdp2::output_post_forward(Runtime& rt) {
  out_post_forward_pending_ = false;
  group_post_forward(rt, out_group_);
}

void Fsdp2::post_forward(Runtime& rt) {
  if (forward_group_ != 0) {
    group_post_forward(rt, forward_group_);
    groups_[forward_group_].forward_done = true;
    forward_group_ = 0;
  }
  if (out_post_forward_pending_) output_post_forward(rt);  // the last output call returned
  group_post_forward(rt, 0);  // the root's own
  // The root's post-forward flushes the last all-gather output.
  if (all_gather_state_ != kNoStorage) rt.release(all_gather_state_);
  all_gather_state_ = kNoStorage;
}

void Fsdp2::pre_backward(Runtime& rt, size_t g) {
  Group& group = groups_[g];
  if (group.pre_backward_done) return;
  group.pre_backward_done = true;
  if (group.per_call) group.backward_done = false;  // this call's post-backward is to come
  unshard(rt, g);  // a no-op when prefetched or never resharded
  wait_for_unshard(rt, g, false);
  // _backward_prefetch: the group that post-forwarded just before this group's last
  // recorded post-forward (popped: a group called k times prefetches k times). The
  // default layout's order is blocks 0..L-1, then the root.
  if (group.post_forward_indices.empty()) return;
  const size_t index = group.post_forward_indices.back();
  group.post_forward_indices.pop_back();
  if (index == 0) return;
  const size_t target = post_forward_order_[index - 1];
  if (target != 0 && target != g && !groups_[target].backward_done) unshard(rt, target);
}

void Fsdp2::root_pre_backward(Runtime& rt) {
  backward_started_ = true;
  pre_backward(rt, 0);
}

void Fsdp2::layer_entered(Runtime& rt, int32_t layer) {
  const size_t g = group_at(layer, rt.ctx.module);
  if (g >= groups_.size()) return;
  if (rt.ctx.phase == Phase::forward && !rt.recomputing) {
    if (g != 0 && groups_[g].forward_done) return;  // an op of a finished block
    if (forward_group_ != 0 && forward_group_ != g) {  // the block's post-forward
      // A group of several modules post-forwards after the last of them
      // (_register_group_forward_hooks): Accelerate's tied [norm, embed_tokens] after the
      // final norm, not after the embedding.
      if (!(norm_with_emb_ && forward_group_ == emb_group_ && !final_norm_ran_)) {
        group_post_forward(rt, forward_group_);
        groups_[forward_group_].forward_done = true;
      }
      forward_group_ = 0;
    }
    if (norm_with_emb_ && g == emb_group_ && rt.ctx.module == graph::Module::norm) final_norm_ran_ = true;
    // The root is unsharded from its pre-forward on; the output's calls are param_used's.
    if (g == 0 || (g == out_group_ && groups_[g].per_call)) return;
    unshard(rt, g);      // pre-forward (torchtitan's [norm, output]: at the norm)
    wait_for_unshard(rt, g, true);
    forward_group_ = g;
  } else if (rt.ctx.phase == Phase::backward || rt.recomputing) {
    // The root's pre-backward hook sits on the root's forward outputs that require grad:
    // the logits, whose gradient the head's first backward op receives, and, when the
    // model computed the loss in its forward, the loss, which autograd reaches first
    // (its first backward op; the ones_like root gradient comes before, in ctx.module
    // none).
    // (A separately sharded output's first call does both, in param_used: its hook on the
    // last chunk was registered before the root's.)
    const bool out_per_call = out_group_ != 0 && groups_[out_group_].per_call;
    if (!backward_started_ &&
        ((rt.ctx.module == graph::Module::head && !out_per_call) ||
         (loss_in_forward_ && rt.ctx.module == graph::Module::loss))) {
      // torchtitan's [norm, output] registered its hook on the logits before the root.
      if (out_group_ != 0 && g == out_group_) pre_backward(rt, out_group_);
      root_pre_backward(rt);
    }
    // RegisterPostBackwardFunction: the block whose backward ran has its post-backward once
    // its input's gradient is complete, i.e. before the first allocation of another group
    // (the block below, its recompute, the embedding).
    if (backward_block_ != 0 && g != backward_block_) {
      const size_t done = backward_block_;
      backward_block_ = 0;
      if (done > 1 || first_input_grad_) deferred_post_backward(rt, done);
      if (done == 1) frozen_embedding_output_hook(rt);
    }
    if (g == 0 || (g == out_group_ && out_per_call) || groups_[g].backward_done) return;
    if (!backward_started_) root_pre_backward(rt);
    pre_backward(rt, g);
    // A frozen output called once (Accelerate >= 1.14's [lm_head] under LoRA) has no
    // gradient to wait for: its RegisterPostBackwardFunction runs once the gradient of
    // its input (the final hidden states) is complete, like a block's.
    if ((g >= 1 && g <= blocks_) ||
        (g == out_group_ && !groups_[g].per_call && groups_[g].trainable == 0))
      backward_block_ = g;
  }
}

void Fsdp2::param_used(Runtime& rt, int32_t param, bool backward) {
  if (out_group_ == 0 || param != out_param_) return;
  if (!backward) {
    if (rt.recomputing) return;
    // self.output(chunk): the previous call's post-forward (nothing was allocated since its
    // matmul's output), then this call's pre-forward.
    if (out_post_forward_pending_) output_post_forward(rt);
    if (forward_group_ != 0) {  // (the final norm already post-forwarded the last block)
      group_post_forward(rt, forward_group_);
      groups_[forward_group_].forward_done = true;
      forward_group_ = 0;
    }
    unshard(rt, out_group_);
    wait_for_unshard(rt, out_group_, true);
    out_post_forward_pending_ = true;
    return;
  }
  // The previous call's RegisterPostBackwardFunction ran after its matmul's backward:
  // post_backward with no gradient yet (the weight's eight grads meet in AccumulateGrad's
  // input buffer, which runs after the last matmul), so it reshards only.
  if (out_post_backward_pending_) {
    out_post_backward_pending_ = false;
    group_post_backward(rt, out_group_);
  }
  // The chunk's gradient reaches its matmul's backward: the output's pre-backward hook on
  // that chunk (again once the previous call's post-backward ran), then, for the first
  // chunk autograd reaches, the root's hook on the same tensor.
  pre_backward(rt, out_group_);
  if (!backward_started_) root_pre_backward(rt);
  out_post_backward_pending_ = true;
  // A frozen output (LoRA): no AccumulateGrad follows, and the last call's
  // RegisterPostBackwardFunction runs right after its matmul's backward, before the
  // chunks' SplitBackward cat: once the node's one allocation (its grad_input) is made, the
  // next allocation first runs the pending post-backward (countdown_done).
  if (groups_[out_group_].trainable == 0) rt.hook_countdown = 2;
}

void Fsdp2::countdown_done(Runtime& rt) {
  if (!out_post_backward_pending_) return;  // the next call's hook ran it already
  out_post_backward_pending_ = false;
  group_post_backward(rt, out_group_);
}

void Fsdp2::grad_ready(Runtime& rt, int32_t param) {
  if (!backward_started_) root_pre_backward(rt);  // a model whose head allocates nothing
  const size_t o = static_cast<size_t>(param);
  if (o >= param_of_orig_.size() || param_of_orig_[o] < 0) return;
  const size_t group = params_[static_cast<size_t>(param_of_orig_[o])].group;
  if (stamp_[o] != iteration_) {
    stamp_[o] = iteration_;
    ++groups_[group].ready;
  }
  Group& gr = groups_[group];
  if (group == out_group_) out_post_backward_pending_ = false;  // this call's, with the grad
  // (A block's post-backward waits for its input's gradient: layer_entered.)
  const bool at_input = group >= 1 && group <= blocks_;
  if (!at_input && !gr.post_backward_in_callback && !gr.backward_done && gr.ready == gr.trainable)
    group_post_backward(rt, group);
}

void Fsdp2::frozen_embedding_output_hook(Runtime& rt) {
  // A separately sharded frozen embedding whose output PEFT's make_inputs_require_grad
  // hook made require grad: its post-forward registered the pre-backward hook on that
  // output (_fsdp_state.py _register_pre_backward_hook), which runs when block 0's
  // RegisterPostBackwardFunction hands the gradient on: the copy-out of the all-gather
  // block 0's pre-backward prefetched. (A trainable embedding's runs at its backward's
  // first allocation: layer_entered.) pre_backward runs once per backward.
  if (emb_group_ != 0 && first_input_grad_ && groups_[emb_group_].trainable == 0 &&
      groups_[emb_group_].forward_done)
    pre_backward(rt, emb_group_);
}

void Fsdp2::deferred_post_backward(Runtime& rt, size_t g) {
  // Emitted from the next group's first allocation (or the final callback): the events are
  // block g's (its layer in the reports), as at its AccumulateGrad before.
  Program& program = rt.program();
  program.hold();  // the tail stays editable
  const size_t first = program.events.size();
  group_post_backward(rt, g);
  if (g <= blocks_)  // (a frozen output's events stay outside the blocks)
    for (size_t e = first; e < program.events.size(); ++e)
      program.events[e].layer = static_cast<int32_t>(g) - 1;
  program.unhold();
}

void Fsdp2::group_post_backward(Runtime& rt, size_t g) {
  Group& group = groups_[g];
  if (group.backward_done) return;
  group.backward_done = true;
  if (group.per_call) group.pre_backward_done = false;  // the next call's hook runs again
  // Collect the autograd gradients (their references move into unsharded_grads).
  std::vector<uint32_t> grads;
  std::vector<size_t> with_grad;
  for (size_t i : group.params) {
    graph::Parameter& orig = rt.parameters()[params_[i].orig];
    if (orig.grad == kNoStorage) continue;
    grads.push_back(orig.grad);
    orig.grad = kNoStorage;
    with_grad.push_back(i);
  }
  reshard(rt, g);  // reshard_after_backward
  // The previous group's reduce-scatter input (reduce_scatter_states.clear()).
  if (reduce_scatter_state_ != kNoStorage) rt.release(reduce_scatter_state_);
  reduce_scatter_state_ = kNoStorage;
  if (grads.empty()) return;
  // _wait_for_post_backward: this group's previous HSDP buffer (grad accumulation).
  if (group.all_reduce != kNoStorage) rt.release(group.all_reduce);
  group.all_reduce = kNoStorage;
  // foreach_reduce.
  const uint64_t grad_elem = static_cast<uint64_t>(dtype_bytes(grad_dtype_));
  const uint64_t reduce_elem = static_cast<uint64_t>(dtype_bytes(reduce_dtype_));
  uint64_t full = 0, shard = 0;
  for (size_t i : with_grad) {
    full += params_[i].full_numel;
    shard += params_[i].shard_numel;
  }
  const uint32_t rs_in = alloc(rt, full * reduce_elem, TensorKind::gradient, 0, n_rs_in_);
  rt.name(rs_in, groups_[g].reduce_scatter_name);
  if (grad_dtype_ != reduce_dtype_ && promote(grad_dtype_, reduce_dtype_) != reduce_dtype_) {
    // _chunk_cat rejects narrowing casts: a grad-dtype buffer first.
    const uint32_t buf = alloc(rt, full * grad_elem, TensorKind::gradient, 0, n_rs_cast_);
    rt.release(buf);
  }
  for (uint32_t gs : grads) rt.release(gs);  // unsharded_grads.clear()
  const uint32_t rs_out =
      alloc(rt, shard * reduce_elem, TensorKind::gradient, kReduceScatterStream, n_rs_out_);
  const uint8_t post_stream = hsdp_ ? kAllReduceStream : kReduceScatterStream;
  uint32_t grad_out = rs_out;
  if (reduce_dtype_ != orig_grad_dtype_) {  // _to_dtype_if_needed(reduce_output, orig_dtype)
    const uint64_t orig_elem = static_cast<uint64_t>(dtype_bytes(orig_grad_dtype_));
    grad_out = alloc(rt, shard * orig_elem, TensorKind::gradient, post_stream, n_grad_cast_);
  }
  if (!offload_) {
    for (size_t i : with_grad) {  // .grad = a view of grad_out, or += into the old one
      // (Accelerate's tied lm_head: the root's parameter is the embedding's shard.)
      const size_t owner = static_cast<int32_t>(i) == head_param_ ? static_cast<size_t>(emb_param_) : i;
      graph::Parameter& sp = rt.parameters()[params_[owner].shard];
      if (sp.grad == kNoStorage) {
        sp.grad = grad_out;
        rt.retain(grad_out);
      }
    }
  }
  // (offload: new_sharded_grad.to(cpu); nothing stays on the GPU.)
  if (grad_out != rs_out) rt.release(grad_out);
  if (hsdp_) {
    group.all_reduce = rs_out;  // _all_reduce_state keeps the reduce-dtype buffer
  } else {
    rt.release(rs_out);
  }
  reduce_scatter_state_ = rs_in;
}

void Fsdp2::post_optimizer_step(Runtime& rt) {
  if (!precompute_scale_ || n_float8_ == 0) return;
  // precompute_float8_dynamic_scale_for_fsdp (torchao/float8/fsdp_utils.py @36027d8), on
  // the default stream, under no_grad. N weights, fp32 shards of at most `largest` elements.
  const uint64_t N = n_float8_;
  uint64_t largest = 0;
  for (const Param& p : params_)
    if (p.float8) largest = std::max(largest, p.shard_numel);
  const uint64_t chunks = (largest + 65535) / 65536;  // MultiTensorApply.cuh kChunkSize
  auto temp = [&](uint64_t bytes) { return rt.alloc_raw(bytes, TensorKind::temporary, OpKind::other); };
  on_stream(rt, 0, n_f8_pre_op_, [&] {
    // torch._foreach_norm(weights, ord=inf) on the DTensors' fp32 local shards
    // (ForeachReduceOp.cu _foreach_tensor_norm_cuda_impl): opmath workspaces, N 0-d results
    // and a 0-d global norm; the workspaces and the global norm die when it returns.
    const uint32_t per_tensor = temp(N * chunks * 4);
    const uint32_t global_out = temp(320 * 4);
    std::vector<uint32_t> norms(N);
    for (uint64_t k = 0; k < N; ++k) norms[k] = temp(4);
    const uint32_t global_norm = temp(4);
    rt.release(global_out);
    rt.release(per_tensor);
    rt.release(global_norm);
    const uint32_t stacked = temp(N * 4);      // torch.stack(max_weights): Partial
    const uint32_t replicated = temp(N * 4);   // clamp redistributes: all_reduce(MAX) clone
    const uint32_t clamped = temp(N * 4);      // torch.clamp(amax_tensor, EPS): Replicate
    rt.release(replicated);
    rt.release(stacked);                       // amax_tensor rebound
    const uint32_t amax64 = temp(N * 8);       // amax_tensor.to(torch.float64)
    rt.release(clamped);
    const uint32_t recip = temp(N * 8);        // max_fp8 / amax_tensor: reciprocal() * max
    const uint32_t scale64 = temp(N * 8);
    rt.release(recip);
    // scale_tensor.to_local().to(torch.float32): the vector the shards keep.
    const uint32_t vec = rt.alloc_raw(N * 4, TensorKind::parameter, OpKind::other);
    rt.program().tensors[vec].name = n_f8_vector_;
    // float8_linear.weight._local_tensor._precomputed_scale = local_scale_tensor[i]: the old
    // vector keeps only the unsharded parameters' references (until their next copy-out).
    if (precomputed_ != kNoStorage) rt.release(precomputed_);
    precomputed_ = vec;
    // The function returns: max_weights, amax_tensor (f64), scale_tensor (f64).
    for (uint32_t t : norms) rt.release(t);
    rt.release(amax64);
    rt.release(scale64);
  });
}

void Fsdp2::post_backward(Runtime& rt) {
  // The last block whose backward ran, with nothing allocated in another group since: its
  // input's gradient stopped there. Only block 0's input can then require grad (a frozen
  // embedding whose output PEFT's hook made a leaf that requires grad): its
  // RegisterPostBackwardFunction ran before the final callback. Any other block's input
  // needed no grad (nothing below it is trainable): no post-backward before the callback.
  if (backward_block_ != 0) {
    const size_t done = backward_block_;
    backward_block_ = 0;
    if (done == 1 && first_input_grad_) deferred_post_backward(rt, done);
  }
  frozen_embedding_output_hook(rt);  // (when nothing allocated after block 0's backward)
  // _root_post_backward_final_callback: all states, the root first.
  for (size_t g : state_order_) {
    group_post_backward(rt, g);  // a no-op for the groups whose post-backward ran
    Group& group = groups_[g];
    // finalize_backward: the HSDP buffer, a mistargeted prefetch.
    if (group.all_reduce != kNoStorage) rt.release(group.all_reduce);
    group.all_reduce = kNoStorage;
    if (group.all_gather != kNoStorage) rt.release(group.all_gather);
    group.all_gather = kNoStorage;
  }
  if (reduce_scatter_state_ != kNoStorage) rt.release(reduce_scatter_state_);
  reduce_scatter_state_ = kNoStorage;
}

}  // namespace memsim
