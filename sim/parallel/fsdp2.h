// PyTorch FSDP2 (`fully_shard`) on one simulated rank (cs336, hf-gpt2, hf-llama;
// parallel.sharding: fsdp2): fully_shard on every transformer block, then on the root
// (embeddings, final norm, LM head), as torchtitan's apply_fsdp does.
//
// Modelled from pytorch/pytorch at commit 010ae4a89516fa3be548ab16dff711414ec12d0b
// (main, 2026): torch/distributed/fsdp/_fully_shard/_fsdp_param.py (FSDPParam),
// _fsdp_param_group.py (FSDPParamGroup), _fsdp_collectives.py (foreach_all_gather,
// foreach_all_gather_copy_out, foreach_reduce); _fsdp_state.py (root pre/post-forward and
// the final backward callback) as stored at 01c9f4fc. docs/fsdp2.md walks through the
// rules with byte counts; what follows is the event contract.
//
// Notation: ws = parallel.data / parallel.replicate x parallel.context (the shard group), e = a parameter's
// element bytes (precision.params, or lora.adapter_dtype for adapters), p = param_dtype
// bytes (parallel.fsdp_mixed_precision; = e without it), r = reduce bytes
// (parallel.reduce_dtype; without it the gradients' dtype p). Per parameter of shape
// (rows, ...): padded shard = ceil(rows / ws) rows (torch.chunk's chunk 0, which rank 0
// owns), padded full = padded shard x ws. Streams (MemoryEvent::stream): 1 = the
// all-gather copy-in stream, 2 = the reduce-scatter stream, 3 = the HSDP all-reduce
// stream; everything else is on the default stream 0. Each block returns to its own
// stream's pool (no record_stream in FSDP2: lifetimes come from the references below).
//  - fully_shard (setup; blocks 0..L-1, then the root): per parameter of the group a
//    padded shard (new_zeros, e bytes each) becomes the new nn.Parameter (a DTensor: the
//    optimizer steps these); the original parameters are freed when fully_shard returns
//    (its `params` list held them). parallel.fsdp_init: cpu = the model was built on the
//    meta device (torchtitan): the originals take no memory and the shards are
//    allocated by to_empty, in module order. parallel.cpu_offload (CPUOffloadPolicy):
//    shards live on the CPU (a GPU-built shard is copied there and freed at once).
//  - Unshard (foreach_all_gather, on stream 1): with mixed precision and no offload,
//    one flat param_dtype copy of the group's shards (flat_foreach_copy_input); with
//    offload, per parameter shard.to(device) (e) and, with mixed precision, its cast (p;
//    the e copy freed at once); then the flat all-gather output (sum of the inputs x
//    ws); the inputs are dropped when foreach_all_gather returns.
//  - Copy-out (wait_for_unshard, default stream): per parameter the unsharded tensor
//    (padded full x p; all_gather_outputs[0], storage resize_(full)), then the flat
//    output: in forward it stays in all_gather_state and is freed by the next group's
//    wait_for_unshard (before that group's copy-out) or by the root's post-forward
//    (when model.forward returns: after the LM head, or after the loss when the model
//    computes it); in backward it is freed right after the copy-out.
//  - Post-forward (blocks only: the root is never resharded after forward): reshard =
//    free the unsharded tensors (resize_(0)). reshard_after_forward N: first a clone of
//    this rank's 1/N slice of each unsharded tensor (padded full x p / N, default
//    stream), which the backward all-gathers from (N ranks) and frees after its copy-out.
//    false: nothing is freed until after backward.
//  - Backward: the root's pre-backward unshards the last block (prefetch: the flat output
//    only). It is a tensor hook on the root's forward outputs that require grad
//    (_fsdp_state.py _register_pre_backward_hook, torch 2.11): the logits' gradient, i.e.
//    the head's first backward op, when the loop computes the loss after the model
//    returns; the loss's first backward op when the model computes it inside its forward
//    (sim/step/loss_placement.h: HF Trainer's compute_loss, Liger's forward), whose
//    post-forward (all_gather_state freed) then also comes after the loss. Each block's
//    pre-backward (its first backward allocation) copies out and prefetches the previous
//    block. Post-backward: reshard, free the previous
//    group's reduce-scatter input (reduce_scatter_states), then foreach_reduce: the
//    reduce-scatter input (sum of padded full x r, default stream; a narrowing cast
//    first copies into a grad-dtype buffer of the same numel), the unsharded gradients
//    freed, the output (sum of padded shards x r, stream 2), cast to e when r != e
//    (stream 2, or 3 under HSDP; the r output is dropped at return unless HSDP keeps it
//    in _all_reduce_state until the end of backward, PR #140044). Every trainable
//    shard's .grad views that one output (accumulated into under grad_accum); offload:
//    the gradient is copied to the CPU and nothing stays on the GPU. The input stays
//    until the next group's post-backward or the final callback.
//  - When a block's post-backward runs (every layout): FSDP2 has no AccumulateGrad hook;
//    FSDPParamGroup.pre_forward wraps the block's inputs that require grad in
//    RegisterPostBackwardFunction, whose backward calls post_backward once the gradient of
//    the block's input is complete (torch 010ae4a8 _fully_shard/_fsdp_param_group.py
//    _register_post_backward_hook, RegisterPostBackwardFunction.backward; the same in
//    2.11). That is after the block's whole backward (for an HF or torchtune block, its
//    input norm's backward and the residual sum), so memsim emits it before the first
//    allocation of another group (the block below, its checkpoint re-run, the embedding),
//    not at the block's last AccumulateGrad: under LoRA the frozen projections' and norms'
//    backward lies between the two. Block 0's input is the embedding's output: it requires
//    grad only when an embedding parameter is trainable or PEFT's
//    enable_input_require_grads hook is on (lora.input_require_grads); else block 0 has no
//    post-backward before the final callback, which runs the root's first. When it does and
//    nothing allocates after it (a frozen embedding under the hook), it runs before the
//    final callback's.
//  - The final callback (loss.backward() returns): post-backward of the groups that
//    had none (the root first), HSDP buffers freed, the last reduce-scatter input freed.
//  - Autocast (precision.autocast, fp32 parameters, no mixed precision): nothing here
//    changes. The unsharded parameter is a leaf nn.Parameter, so graph::Autocast caches its
//    cast as on one GPU; the cast lives until the region exits (or its op's backward), not
//    until this reshard (resize_(0) leaves the cache's key and value alone).
//  - LoRA (lora.*): frozen parameters are sharded and gathered like the others but get
//    no gradient, no reduce-scatter and no optimizer state.
//  - Float8 all-gather (precision.float8_all_gather; torchao/float8/fsdp_utils.py @36027d8:
//    WeightWithDynamicFloat8CastTensor, whose fsdp_pre_all_gather / fsdp_post_all_gather
//    FSDPParam calls, _fsdp_param.py all_gather_inputs / init_unsharded_param): every
//    block matrix (a Float8Linear weight: the scenario reader allows only the llama row)
//    is all-gathered as e4m3, 1 byte per element; the rest of the group (the norms) as
//    before. In unshard, first, per float8 parameter in group order (the 1st pass of
//    _get_param_all_gather_inputs), on stream 1: the shard's cast, n = shard numel, e its
//    bytes: dynamic (hp_tensor_to_float8_dynamic(reduce_amax=True), graph/ops/
//    float8_cast.h with in_elem e and the amax all-reduce's clone): abs [e*n], amax,
//    all-reduced amax, the f64 temporaries, the 0-d fp32 scale (kept), then the cast
//    (e = 4: no to(float32) copy) [4n, 4n], the e4m3 input [n]; precomputed
//    (precision.float8_precompute_scale, after the first optimizer step): the scale is a
//    view of the precomputed vector, only the cast. Then the flat param_dtype copy of the
//    other parameters (2nd pass), then the flat output: sum of the input bytes x ws
//    (_get_all_gather_input_metadatas: mixed dtypes gather as uint8 bytes). The copy-out
//    allocates each float8 parameter's unsharded tensor at padded full x 1 byte; its
//    init_unsharded_param (fsdp_post_all_gather(out=)) makes the new scale the unsharded
//    parameter's (graph::Parameter::float8_scale, which the Float8Linear saves:
//    graph/ops/ops_float8.h) and drops the previous one (a saved reference keeps it until
//    that linear's backward). Precompute (post_optimizer_step): _foreach_norm(ord=inf)
//    (its CUDA kernel's zeros(N x chunks) and zeros(320) fp32 workspaces, N 0-d norms, a
//    0-d global norm; the three workspaces die at return), stack [4N], the DTensor
//    Partial -> Replicate all-reduce's clone [4N], clamp [4N], the two die, to(f64) [8N],
//    the clamp dies, reciprocal and product [8N each], the reciprocal dies, to(f32) [4N]
//    (kept: the new vector); the shards' references move to it (the old vector lives on
//    in the unsharded parameters' scales until their next copy-out); at return the N
//    norms and the f64 amax and product die. N = float8 parameters, chunks =
//    ceil(largest shard numel / 65536) (MultiTensorApply's kChunkSize).
//    Refused (sim/parallel/fsdp2_checks.h): reshard_after_forward N (FSDPParam raises
//    NotImplementedError for an extension in SHARDED_POST_FORWARD), CPU offload, a
//    Float8Linear whose out-features the shard group does not divide.
//  - torchtune's layout (model.implementation torchtune; sim/parallel/fsdp2_layout.h has
//    the source): tok_embeddings and output, when parallel.custom_sharded_layers names
//    them, are groups of their own (after the blocks: 1 + L, then 2 + L), the root keeps
//    the rest (the final norm). The output module runs once per logits chunk (eight
//    calls): each call is a pre-forward (unshard, copy-out; the previous call's
//    post-forward first) and, in backward, a pre-backward and a post-backward of its own
//    (each chunk's hook calls FSDPParamGroup.pre_backward, whose only guard is the
//    PRE_BACKWARD state the previous call's post_backward left; each call's
//    RegisterPostBackwardFunction runs post_backward), the sharded gradient accumulated
//    into the first call's reduce-scatter output. tok_embeddings' inputs need no grad: its
//    post-backward is the final callback's, after the root's (all_states order: root,
//    tok_embeddings, layers, output). The root is resharded after forward (shard_model
//    passes reshard_after_forward explicitly, which torch 2.11 honours for the root) and
//    unsharded again by its pre-backward. Backward prefetch follows the post-forward
//    order with multiplicity (_record_post_forward, _backward_prefetch). The model was
//    built on the meta device; load_from_full_model_state_dict then copies each full
//    parameter to the GPU, takes rank 0's chunk (distribute_tensor's scatter output) and
//    drops the full copy, in state-dict order; cleanup_before_training empties the cache.
//    Block 0's post-backward is only the final callback's when tok_embeddings is frozen
//    (the rule for every layout, above).
//    LoRA (lora_finetune_distributed): the adapters' shards are allocated (to_empty) before
//    the base load, which skips them (none with cpu offload: lora_device cpu). A frozen
//    output's calls are seen at its matmul nodes (graph Node::param names the frozen weight:
//    param_used in backward); each call's post-backward follows at the next call's hook or,
//    for the last call, at the next allocation (countdown_done): it only reshards.
//  - torchtitan's layout (model.implementation torchtitan; sim/parallel/fsdp2_layout.h):
//    tok_embeddings is a group of its own (1 + L, resharded after forward like the blocks,
//    post-backward in the final callback), the final norm and the output one group (2 + L,
//    called once: unsharded at the norm's first op, kept gathered after forward, its
//    pre-backward at the head's first backward op, before the root's hook on the same
//    logits, its post-backward once both gradients are in). The root owns no parameter:
//    no all-gather, no reduce-scatter. Built on the meta device (to_empty: the shards).
//  - Accelerate's layouts (parallel.accelerate_version; sim/parallel/fsdp2_layout.h):
//    before v1.14 the default groups with the root resharded after forward when
//    parallel.reshard_after_forward is true (the plugin's value passed to the root); from
//    v1.14 torchtitan's groups over transformers' names (model.embed_tokens alone,
//    [model.norm, lm_head] kept gathered after forward, an empty root). On a PeftModel the
//    tail is [lm_head] alone (the final norm in the root): frozen and called once, its
//    post-backward runs at its input's gradient (before the next group's first allocation,
//    as a block's); a frozen embedding whose output PEFT's input-grads hook made require
//    grad copies out its prefetched all-gather after block 0's post-backward. Tied: the
//    embedding's group is [model.norm, model.embed_tokens] (post-forward after the norm,
//    kept), the root's parameter lm_head.weight (the graph untied), sharing the embedding's
//    shard and reducing its gradient into the embedding shard's .grad.
// Left out: NCCL's own buffers; unshard_async_op / explicit prefetch lists
// (set_modules_to_forward_prefetch); rank 0 stands for all ranks (it always holds the
// padded chunk 0); pinned CPU memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/runtime.h"
#include "scenario/scenario.h"

namespace memsim {

inline constexpr uint8_t kAllGatherStream = 1;      // all_gather_copy_in_stream
inline constexpr uint8_t kReduceScatterStream = 2;  // reduce_scatter_stream
inline constexpr uint8_t kAllReduceStream = 3;      // all_reduce_stream (HSDP)

class Fsdp2 : public graph::RuntimeHooks {
 public:
  // fully_shard(block) for each block, then fully_shard(model); installs itself as hooks.
  Fsdp2(graph::Runtime& rt, const Scenario& scenario);
  ~Fsdp2() override;
  Fsdp2(const Fsdp2&) = delete;
  Fsdp2& operator=(const Fsdp2&) = delete;

  // The root's pre-forward (model(x) called) and post-forward (it returned).
  void pre_forward(graph::Runtime& rt);
  void post_forward(graph::Runtime& rt);
  // loss.backward() returned: _root_post_backward_final_callback.
  void post_backward(graph::Runtime& rt);
  // optimizer.step() returned: torchtitan's float8 converter then calls
  // precompute_float8_dynamic_scale_for_fsdp (precision.float8_precompute_scale).
  void post_optimizer_step(graph::Runtime& rt);

  void grad_ready(graph::Runtime& rt, int32_t param) override;
  void layer_entered(graph::Runtime& rt, int32_t layer) override;
  // torchtune's output group: each call's pre-forward / pre-backward (Runtime::param_hooks).
  void param_used(graph::Runtime& rt, int32_t param, bool backward) override;
  // A frozen output's last call: its post-backward before the next allocation.
  void countdown_done(graph::Runtime& rt) override;

  // torchtune's recipe empties the cache after its setup (cleanup_before_training).
  bool empties_cache_before_training() const { return tune_load_; }
  // The groups of torchtune's custom_sharded_layers (0: none).
  size_t embedding_group() const { return emb_group_; }
  size_t output_group() const { return out_group_; }

  // CPUOffloadPolicy: shards, their gradients and the optimizer are on the CPU.
  bool offloads_params() const { return offload_; }

  // Introspection (tests): group g (0: root, 1 + l: block l).
  size_t groups() const { return groups_.size(); }
  // Bytes of the group's padded shards (sum over its parameters, e each).
  uint64_t shard_bytes(size_t g) const;
  // Bytes of its unsharded parameters (padded full x p, x 1 for float8-gathered weights) =
  // its flat all-gather output.
  uint64_t unsharded_bytes(size_t g) const;
  // Parameters all-gathered as float8 (precision.float8_all_gather).
  size_t float8_params() const { return n_float8_; }

 private:
  enum class State : uint8_t { sharded, post_forward, unsharded };
  struct Param {
    int32_t orig = -1;              // the module's parameter (Runtime id)
    int32_t shard = -1;             // the sharded nn.Parameter (Runtime id)
    uint64_t shard_numel = 0;       // padded chunk 0
    uint64_t full_numel = 0;        // shard_numel x ws
    uint64_t elem = 4;              // e
    uint64_t unsharded_elem = 4;    // p
    bool trainable = true;
    bool float8 = false;            // all-gathered as e4m3 (WeightWithDynamicFloat8CastTensor)
    size_t group = 0;
    uint32_t scale = graph::kNoStorage;          // float8: the unsharded parameter's _scale
    uint32_t pending_scale = graph::kNoStorage;  // all_gather_metadata until the copy-out
    uint32_t unsharded = graph::kNoStorage;     // all_gather_outputs[0] (when unsharded)
    uint32_t post_forward = graph::kNoStorage;  // _sharded_post_forward_param_data
    // Names (program/tensor_names.h), interned at setup: "FSDP2 shard of P (padded chunk 0)",
    // "FSDP2 unsharded P (all_gather_outputs)", "FSDP2 post-forward shard of P".
    uint32_t shard_name = 0, unsharded_name = 0, post_forward_name = 0;
  };
  struct Group {
    std::vector<size_t> params;     // indices into params_
    size_t trainable = 0;
    size_t ready = 0;               // trainable parameters with a gradient this backward
    State state = State::sharded;
    uint32_t all_gather = graph::kNoStorage;  // _all_gather_result's output (pending)
    uint32_t all_reduce = graph::kNoStorage;  // HSDP _all_reduce_state
    bool forward_done = false;
    bool pre_backward_done = false;
    bool backward_done = false;
    // torchtune's output: called once per logits chunk, each call a pre/post-forward and a
    // pre/post-backward of its own.
    bool per_call = false;
    // No RegisterPostBackwardFunction (the group's inputs need no grad: the root, a
    // separately sharded tok_embeddings): post_backward runs in the final callback only.
    bool post_backward_in_callback = false;
    std::vector<size_t> post_forward_indices;  // _post_forward_indices (into post_forward_order_)
    // The reports' names of its flat all-gather output and reduce-scatter input ("... of
    // block 7"), interned once at construction.
    uint32_t all_gather_name = 0, reduce_scatter_name = 0;
  };
  // The group of an allocation in transformer layer `layer` (-1: outside the blocks) and
  // module `module`.
  size_t group_at(int32_t layer, graph::Module module) const {
    if (layer >= 0) return 1 + static_cast<size_t>(layer);
    if (module == graph::Module::embedding && emb_group_ != 0) return emb_group_;
    if (module == graph::Module::head && out_group_ != 0) return out_group_;
    if (module == graph::Module::norm && norm_with_output_) return out_group_;  // the final norm
    if (module == graph::Module::norm && norm_with_emb_) return emb_group_;
    return 0;
  }
  // FSDPParamGroup.post_forward's bookkeeping: resharding (blocks, and the root when it
  // reshards) and _record_post_forward.
  void group_post_forward(graph::Runtime& rt, size_t g);
  std::string group_label(size_t g) const;  // "the root", "block 3", "output" (report names)
  void output_post_forward(graph::Runtime& rt);
  void shard_group(graph::Runtime& rt, size_t g);
  // fsdp_pre_all_gather of float8 parameter i (stream 1): its e4m3 input; sets pending_scale.
  uint32_t float8_pre_all_gather(graph::Runtime& rt, Param& p);
  // Stream of every event emitted by f (the `with stream(...)` around it); op names them.
  template <class F>
  void on_stream(graph::Runtime& rt, uint8_t stream, uint32_t op, F&& f);
  uint64_t gather_elem(const Param& p) const { return p.float8 ? 1 : p.unsharded_elem; }
  void unshard(graph::Runtime& rt, size_t g);
  void wait_for_unshard(graph::Runtime& rt, size_t g, bool forward);
  void reshard_after_forward(graph::Runtime& rt, size_t g);
  void reshard(graph::Runtime& rt, size_t g);
  void pre_backward(graph::Runtime& rt, size_t g);
  void root_pre_backward(graph::Runtime& rt);
  void group_post_backward(graph::Runtime& rt, size_t g);
  // Block g's post-backward at its input's gradient, its events labelled with its layer.
  void deferred_post_backward(graph::Runtime& rt, size_t g);
  // After block 0's post-backward: a frozen separate embedding's pre-backward hook on its
  // output, when PEFT's input-grads hook made that output require grad.
  void frozen_embedding_output_hook(graph::Runtime& rt);
  uint32_t alloc(graph::Runtime& rt, uint64_t bytes, TensorKind kind, uint8_t stream,
                 uint32_t name);

  graph::Runtime* rt_;
  uint64_t ws_ = 1;               // shard group size
  uint64_t post_ws_ = 0;          // reshard_after_forward N (0: none)
  bool reshard_after_forward_ = true;
  bool offload_ = false;
  bool meta_init_ = false;
  bool hsdp_ = false;
  bool mixed_precision_ = false;
  // The loss is one of the root's forward outputs (sim/step/loss_placement.h): the root's
  // pre-backward runs at the loss's first backward op, not the head's.
  bool loss_in_forward_ = false;
  DType grad_dtype_ = DType::fp32;       // the unsharded gradients' dtype
  DType orig_grad_dtype_ = DType::fp32;  // the sharded (trainable) parameters' dtype
  DType reduce_dtype_ = DType::fp32;     // reduce_dtype, or the gradients' dtype (None)
  // Float8 all-gather: how many parameters, whether scales are precomputed after each
  // step, and the current precomputed vector (the shards' _precomputed_scale; kNoStorage
  // before the first optimizer step: the dynamic path).
  size_t n_float8_ = 0;
  bool precompute_scale_ = false;
  uint32_t precomputed_ = graph::kNoStorage;
  std::vector<Param> params_;
  std::vector<Group> groups_;
  std::vector<int32_t> param_of_orig_;  // Runtime id -> index into params_ (-1: none)
  std::vector<uint32_t> stamp_;         // iteration in which an orig last got a grad
  uint32_t iteration_ = 0;
  uint32_t all_gather_state_ = graph::kNoStorage;     // comm_ctx.all_gather_state
  uint32_t reduce_scatter_state_ = graph::kNoStorage; // comm_ctx.reduce_scatter_states
  size_t forward_group_ = 0;      // block whose forward runs (0: none)
  // torchtune's layout (sim/parallel/fsdp2_layout.h).
  size_t blocks_ = 0;             // L: groups 1..L are the blocks
  size_t emb_group_ = 0, out_group_ = 0;
  int32_t out_param_ = -1;        // output.weight (Runtime id of the module's parameter)
  bool hf_names_ = false;         // transformers' module names in the group labels
  bool root_reshards_ = false;    // reshard_after_forward given explicitly to the root
  bool tune_load_ = false;        // load_from_full_model_state_dict, cleanup_before_training
  bool lora_to_empty_ = false;    // lora_finetune_distributed: adapters to_empty before the load
  // A block's post-backward at its input's gradient (RegisterPostBackwardFunction), not at
  // its last AccumulateGrad. Block 0's input (the embedding's output) requires grad: an
  // embedding parameter is trainable, or PEFT's enable_input_require_grads hook.
  bool first_input_grad_ = false;
  size_t backward_block_ = 0;     // the block whose backward runs, its post-backward pending
  // torchtitan's layout: the final norm in the output's group, kept gathered after forward.
  bool norm_with_output_ = false;
  bool output_keeps_ = false;
  // Accelerate >= 1.14, tied embeddings (sim/parallel/fsdp2_layout.h): [model.norm,
  // model.embed_tokens] one group kept gathered, its post-forward after the final norm; the
  // root's lm_head.weight (params_ index head_param_) shares the embedding's shard
  // (params_ index emb_param_) and hands its reduce-scattered gradient to it.
  bool norm_with_emb_ = false;
  bool emb_keeps_ = false;
  int32_t head_param_ = -1, emb_param_ = -1;
  bool final_norm_ran_ = false;  // this forward reached the final norm (the group's last module)
  bool out_post_forward_pending_ = false;   // an output call returned; its post-forward follows
  bool out_post_backward_pending_ = false;  // an output call's backward ran; its post-backward follows
  std::vector<size_t> post_forward_order_;  // comm_ctx.post_forward_order (with multiplicity)
  std::vector<size_t> state_order_;         // _state_ctx.all_states (the final callback's order)
  bool backward_started_ = false;
  // Interned names (the per-parameter ones are in Param).
  uint32_t n_flat_in_, n_offload_in_, n_ag_out_, n_rs_in_, n_rs_cast_, n_rs_out_, n_grad_cast_;
  uint32_t n_f8_in_, n_f8_scale_, n_f8_vector_, n_f8_op_, n_f8_pre_op_;
};

}  // namespace memsim
