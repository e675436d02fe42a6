// build_program: model construction, batch tensors, warm-up steps and the measured
// step of a training loop, emitted through graph::Runtime (symbolic eager PyTorch).
#include "sim/step/schedule.h"

#include "sim/step/context_parallel_buffers.h"
#include "sim/step/model_family.h"
#include "sim/step/event_budget.h"
#include "sim/step/modelled_features.h"

#include <stdexcept>
#include <type_traits>

#include "graph/autocast.h"
#include "graph/compile.h"
#include "graph/models/cs336.h"
#include "graph/models/chunked_loss.h"
#include "graph/models/decoder.h"
#include "graph/models/losses.h"
#include "graph/numeric/numeric.h"
#include "sim/parallel/data_parallel.h"
#include "sim/parallel/deepspeed_zero.h"
#include "sim/parallel/fsdp.h"
#include "sim/parallel/fsdp2.h"
#include "sim/parallel/accelerate_amp.h"
#include "scenario/fsdp_precision.h"
#include "scenario/hf_family.h"
#include "sim/megatron/megatron_step.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/activation_offload.h"
#include "graph/offload_streams.h"
#include "scenario/offload_activations_key.h"
#include "scenario/scenario_lora.h"
#include "scenario/lora_target_parameters_key.h"
#include "sim/step/optimizer_in_backward.h"
#include "sim/step/clip_grad.h"
#include "sim/step/fsdp1_clip_grad.h"
#include "sim/step/grad_scaler.h"
#include "sim/step/generate.h"
#include "sim/optim/optimizer_step.h"
#include "sim/step/script_loss.h"
#include "sim/step/loss_placement.h"
#include "sim/step/time_model_setup.h"
#include "sim/parallel/zero_redundancy.h"

namespace memsim {

TrainingScript default_script(const Scenario& scenario) {
  TrainingScript s;
  s.loss = scenario.optimizer.impl == OptimizerImpl::cs336 ? LossImpl::cs336 : LossImpl::torch;
  switch (scenario.loss.impl) {  // loss.impl (sim/step/script_loss.h)
    case LossFunction::automatic: break;
    case LossFunction::torch: s.loss = LossImpl::torch; break;
    case LossFunction::torch_float: s.loss = LossImpl::torch_float; break;
    case LossFunction::cs336: s.loss = LossImpl::cs336; break;
    case LossFunction::one_hot: s.loss = LossImpl::one_hot; break;
    case LossFunction::chunked:  // hf-* only: the loop reads scenario.loss itself
    case LossFunction::liger: break;
  }
  s.zero_grad = scenario.step.zero_grad_set_to_none ? ZeroGradAt::before_forward
                                                    : ZeroGradAt::never;
  // step.keep_output false: the output and loss are locals of a function run once per
  // micro-batch (HF Trainer's training_step, which returns loss.detach()): they die when its
  // backward is done, before the next micro-batch and the optimizer step
  // (scenario/step_output_key.h); true keeps them at loop level (the default).
  s.drop_outputs_each_iteration = !scenario.step.keep_output;
  // model.implementation: the stack's own training loop deletes the output after the loss.
  // step.keep_output `loss`: HF Trainer's compute_loss returns the loss only, its
  // `outputs` local dies there, before backward.
  s.del_output_after_loss = scenario.model.arch.impl == graph::ModelImpl::torchtitan ||
                            scenario.model.arch.impl == graph::ModelImpl::torchtune ||
                            scenario.step.output_dies_after_loss;
  s.rebind_output_after_loss = scenario.step.model_computes_loss;
  return s;
}

namespace {

using graph::Runtime;
using graph::Tensor;

graph::Cs336Shape cs336_shape(const Scenario& s) {
  graph::Cs336Shape shape;
  shape.layers = s.model.layers;
  shape.d_model = s.model.d_model;
  shape.heads = s.model.heads;
  shape.d_ff = s.model.d_ff;
  shape.vocab = s.model.vocab;
  shape.context_length = s.model.context_length > 0 ? s.model.context_length : s.batch.seq_len;
  shape.batch = s.batch.micro_batch;
  shape.seq = s.batch.seq_len;
  shape.elem = model_compute_elem(s);  // precision.params or FSDP MixedPrecision
  shape.softmax = s.model.softmax == SoftmaxImpl::exp_twice ? graph::Cs336Softmax::exp_twice
                                                             : graph::Cs336Softmax::staff;
  shape.sdpa = s.model.sdpa == SdpaImpl::masked_fill ? graph::Cs336Sdpa::masked_fill
                                                      : graph::Cs336Sdpa::staff;
  shape.swiglu = s.model.swiglu == SwigluImpl::projections_first
                     ? graph::Cs336Swiglu::projections_first
                     : graph::Cs336Swiglu::staff;
  return shape;
}

graph::Cs336Shape cs336_shape(const Scenario& s, const TrainingScript& script) {
  graph::Cs336Shape shape = cs336_shape(s);
  shape.revision = script.cs336_revision;
  return shape;
}

graph::Cs336Shape shape_for(const graph::Cs336Model*, const Scenario& s,
                            const TrainingScript& script) {
  return cs336_shape(s, script);
}
template <class HfModel>
graph::HfShape shape_for(const HfModel*, const Scenario& s, const TrainingScript&) {
  return hf_shape(s);  // scenario/hf_family.h
}

// One training loop over a model (CS336, or a Hugging Face family whose loss is the
// model's own). Members mirror the script's Python names.
template <class Model>
class Loop {
 public:
  Loop(const Scenario& s, const TrainingScript& script, Program& program,
       graph::RuntimeBuffers* buffers = nullptr, graph::NumericContext* numeric = nullptr)
      : s_(s), script_(script), rt_(program, buffers),
        model_(rt_, shape_for(static_cast<const Model*>(nullptr), s, script)),
        loss_in_forward_(loss_in_model_forward(s)) {
    rt_.numeric = numeric;  // numeric mode (graph/numeric/numeric.h); null in normal runs
    if (numeric != nullptr) rt_.test_drop_save = numeric->test_drop_save;
  }

  void run() {
    // step.keep_output model-loss is the model's own loss computed in its forward
    // (sim/step/loss_placement.h); another loss, or that forward compiled with its loss, is
    // not what the key describes.
    if (s_.step.model_computes_loss && s_.loss.impl != LossFunction::automatic)
      throw ScenarioError(s_.key_prefix("step.keep_output") +
                          ": 'model-loss' is the model's own loss (labels passed to "
                          "XForCausalLM.forward); leave loss.impl out or use true");
    if (s_.step.model_computes_loss && s_.step.compile)
      throw ScenarioError(s_.key_prefix("step.keep_output") +
                          ": 'model-loss' with step.compile (the loss inside the compiled "
                          "forward) is not modelled");
    configure_device(rt_, s_.device);
    configure_time_model(rt_, s_);  // the time model's dtype and refusals (sim/step/time_model_setup.h)
    // Activation checkpointing (sim/step/checkpoint_policy.h): installs itself on rt_.
    checkpoint_ = make_checkpoint_engine(rt_, s_, script_);
    // checkpoint.offload: save_on_cpu around the listed layers (sim/step/activation_offload.h).
    offload_ = make_offload_engine(rt_, s_, checkpoint_.get());
    // lora.target_parameters (scenario/lora_target_parameters_key.h) is refused with
    // checkpointing other than full / custom [mlp], offload and parallelism other than DDP /
    // FSDP2 by its reader; a
    // plan search (compare --policies, optimize, --advise) may have rebuilt those sections
    // since. (The checkpoint section as the engine resolved it: reentrant and early_stop
    // included.)
    CheckpointConfig resolved = s_.checkpoint;
    if (checkpoint_) {
      resolved.reentrant = checkpoint_->plan().reentrant;
      resolved.early_stop = checkpoint_->plan().early_stop;
    }
    if ((lora_target_mask(s_.lora, s_.model.family) & 0x180u) != 0 &&
        ((checkpoint_ && !lora_target_parameters_checkpoint_modelled(resolved)) || offload_ ||
         !lora_target_parameters_parallel_modelled(s_.parallel)))
      throw ScenarioError(s_.key_prefix("lora.target_parameters") +
                          ": PEFT's target_parameters with activation checkpointing other than "
                          "full or custom [mlp], offload, or parallelism other than DDP / FSDP2 "
                          "is not modelled");
    // checkpoint.offload_activations: torchtune's OffloadActivations (graph/offload_streams.h;
    // its refusals: scenario/offload_activations_key.h).
    if (offloads_activations(s_)) {
      if (rt_.numeric != nullptr)
        throw ScenarioError(s_.key_prefix(kOffloadActivationsKey) +
                            ": numeric mode does not model host copies of saved tensors");
      // A plan search (compare --policies, optimize) may have rebuilt the checkpoint section.
      if (s_.checkpoint.policy != CheckpointPolicy::full || offload_)
        throw ScenarioError(s_.key_prefix(kOffloadActivationsKey) +
                            ": torchtune's OffloadActivations is modelled with checkpoint.policy "
                            "full only, without checkpoint.offload");
      graph::StreamOffloadConfig oc;
      // Under FSDP2 (torchtune's distributed recipes) streams 1-3 are FSDP2's: s1 is a 4th.
      if (s_.parallel.sharding == Sharding::fsdp2) oc.stream = kAllReduceStream + 1;
      stream_offload_ = std::make_unique<graph::StreamOffload>(rt_, oc);
      offload_ = std::make_unique<graph::OffloadEngine>(rt_, *stream_offload_);
    }
    if (s_.parallel.context > 1) {  // scenario/context_parallel_keys.h; rank 0 is modelled
      if (rt_.numeric != nullptr)
        throw ScenarioError(s_.source + ": parallel.context: numeric mode does not model the ring attention");
      cp_ = std::make_unique<ContextParallelBuffers>(
          static_cast<uint64_t>(s_.batch.micro_batch), static_cast<uint64_t>(s_.batch.seq_len),
          context_degree(), 0);
    }
    if (s_.step.compile) {  // torch.compile (graph/compile.h; scenario/compile_keys.h)
      if (rt_.numeric != nullptr)
        throw ScenarioError(s_.source + ": step.compile: numeric mode does not model compiled regions");
      graph::CompileOptions o;
      o.scope = s_.step.compile_scope == CompileRegions::block ? graph::CompileScope::block
                                                               : graph::CompileScope::model;
      o.memory_budget = s_.step.compile_memory_budget;
      // torchtune's recipes call training.compile_loss with `compile: True` as well.
      o.compile_loss = s_.model.arch.impl == graph::ModelImpl::torchtune;
      // ... and apply activation checkpointing after compile_model: an eager checkpoint
      // around each compiled layer (graph/compile.h 4c).
      o.checkpoint_outside = s_.model.arch.impl == graph::ModelImpl::torchtune;
      compile_ = std::make_unique<graph::CompileEngine>(rt_, o);
    }
    // Accelerate's FSDP2 and FSDP1 bf16 paths: autocast over bf16 unsharded parameters
    // casts nothing in the model (sim/parallel/accelerate_amp.h); only the root's boundary
    // copies remain (convert_outputs_to_fp32; FSDP2 also its output_dtype casts).
    accelerate_amp_ = accelerate_fsdp2_amp(s_) || accelerate_fsdp1_amp(s_);
    if (s_.precision.grad_scaler) {  // torch.amp.GradScaler (sim/step/grad_scaler.h)
      if (rt_.numeric != nullptr)
        throw ScenarioError(s_.source + ": precision.grad_scaler: numeric mode does not model the scaler");
      scaler_ = std::make_unique<GradScalerSim>(s_.optimizer.impl == OptimizerImpl::fused,
                                                s_.parallel.sharding == Sharding::fsdp2, s_.source);
    }
    // clip_grad_norm_ (sim/step/clip_grad.h); DeepSpeed clips in its ZeRO optimizer's step
    // (ds.json gradient_clipping = optimizer.max_grad_norm, sim/parallel/deepspeed_norm.h).
    if (s_.optimizer.max_grad_norm && s_.parallel.sharding != Sharding::deepspeed) {
      if (rt_.numeric != nullptr)
        throw ScenarioError(s_.source + ": optimizer.max_grad_norm: numeric mode does not model clipping");
      if (s_.parallel.sharding == Sharding::fsdp)  // FSDP.clip_grad_norm_ (sim/step/fsdp1_clip_grad.h)
        fsdp1_clip_ = std::make_unique<Fsdp1ClipGradNormSim>(s_.optimizer, s_.source);
      else
        clip_ = std::make_unique<ClipGradNormSim>(s_.optimizer,
                                                  static_cast<uint64_t>(dtype_bytes(s_.precision.params)),
                                                  s_.parallel.sharding == Sharding::fsdp2);
    }
    if (s_.precision.autocast && !accelerate_amp_) {  // cs336, hf-llama, hf-gpt2 (sim/step/modelled_features.cpp)
      autocast_ = std::make_unique<graph::Autocast>(
          rt_, static_cast<uint64_t>(dtype_bytes(*s_.precision.autocast)),
          *s_.precision.autocast == DType::fp16);
      autocast_->set_cache_enabled(s_.precision.autocast_cache);
      // FSDP: the weights are views of the gathered flat parameter, never cached. FSDP2's
      // unsharded parameters are leaf nn.Parameters (one per parameter for the whole run),
      // cached as on one GPU through the reshard (docs/fsdp2.md "Autocast over FSDP2").
      autocast_->set_params_are_views(s_.parallel.sharding == Sharding::fsdp);
      model_.set_autocast(autocast_.get());
      if (checkpoint_) checkpoint_->set_autocast(autocast_.get());  // recompute re-enters it
    }
    {
      // ~330 events per layer and step (forward, backward, optimizer), plus the rest.
      const size_t steps = static_cast<size_t>(s_.step.warmup_steps + 1) *
                           static_cast<size_t>(std::max<int64_t>(1, s_.batch.grad_accum));
      rt_.reserve(steps * (static_cast<size_t>(s_.model.layers) * 340 + 1200) +
                  static_cast<size_t>(s_.model.layers) * 12);
    }
    rt_.ctx.phase = Phase::setup;
    // step.measure whole-run: the peaks count from here (recording started before the
    // model was built); the measured step then sets no mark of its own.
    if (s_.step.measure_whole_run) rt_.mark("measured_step_begin");
    model_.construct();
    // model = FSDP(model) (sim/parallel/fsdp.h) or DistributedDataParallel(model)
    // (sim/parallel/data_parallel.h), before the optimizer.
    if (s_.parallel.sharding == Sharding::fsdp)
      fsdp_ = std::make_unique<Fsdp>(rt_, s_);
    else if (s_.parallel.sharding == Sharding::fsdp2)  // fully_shard (sim/parallel/fsdp2.h)
      fsdp2_ = std::make_unique<Fsdp2>(rt_, s_);
    else if (s_.parallel.sharding == Sharding::deepspeed)  // sim/parallel/deepspeed_zero.h
      ds_ = std::make_unique<DeepSpeedZero>(rt_, s_);
    else if (s_.parallel.data > 1)
      ddp_ = std::make_unique<TorchDdp>(rt_, s_.parallel.gradient_as_bucket_view);
    {
      OptimizerSetup setup;
      setup.cs336_decay_after_update = script_.cs336_revision == graph::Cs336Revision::v2025;
      setup.param_elem = trained_param_elem(s_);  // Accelerate's FSDP1 upcast: fp32 shards
      setup.master_weights = s_.precision.master_weights;
      optimizer_ = make_optimizer(s_.optimizer, setup);
      if (ds_) {  // DeepSpeed steps its fp32 partitions (FusedAdam, or the torch optimizer)
        const bool fused_adam = s_.optimizer.impl == OptimizerImpl::fused &&
                                (s_.optimizer.type == OptimizerType::adam ||
                                 s_.optimizer.type == OptimizerType::adamw);
        optimizer_ = ds_->make_step(fused_adam ? make_deepspeed_fused_adam()
                                               : make_inner_optimizer(s_.optimizer, setup, true));
      }
      if (optimizer_ && ((fsdp_ && fsdp_->offloads_params()) || (fsdp2_ && fsdp2_->offloads_params())))
        optimizer_ = make_cpu_offloaded_optimizer();  // steps the CPU shards (sim/parallel/fsdp.h)
      if (s_.parallel.zero == 1 && s_.parallel.sharding == Sharding::none)  // ZeRO-1
        optimizer_ = make_zero_redundancy_optimizer(std::move(optimizer_), rt_, s_, setup.param_elem);
      if (optimizer_) optimizer_->construct(rt_);
      // torchtune's train(): training.cleanup_before_training() empties the cache left by
      // load_from_full_model_state_dict's full copies (sim/parallel/fsdp2_layout.h).
      if (fsdp2_ && fsdp2_->empties_cache_before_training()) rt_.program().empty_cache(Phase::setup);
      // optimizer.in_backward: each parameter's step runs from its post-accumulate-grad
      // hook, the loop steps nothing (sim/step/optimizer_in_backward.h).
      if (s_.recipe.optimizer_in_backward && optimizer_) {
        if (rt_.hooks != nullptr || rt_.numeric != nullptr)
          throw ScenarioError(s_.recipe.in_backward_where + ": optimizer.in_backward: not modelled " +
                              (rt_.numeric != nullptr ? "in numeric mode" : "with data parallelism"));
        in_backward_ = std::make_unique<OptimizerInBackward>(rt_, s_, std::move(optimizer_));
      }
    }
    allocate_batches();
    const int64_t warmup = s_.step.warmup_steps;
    for (int64_t step = 0; step <= warmup; ++step) {
      const bool measured = step == warmup;
      if (measured) {
        rt_.ctx.phase = Phase::other;
        if (script_.del_outputs_before_measured) drop_outputs();
        if (script_.zero_grad_before_measured) zero_grad();
        if (script_.measure_includes_zero_grad && !s_.step.measure_whole_run)
          rt_.mark("measured_step_begin");
      }
      train_step(measured);
    }
    if (autocast_) autocast_->exit();  // whole-run: the `with` block ends after the loop
    if (offload_) rt_.program().host_offload_bytes = offload_->host_peak();  // either kind
    rt_.freeze();  // the script ends here: whatever is alive stays alive
  }

 private:
  const auto& shape() const { return model_.shape(); }
  // The batch as the dataloader hands it over: with context parallelism the full sequence
  // (the model's shape has this rank's S/N; sim/step/context_parallel_buffers.h).
  uint64_t batch_bytes() const { return shape().batch * shape().seq * context_degree() * 8; }
  uint64_t context_degree() const { return static_cast<uint64_t>(s_.parallel.context); }
  // loss.positions last: one int64 target per sequence.
  uint64_t target_bytes() const {
    return s_.loss.positions == LossPositions::last ? shape().batch * 8 : batch_bytes();
  }

  void allocate_batches() {
    const int64_t warmup = s_.step.warmup_steps;
    if (script_.per_step_batches) {
      Tensor warm_in = rt_.alloc(warmup * batch_bytes(), TensorKind::input, graph::OpKind::other);
      Tensor meas_in = rt_.alloc(batch_bytes(), TensorKind::input, graph::OpKind::other);
      Tensor warm_tg, meas_tg;
      if (script_.targets_on_device) {
        warm_tg = rt_.alloc(warmup * target_bytes(), TensorKind::input, graph::OpKind::other);
        meas_tg = rt_.alloc(target_bytes(), TensorKind::input, graph::OpKind::other);
      }
      warm_ids_ = warm_in;
      ids_ = meas_in;
      warm_targets_ = warm_tg;
      targets_ = meas_tg;
    } else {
      ids_ = rt_.alloc(batch_bytes(), TensorKind::input, graph::OpKind::other);
      if (script_.targets_on_device)
        targets_ = rt_.alloc(target_bytes(), TensorKind::input, graph::OpKind::other);
      if (rt_.numeric != nullptr) {
        rt_.numeric->fill_tokens(ids_, 0);
        if (targets_.defined()) rt_.numeric->fill_tokens(targets_, 1);
      }
      warm_ids_ = ids_;
      warm_targets_ = targets_;
    }
  }

  void zero_grad() {
    const Phase p = rt_.ctx.phase;
    rt_.ctx.phase = Phase::optimizer;
    rt_.ctx.layer = -1;
    rt_.zero_grad_set_to_none();
    rt_.ctx.phase = p;
  }

  // The output and loss names die; a graph nobody ran backward on dies with them.
  // A TensorImpl drops its grad_fn before its storage: the graph goes first.
  void drop_outputs() {
    if (logits_graph_ != 0) rt_.discard_graph(logits_graph_);
    if (loss_graph_ != 0 && loss_graph_ != logits_graph_) rt_.discard_graph(loss_graph_);
    logits_graph_ = loss_graph_ = 0;
    logits_.reset();
    if constexpr (is_decoder) model_.drop_output();  // torchtune's chunk list
    logit_chunks_.clear();
    loss_.reset();
  }

  void train_step(bool measured) {
    const StepKind kind =
        (!measured && script_.warmup_kind_set) ? script_.warmup_kind : s_.step.kind;
    const bool with_grad = kind != StepKind::forward_no_grad;
    const bool with_loss = kind == StepKind::train || kind == StepKind::forward_backward;
    rt_.ctx.phase = Phase::optimizer;
    if (script_.zero_grad == ZeroGradAt::before_forward) zero_grad();
    if (measured && !script_.measure_includes_zero_grad && !s_.step.measure_whole_run)
      rt_.mark("measured_step_begin");
    const Tensor& ids = measured ? ids_ : warm_ids_;
    const Tensor& targets = measured ? targets_ : warm_targets_;
    const int64_t micro = std::max<int64_t>(1, s_.batch.grad_accum);
    for (int64_t mb = 0; mb < micro; ++mb) {
      const bool last = mb + 1 == micro;
      rt_.ctx.phase = Phase::forward;
      rt_.grad_enabled = with_grad;
      const uint32_t graph = with_grad ? rt_.begin_graph() : 0;
      if (autocast_ && !autocast_->active()) autocast_->enter(!with_grad && script_.inference_mode);
      // `with context_parallel(...)`: the batch sharded along the sequence, for forward and
      // backward (sim/step/context_parallel_buffers.h).
      if (cp_) cp_->enter(rt_, targets.defined() ? 2 : 1);
      if (ddp_) ddp_->pre_forward(rt_, with_grad);
      // Accelerate's FSDP1 bf16 path: MixedPrecision(buffer_dtype=bf16); the root's lazy init
      // (its first pre-forward) casts the rotary buffers before anything else.
      if constexpr (is_decoder) {
        if (fsdp_ && accelerate_amp_ && !buffers_cast_)
          model_.cast_rotary_buffers(static_cast<uint64_t>(dtype_bytes(*s_.parallel.fsdp_mixed_precision)));
      }
      buffers_cast_ = true;
      if (fsdp_) fsdp_->pre_forward(rt_);
      if (fsdp2_) fsdp2_->pre_forward(rt_);
      if (ds_) ds_->pre_forward(rt_);
      // hf-* with loss.impl chunked:N / liger (docs/losses.md): the model hands back logits
      // chunks (torchtune's model does in every step once the loss set its chunk count),
      // or, given the labels in training (Liger's patched forward), the loss and no logits.
      Tensor out, liger_loss;
      std::vector<Tensor> out_chunks;
      const LossFunction hf_loss = is_decoder ? s_.loss.impl : LossFunction::automatic;
      if constexpr (is_decoder) {
        if (hf_loss == LossFunction::chunked)
          out_chunks = model_.forward_chunked(ids, s_.loss.chunks, chunk_pieces_);
        else if (hf_loss == LossFunction::liger && with_loss)
          liger_loss = model_.forward_liger(ids, targets);
        else
          out = model_.forward(ids);
      } else {
        out = model_.forward(ids);
      }
      // The root's post-forward runs when model.forward returns: after the loss when the
      // model computes it (sim/step/loss_placement.h; Liger's forward has it already).
      const bool root_post_forward_after_loss =
          loss_in_forward_ && with_loss && hf_loss != LossFunction::liger;
      if (fsdp2_ && !root_post_forward_after_loss) fsdp2_->post_forward(rt_);
      if (autocast_ && !region_ends(AutocastRegion::whole_run) &&
          (region_ends(AutocastRegion::forward) || !with_loss))
        autocast_->exit();
      rt_.grad_enabled = true;
      // step.keep_output model-loss: `outputs = model(ids, labels=labels)` rebinds once the
      // call has returned, after the loss computed inside it (and the root's post-forward
      // hooks): the previous outputs are held here until then.
      const bool rebind_after_loss = script_.rebind_output_after_loss && with_loss;
      Tensor previous;
      std::vector<Tensor> previous_chunks;
      uint32_t previous_graph = 0;
      // The graph dies with the last name that holds it: the previous loss, bound until
      // `loss = ...` below, keeps it past the old logits (what it holds after backward:
      // a requires_grad_ leaf and its .grad, Runtime::requires_grad_).
      auto drop_previous = [&] {
        if (previous_graph != 0 && previous_graph != loss_graph_) rt_.discard_graph(previous_graph);
        previous_graph = 0;
        previous.reset();
        previous_chunks.clear();
      };
      if (!script_.bind_output) {
        out.reset();
        out_chunks.clear();
        if (graph != 0) rt_.discard_graph(graph);
      } else {
        // `logits = model(x)`: the previous value dies only now (model-loss: below).
        previous_graph = logits_graph_;
        previous = std::move(logits_);
        previous_chunks = std::move(logit_chunks_);
        logits_ = std::move(out);
        logit_chunks_ = std::move(out_chunks);
        logits_graph_ = graph;
        if (!rebind_after_loss) drop_previous();
      }
      if (measured && last) rt_.mark("forward_end");
      if (!with_loss) {
        if (cp_) cp_->exit();
        if (script_.drop_outputs_each_iteration) {
          rt_.ctx.phase = Phase::other;
          drop_outputs();
        }
        continue;
      }
      rt_.ctx.phase = Phase::loss;
      // Low-precision logits outside the autocast region keep their dtype in the loss.
      const uint64_t elem = autocast_ ? logits_.bytes / (shape().batch * shape().seq * shape().vocab)
                                      : shape().elem;
      Tensor l;
      if constexpr (std::is_same_v<Model, graph::Cs336Model>) {
        l = cs336_script_loss(rt_, autocast_.get(), logits_, targets, shape(), elem,
                              script_.loss, s_.loss.positions);  // sim/step/script_loss.h
      } else if (hf_loss == LossFunction::chunked) {  // torchtune's CEWithChunkedOutputLoss
        l = graph::chunked_output_cross_entropy(rt_, logit_chunks_, targets, shape().batch,
                                                chunk_pieces_, shape().vocab);
      } else if (hf_loss == LossFunction::liger) {  // computed by the patched forward
        l = std::move(liger_loss);
      } else if (hf_loss == LossFunction::torch || hf_loss == LossFunction::torch_float) {
        l = logits_script_loss(rt_, autocast_.get(), logits_, targets,
                               shape().batch * shape().seq, shape().vocab,
                               hf_loss == LossFunction::torch_float);  // sim/step/script_loss.h
      } else {
        l = model_.loss(logits_, targets);  // the family's loss (HF: shift + CE)
      }
      // `loss = ...`: the previous loss dies at the rebind, its graph first (a TensorImpl
      // drops its grad_fn before its storage) unless the logits still hold it.
      auto rebind_loss = [&] {
        Tensor old_loss = std::move(loss_);
        loss_ = std::move(l);
        if (loss_graph_ != 0 && loss_graph_ != logits_graph_) rt_.discard_graph(loss_graph_);
        loss_graph_ = script_.bind_output ? graph : 0;
      };
      if (!rebind_after_loss) rebind_loss();
      // The model's outputs as its root hooks see them (model-loss: the new loss is not
      // bound to the loop's name yet).
      Tensor& out_loss = rebind_after_loss ? l : loss_;
      // Accelerate v1.6 / v1.7 under FSDP2, every release under FSDP1: model.forward is
      // convert_outputs_to_fp32(autocast(forward)), inside FSDP's hooks (FSDP1's root
      // post-forward casts nothing, so its fp32 logits live until Trainer drops them). The root's post-forward then casts to the policy's
      // output_dtype (parallel.fsdp_output_dtype; Accelerate >= 1.8: the policy alone).
      const uint64_t logits_numel = shape().batch * shape().seq * shape().vocab;
      if (accelerate_amp_) convert_outputs_to_fp32(rt_, out_loss, logits_, logits_numel);
      if (fsdp_) fsdp_->post_forward(rt_);  // FSDP1's root post-forward (its bf16 shard views)
      if (fsdp2_ && root_post_forward_after_loss) fsdp2_->post_forward(rt_);
      if (fsdp2_ && root_post_forward_after_loss && s_.parallel.fsdp_output_dtype)
        cast_outputs(rt_, out_loss, logits_, logits_numel,
                     static_cast<uint64_t>(dtype_bytes(*s_.parallel.fsdp_output_dtype)));
      if (rebind_after_loss) {
        // model(...) has returned: `outputs = ` drops the previous outputs (the H200 traces
        // of tools/gpu/measure_cuda.py's tf_arch_* runs free the previous 501 MiB logits at
        // run_one's `logits = forward(...)` line, after fixed_cross_entropy's allocations),
        // then `loss = outputs.loss` the previous loss.
        drop_previous();
        rebind_loss();
      }
      if (script_.del_output_after_loss) logits_.reset();  // `del pred` (the graph lives on)
      if (autocast_ && region_ends(AutocastRegion::forward_and_loss)) autocast_->exit();
      // `scaler.scale(loss).backward()`: the scaled loss is the statement's temporary, dead
      // once backward returns (sim/step/grad_scaler.h).
      Tensor scaled;
      if (scaler_) scaled = scaler_->scale(rt_, loss_);
      // engine.backward(loss): the ZeRO optimizer's loss * loss_scale, engine.backward's
      // local until it returns (sim/parallel/deepspeed_norm.h).
      if (ds_) scaled = ds_->scale_loss(rt_, loss_);
      rt_.ctx.phase = Phase::backward;
      rt_.backward(scaled.defined() ? scaled : loss_);
      if (ddp_) add_ddp_all_reduce(rt_, ddp_->bucket_bytes(), s_.parallel.data);  // time model
      if (fsdp_) fsdp_->post_backward(rt_);  // FSDP's final backward callback
      if (fsdp2_) fsdp2_->post_backward(rt_);
      if (ds_) ds_->post_backward(rt_);      // DeepSpeed's gradient epilogue
      scaled.reset();  // the statement ends: after FSDP's final callback (inside the engine)
      if (cp_) cp_->exit();                  // the context_parallel block ends
      if (script_.drop_outputs_each_iteration) {  // the micro-batch's function returned
        rt_.ctx.phase = Phase::other;
        drop_outputs();
      }
      if (measured && last) rt_.mark("backward_end");
    }
    if (kind == StepKind::train && optimizer_) {
      rt_.ctx.phase = Phase::optimizer;
      rt_.ctx.layer = -1;
      rt_.ctx.module = graph::Module::optimizer;
      add_optimizer_cost(rt_, s_);  // the time model (sim/step/time_model_setup.h)
      if (scaler_) scaler_->before_step(rt_);  // scaler.step(opt): unscale_, then opt.step()
      // clip_grad_norm_ after backward (and the scaler's unscale_: HF Trainer / Accelerate's
      // order, explicit scaler.unscale_ then the clip; scaler.step then skips its own).
      if (clip_) clip_->clip(rt_);
      if (fsdp1_clip_) fsdp1_clip_->clip(rt_, fsdp_->clip_order());
      optimizer_->step(rt_);
      if (scaler_) scaler_->after_step(rt_);
      if (scaler_) scaler_->update(rt_);  // scaler.update()
      // torchtitan's float8 converter: precompute_float8_dynamic_scale_for_fsdp.
      if (fsdp2_) fsdp2_->post_optimizer_step(rt_);
      if (rt_.numeric != nullptr) rt_.numeric->on_optimizer_step(rt_);
      rt_.ctx.module = graph::Module::none;
      if (measured) rt_.mark("optimizer_end");
    }
    // whole-step: the cache dies with the region; whole-run keeps it for the next step.
    if (autocast_ && !region_ends(AutocastRegion::whole_run)) autocast_->exit();
    if (script_.zero_grad == ZeroGradAt::after_step && (!measured || script_.measured_step_zero_grad))
      zero_grad();
    if (script_.outputs_are_step_locals) {
      rt_.ctx.phase = Phase::other;
      drop_outputs();
    }
  }

  bool region_ends(AutocastRegion at) const { return s_.precision.autocast_region == at; }

  const Scenario& s_;
  const TrainingScript& script_;
  Runtime rt_;
  Model model_;
  const bool loss_in_forward_;  // the model's forward computes the loss (sim/step/loss_placement.h)
  std::unique_ptr<OptimizerSim> optimizer_;
  std::unique_ptr<OptimizerInBackward> in_backward_;  // optimizer.in_backward (then optimizer_ is null)
  std::unique_ptr<graph::CheckpointEngine> checkpoint_;
  std::unique_ptr<graph::CompileEngine> compile_;  // step.compile (graph/compile.h)
  std::unique_ptr<graph::OffloadEngine> offload_;  // checkpoint.offload (graph/offload.h)
  std::unique_ptr<graph::StreamOffload> stream_offload_;  // checkpoint.offload_activations
  std::unique_ptr<graph::Autocast> autocast_;  // precision.autocast (graph/autocast.h)
  bool buffers_cast_ = false;    // FSDP1 buffer_dtype's lazy-init cast done (Accelerate's path)
  bool accelerate_amp_ = false;  // Accelerate's FSDP2 bf16 path (sim/parallel/accelerate_amp.h)
  std::unique_ptr<GradScalerSim> scaler_;  // precision.grad_scaler (sim/step/grad_scaler.h)
  std::unique_ptr<ClipGradNormSim> clip_;  // optimizer.max_grad_norm (sim/step/clip_grad.h)
  std::unique_ptr<Fsdp1ClipGradNormSim> fsdp1_clip_;  // the same under FSDP1
  std::unique_ptr<TorchDdp> ddp_;
  std::unique_ptr<Fsdp> fsdp_;
  std::unique_ptr<Fsdp2> fsdp2_;
  std::unique_ptr<DeepSpeedZero> ds_;
  std::unique_ptr<ContextParallelBuffers> cp_;  // parallel.context > 1
  Tensor warm_ids_, warm_targets_, ids_, targets_;
  Tensor logits_, loss_;
  std::vector<Tensor> logit_chunks_;   // loss.impl chunked:N: the model's output list
  std::vector<uint64_t> chunk_pieces_;  // their sequence lengths (tensor_split)
  uint32_t logits_graph_ = 0;
  uint32_t loss_graph_ = 0;  // the graph loss_ keeps alive (0: none, or discarded)
  static constexpr bool is_decoder = std::is_same_v<Model, graph::DecoderModel>;
};

}  // namespace

// The rows' builders (sim/step/model_family.h).
namespace family_builders {
void cs336(const Scenario& s, const TrainingScript& script, Program& program,
           graph::RuntimeBuffers* buffers) {
  program.clear();
  Loop<graph::Cs336Model>(s, script, program, buffers).run();
}
void decoder(const Scenario& s, const TrainingScript& script, Program& program,
             graph::RuntimeBuffers* buffers) {
  // step.kind generate: HF generate() instead of a training loop (sim/step/generate.h).
  if (s.step.kind == StepKind::generate) return build_generate_program(s, program, buffers);
  program.clear();
  Loop<graph::DecoderModel>(s, script, program, buffers).run();
}
void megatron(const Scenario& s, const TrainingScript&, Program& program,
              graph::RuntimeBuffers* buffers) {
  build_megatron_program(s, {}, program, buffers);
}
void cs336_numeric(const Scenario& s, const TrainingScript& script, Program& program,
                   graph::NumericContext* numeric) {
  Loop<graph::Cs336Model>(s, script, program, nullptr, numeric).run();
}
void decoder_numeric(const Scenario& s, const TrainingScript& script, Program& program,
                     graph::NumericContext* numeric) {
  if (s.step.kind == StepKind::generate)
    throw ScenarioError(s.source + ": step.kind: generate: the numeric check runs training steps only");
  Loop<graph::DecoderModel>(s, script, program, nullptr, numeric).run();
}
void megatron_numeric(const Scenario& s, const TrainingScript&, Program& program,
                      graph::NumericContext* numeric) {
  build_megatron_program(s, program, numeric);
}
}  // namespace family_builders

namespace {

const FamilyBuild& buildable_row(const Scenario& scenario) {
  const FamilyBuild& row = family_build(scenario.model.family);
  if (row.build == nullptr)
    throw ScenarioError(scenario.source + ": model.family: '" + to_string(scenario.model.family) +
                        "' is not implemented yet");
  return row;
}

}  // namespace

const Program& build_program(const Scenario& scenario, const TrainingScript& script,
                             BuildBuffers& buffers) {
  require_modelled(scenario);
  check_event_budget(scenario);  // before any reservation (sim/step/event_budget.h)
  const FamilyBuild& row = buildable_row(scenario);
  Program& program = buffers.program;
  row.build(scenario, script, program, &buffers.runtime);
  // megatron and ZeRO-1 (sim/parallel/zero_redundancy.h) record the rank they simulate themselves
  if (!row.build_sets_rank && !program.rank.distributed())
    program.rank = data_parallel_rank(scenario);
  return program;
}

Program build_program(const Scenario& scenario, const TrainingScript& script) {
  require_modelled(scenario);
  check_event_budget(scenario);  // before any reservation (sim/step/event_budget.h)
  const FamilyBuild& row = buildable_row(scenario);
  Program program;
  row.build(scenario, script, program, nullptr);
  if (!row.build_sets_rank && !program.rank.distributed())
    program.rank = data_parallel_rank(scenario);
  return program;
}

Program build_program(const Scenario& scenario, const TrainingScript& script,
                      graph::NumericContext* numeric) {
  require_modelled(scenario);
  check_event_budget(scenario);  // before any reservation (sim/step/event_budget.h)
  const FamilyBuild& row = family_build(scenario.model.family);
  if (row.build_numeric == nullptr)  // numeric kernels: graph/numeric/numeric.h
    throw ScenarioError(scenario.source + ": model.family: '" +
                        to_string(scenario.model.family) + "' has no numeric kernels");
  Program program;
  row.build_numeric(scenario, script, program, numeric);
  return program;
}

Program build_program(const Scenario& scenario) {
  return build_program(scenario, default_script(scenario));
}

}  // namespace memsim
