// PyTorch FullyShardedDataParallel on one simulated rank (cs336, hf-gpt2, hf-llama;
// parallel.sharding: fsdp). Models torch 2.x FSDP with use_orig_params=False (or True:
// parallel.use_orig_params, below), an auto-wrap policy that makes each transformer layer
// a unit (and with parallel.fsdp_wrap: peft each LoRA adapter Linear too, below), and the
// root unit holding the rest (embeddings, final norm, LM head), BACKWARD_PRE prefetch
// (torch's default) or none (parallel.fsdp_backward_prefetch: no_prefetch, HF Trainer's
// default: each unit is gathered by its own pre-backward only), no forward prefetch. Parameters are in precision.params; parallel.fsdp_mixed_precision adds
// MixedPrecision(param_dtype=reduce_dtype=bf16|fp16), described below.
//
// Events (d = parallel.data, elem = parameter bytes):
//  - Wrapping (after the model is built on the GPU; with parallel.fsdp_init: cpu the
//    model is built off the GPU and each unit's parameters are allocated on the GPU just
//    before that unit is flattened, as FSDP(module, device_id=...) moves unit by unit): per unit, FlatParameter = cat of the
//    unit's parameters padded to a multiple of d (a full-size allocation), the original
//    parameter storages freed, this rank's shard cloned (padded / d elements: a new
//    parameter the optimizer sees), the full flat parameter freed.
//  - parallel.fsdp_sync_module_states (FSDP(sync_module_states=True), HF Trainer's default):
//    per unit, after its move to the GPU and before flattening, the unit's buffers (the
//    model's live non-parameter construction allocations, by layer; the root takes the
//    rest) and parameters are broadcast in torch's buckets: the flat tensors of
//    sim/parallel/fsdp_sync_states.h allocated and freed there (setup events only).
//  - Lazy init (the first forward, before anything is gathered): per unit, root first,
//    the padded unsharded buffer is made with torch.zeros and its storage freed at once
//    (init_flat_param_attributes; MixedPrecision: also _mp_shard and the full-precision
//    padded buffer): alloc/free pairs that only shape the caching allocator's segments.
//  - Forward: the root's pre-forward all-gathers the root unit; entering layer l
//    all-gathers unit l (a full padded flat parameter, the layer's weights are views of
//    it); FULL_SHARD (zero 3, reshard_after_forward) frees unit l again when the forward
//    moves on; SHARD_GRAD_OP (zero 2) keeps it until after its backward. The root is never
//    resharded after forward (FSDP keeps the root's parameters for the backward).
//  - Backward: entering layer l all-gathers unit l if it is not gathered and prefetches
//    unit l-1 (BACKWARD_PRE; not with no_prefetch: pytorch/pytorch @00ae0bc9
//    torch/distributed/fsdp/_runtime_utils.py _get_handles_to_prefetch returns nothing when
//    backward_prefetch is None), so two units' full parameters are live; the root's
//    pre-backward hook (on the logits) prefetches the last layer (BACKWARD_PRE) when the backward first
//    allocates in the LM head (module head), i.e. once the logits' gradient exists, or at
//    the loss's first backward op when the model computed the loss in its forward (the
//    loss is an output too: sim/step/loss_placement.h). Once
//    every parameter of a unit has its gradient, the post-backward hook runs: the
//    FlatParameter's gradient (the per-parameter gradients concatenated: a full padded
//    flat allocation, then they die), reduce-scatter into a new shard-sized gradient
//    (added into the previous one under gradient accumulation), the full gradient
//    freed, the unit resharded. The root's post-backward runs when backward returns.
//  - The optimizer then steps the shards only (the original parameters hold no grad),
//    so its state is sharded too: zero 3 = 16/d bytes per fp32 parameter with Adam.
//  - parallel.cpu_offload (CPUOffload(offload_params=True); torch 2.x
//    _init_utils._init_param_handle_from_params, FlatParamHandle.pre_unshard /
//    init_flat_param_attributes, _runtime_utils._reduce_grad / _offload_grad /
//    _post_backward_final_callback): each shard is moved to the CPU right after it is
//    made (flat_param_to(cpu): its GPU copy freed at wrap time); every all-gather first
//    copies the CPU shard to the GPU (flat_param_to(device): a shard-sized GPU tensor,
//    the all-gather input, dropped once the flat parameter points at the gathered
//    tensor); the reduce-scattered shard gradient is kept on the GPU as
//    _saved_grad_shard while its copy to the pinned CPU gradient runs, and freed only in
//    the final backward callback (prepare_gradient_for_optim deletes it), so the GPU
//    holds the shard gradients of the units done so far until the backward ends. The
//    shard's .grad is the CPU gradient: the optimizer steps on the CPU and owns nothing
//    on the GPU (make_cpu_offloaded_optimizer). Gradient accumulation outside no_sync()
//    overwrites the CPU gradient in torch (a TODO in prepare_gradient_for_backward); the
//    GPU memory of each micro-batch is as modelled.
//  - parallel.fsdp_mixed_precision (MixedPrecision(param_dtype=X, reduce_dtype=X),
//    keep_low_precision_grads False; FlatParamHandle._use_low_precision_shard /
//    post_unshard, _runtime_utils._cast_grad_to_param_dtype): the module is built and
//    sharded in precision.params (fp32); each all-gather first allocates _mp_shard (the
//    shard cast to X), gathers into an X-sized flat parameter and frees _mp_shard; the
//    model computes in X (activations, per-parameter and flat gradients in X); the
//    reduce-scatter output is an X shard, cast to a new fp32 shard (the X one freed),
//    which the optimizer steps as without MixedPrecision.
//  - precision.autocast (without fsdp_mixed_precision): the modules' weights are non-leaf
//    views of the gathered flat parameter, so autocast caches none of their casts
//    (graph/autocast.h set_params_are_views; docs/autocast.md "Under FSDP"); the
//    gathers, shards and gradients stay fp32 and are as without autocast.
//  - parallel.use_orig_params: true (FSDP(use_orig_params=True); docs/fsdp-lora.md,
//    sim/parallel/fsdp_flat_layout.h): each parameter starts at a 16-byte boundary of the
//    flat parameter (alignment padding) and the flat parameter is padded to a multiple of
//    d; the backward's split of the flat parameter into views (SplitWithSizesBackward)
//    allocates zeros for every padding segment before the cat into the flat gradient; the
//    reduce-scattered shard becomes flat_param.grad, and the optimizer steps the original
//    parameters as 1-D views of rank 0's shard (only those that require grad and have
//    elements there; their .grad views of flat_param.grad), so AdamW's state is per view.
//    flat_param.grad is dropped in the next root pre-forward once every view's .grad is
//    None (_reset_flat_param_grad_info_if_needed after zero_grad(set_to_none=True)).
//  - LoRA (lora.*), parallel.fsdp_wrap: block: a block's FlatParameter holds the frozen base
//    weights and the trainable adapters (use_orig_params=True is required, as torch's
//    _validate_tensors_to_flatten does) and requires grad; the weights are views of it,
//    so autograd computes the frozen weights' gradients too (their graph is that of
//    trainable weights: their inputs are saved, their weight gradients computed); the
//    flat gradient, reduce-scatter and shard gradient are full size. The flatten order is
//    PEFT's module order (each adapter after its base layer's weight). The root (embedding,
//    final norm, head: all frozen) has no gradient.
//  - LoRA, parallel.fsdp_wrap: peft (PEFT's fsdp_auto_wrap_policy, installed by the HF
//    Trainer): each lora_A / lora_B Linear is its own unit, nested in its block's; the
//    block units hold only frozen weights (no gradient, resharded after their backward by
//    the reshard-only hook on the block's inputs: here, when the backward first allocates
//    in another layer; block 0, whose input needs no grad, at the final callback). An
//    adapter unit is gathered by its own pre-forward (the adapter's first parameter use)
//    and resharded by its post-forward (before the next allocation after its output); in
//    backward, its pre-backward (the node computing its gradient is about to run)
//    gathers it and prefetches the unit before it in post-forward order (BACKWARD_PRE:
//    block l prefetches its last adapter, the block's first adapter prefetches block
//    l - 1); its post-backward reduce-scatters its gradient. In a checkpoint's re-run an
//    adapter unit is gathered and kept until its post-backward, as the blocks are.
//  - Accelerate's upcast (precision.params bf16 on Accelerate's FSDP1 path:
//    sim/parallel/accelerate_amp.h accelerate_fsdp1_upcast): the model is built, moved,
//    synced (fp32 rotary buffers and bf16 parameters: buckets per dtype) and flattened in
//    bf16, each shard cloned in bf16; after every unit is wrapped, each unit (root first)
//    gets an fp32 copy of its shard, which the optimizer steps, and the bf16 shard is freed
//    (use_orig_params: at the unit's first post-forward, when the original parameters stop
//    viewing it; upcast_shards). Lazy init, gathers, gradients and the step are then those
//    of the fp32-loaded model with MixedPrecision.
// Left out: the all-gather / reduce-scatter staging of NCCL, the rate limiter
// (limit_all_gathers), which only bounds what prefetching already bounds here; pinned
// CPU memory; under MixedPrecision, buffers built in param_dtype rather than fp32 (GPT-2's
// 0-d masked_bias: 2 B per layer); FSDP2 (fully_shard, CPUOffloadPolicy), whose
// offloaded gradients and low-precision casts are managed differently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/runtime.h"
#include "scenario/scenario.h"
#include "sim/optim/optimizer_step.h"
#include "sim/parallel/fsdp_flat_layout.h"

namespace memsim {

class Fsdp : public graph::RuntimeHooks {
 public:
  // FSDP(model): wraps and shards; installs itself as rt's hooks.
  Fsdp(graph::Runtime& rt, const Scenario& scenario);
  ~Fsdp() override;
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  // FSDP root's forward: gathers the root unit, starts a new iteration's hook state.
  void pre_forward(graph::Runtime& rt);
  // The root's post-forward (after the model call, Accelerate's output conversion
  // included): under Accelerate's upcast with use_orig_params, the root's bf16 shard goes.
  void post_forward(graph::Runtime& rt);
  // loss.backward() returned: the root's post-backward (its grads, reshard).
  void post_backward(graph::Runtime& rt);

  void grad_ready(graph::Runtime& rt, int32_t param) override;
  void layer_entered(graph::Runtime& rt, int32_t layer) override;
  void param_used(graph::Runtime& rt, int32_t param, bool backward) override;
  void countdown_done(graph::Runtime& rt) override;

  // CPUOffload(offload_params=True): shards, their gradients and the optimizer are on the CPU.
  bool offloads_params() const { return offload_; }

  // Padded flat-parameter bytes of unit u (0: root, 1 + l: layer l) and one shard's.
  uint64_t unit_bytes(size_t u) const { return units_[u].padded_bytes; }
  uint64_t shard_bytes(size_t u) const { return units_[u].padded_bytes / d_; }
  size_t units() const { return units_.size(); }
  // FullyShardedDataParallel.clip_grad_norm_'s parameters in its order (sim/step/
  // fsdp1_clip_grad.h): the FSDP states' handles in module pre-order (root first), each
  // unit's original parameters that view this rank's shard (use_orig_params: the
  // optimizer's views) or else its sharded FlatParameter. Runtime ids; the caller keeps
  // those with a .grad.
  std::vector<int32_t> clip_order() const;

 private:
  struct Unit {
    std::vector<int32_t> params;  // original parameters (Runtime ids)
    uint64_t padded_numel = 0;    // elements, padded to a multiple of d
    uint64_t padded_bytes = 0;    // in precision.params (the flat parameter and its shards)
    int32_t shard = -1;           // the shard's Runtime parameter id
    graph::Tensor full;           // gathered flat parameter (undefined when sharded)
    uint32_t saved_grad = graph::kNoStorage;  // cpu_offload: the GPU _saved_grad_shard
    size_t ready = 0;             // parameters with a gradient in this backward
    bool forward_done = false;    // resharded after its forward in this iteration
    bool backward_done = false;   // post-backward ran in this iteration
    // --- use_orig_params / LoRA (docs/fsdp-lora.md) ---
    int32_t layer = -1;           // the decoder layer it sits in (-1: the root)
    bool adapter = false;         // fsdp_wrap peft: a lora_A / lora_B Linear's own unit
    bool requires_grad = true;    // FlatParameter.requires_grad: some parameter is trainable
    bool pre_backward_ran = false;
    std::vector<FlatSegment> padding;  // use_orig_params: padding segments of the flat param
    std::vector<int32_t> views;        // use_orig_params: Runtime ids of the optimizer's views
    uint32_t flat_grad = graph::kNoStorage;  // use_orig_params: flat_param.grad (the shard's)
    uint32_t loaded_shard = graph::kNoStorage;  // upcast + use_orig_params: the bf16 shard
  };
  size_t unit_of_layer(int32_t layer) const { return layer < 0 ? 0 : 1 + static_cast<size_t>(layer); }
  void gather(graph::Runtime& rt, size_t u);
  void reshard(graph::Runtime& rt, size_t u);
  void reduce_scatter(graph::Runtime& rt, size_t u);
  void root_pre_backward(graph::Runtime& rt);
  void lazy_init(graph::Runtime& rt);
  void upcast_shards(graph::Runtime& rt);
  void drop_loaded_shard(graph::Runtime& rt, size_t u);
  graph::Tensor named(graph::Runtime& rt, graph::Tensor t, size_t u, const char* what);
  uint32_t unit_name(graph::Runtime& rt, size_t u, const char* what) const;
  void assign_units(graph::Runtime& rt, const Scenario& s);
  void add_views(graph::Runtime& rt);
  void pre_backward_peft(graph::Runtime& rt, size_t u);
  void reshard_forward_adapter(graph::Runtime& rt);

  graph::Runtime* rt_;
  uint64_t d_ = 1;
  uint64_t elem_ = 4;          // the trained shards and sharded grads (trained_param_elem)
  uint64_t load_elem_ = 4;     // precision.params: as built, synced, flattened, first sharded
  uint64_t compute_elem_ = 4;  // MixedPrecision param_dtype (= elem_ without it)
  bool reshard_after_forward_ = true;
  bool offload_ = false;
  std::vector<Unit> units_;
  std::vector<size_t> unit_of_param_;
  std::vector<uint32_t> stamp_;   // iteration in which a parameter last got a gradient
  uint32_t iteration_ = 0;
  size_t forward_unit_ = 0;       // unit whose forward runs (0: root / none)
  bool backward_started_ = false;
  // --- use_orig_params / LoRA ---
  bool orig_params_ = false;      // parallel.use_orig_params
  bool peft_wrap_ = false;        // parallel.fsdp_wrap: peft
  bool prefetch_ = true;          // parallel.fsdp_backward_prefetch: BACKWARD_PRE (else None)
  const bool loss_in_forward_;  // the root's pre-backward fires at the loss (loss_placement.h)
  uint64_t aligned_numel_ = 0;    // use_orig_params: 16 bytes in elements of the compute dtype
  std::vector<size_t> wrap_order_;          // units in wrapping order (inner first)
  std::vector<size_t> module_order_;        // units in module pre-order (lazy init)
  std::vector<size_t> post_forward_order_;  // peft: units in post-forward order
  std::vector<size_t> order_pos_;           // peft: each unit's index in post_forward_order_
  std::vector<char> trainable_;   // per original parameter: requires_grad before wrapping
  std::vector<FlatSegment> offset_of_param_;  // per original parameter: its flat segment
  std::vector<int32_t> module_param_order_;   // original parameters in module order
  static constexpr size_t kNone = static_cast<size_t>(-1);
  size_t blocks_ = 0;             // decoder layers with parameters (units 1..blocks_)
  size_t fwd_adapter_ = kNone;    // peft: adapter unit gathered by its pre-forward
  size_t bwd_block_ = 0;          // peft: block unit whose backward runs (0: none)
};

// The optimizer of a CPU-offloaded FSDP model: it steps the CPU shards with their CPU
// gradients, so its state and temporaries never touch the GPU (no events).
std::unique_ptr<OptimizerSim> make_cpu_offloaded_optimizer();

}  // namespace memsim
