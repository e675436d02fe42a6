// DeepSpeed ZeRO stages 1, 2 and 3 on one simulated rank (cs336, hf-gpt2, hf-llama;
// parallel.sharding: deepspeed, parallel.zero 1-3, the deepspeed section:
// scenario/deepspeed_keys.h). Modelled from DeepSpeed 0.19.6 (github deepspeedai/DeepSpeed
// at edaa7221, 2026-08-22): deepspeed/runtime/zero/stage_1_and_2.py (DeepSpeedZeroOptimizer),
// stage3.py (DeepSpeedZeroOptimizer_Stage3), partition_parameters.py (zero.Init,
// _partition_param, all_gather_coalesced), partitioned_param_coordinator.py (fetch,
// prefetch, release), runtime/zero/config.py, offload_config.py, engine.py
// (_do_optimizer_sanity_check, _configure_zero_optimizer), ops/adam/fused_adam.py.
// docs/deepspeed.md has the full account, the comparison with DeepSpeed's estimators and
// the limits. Rank 0 is simulated (its partitions are the largest: only the last rank's
// are padded).
//
// Notation: d = parallel.data; elem = bytes of precision.params (the "bit16" dtype; fp32
// runs use 4); the trainable parameters (all but LoRA's frozen base) form ONE param group
// (DeepSpeed's own optimizer from the JSON, or the Trainer's trainable parameters).
//
// Stage 1 / 2 (DeepSpeedZeroOptimizer, partition_grads = stage 2):
//  - __init__: empty_cache(); the trainable parameters are flattened: align_dense_tensors'
//    zero pad (to a multiple of 2d elements), the flat bit16 buffer (torch.cat), the pad
//    freed, the parameters' own storages freed (_update_model_bit16_weights: they become
//    views). Rank 0's partition (P = aligned / d elements) is cloned and cast to the fp32
//    master (clone().to(fp32): the bit16 clone is a temporary). initialize_optimizer_states:
//    an fp32 zeros(P) gradient, dropped at once (kept, pinned on the host, with offload).
//  - Stage 2 backward (contiguous_gradients, the default): the first gradient hook of a
//    backward allocates the ipg bucket (reduce_bucket_size elements of bit16; two with
//    overlap_comm). Each gradient is copied into the bucket and its own storage dies (a
//    parameter larger than the bucket keeps its own and is reduced alone); a full bucket is
//    reduced in place: gradients of parameters outside rank 0's partition are dropped, those
//    inside are copied into grads_in_partition (allocated at the first such copy: the
//    summed numel of every parameter that overlaps the partition). The epilogue at the end
//    of backward reduces the rest, frees the bucket, and keeps grads_in_partition alive
//    through averaged_gradients.
//  - Stage 1: gradients stay whole through the backward (the hooks only allocate the
//    bucket); engine.allreduce_gradients -> reduce_gradients then sends every parameter's
//    gradient, in group order, through the stage-2 bucket path (reduce_ipg_grads copies the
//    partition's into grads_in_partition), and the epilogue keeps those (all_grad_tensors).
//  - step (both): the kept gradients are flattened to one bit16 partition (P), cast to fp32
//    (P*4), the bit16 flat and the kept gradients freed, the optimizer steps the fp32 master
//    (FusedAdam: exp_avg, exp_avg_sq zeros_like at the first step, no temporaries; a torch
//    optimizer with optimizer.impl foreach / for-loop: its own temporaries), the fp32 gradient
//    freed, the master copied into the bit16 partition and all-gathered in place.
//  - offload_optimizer cpu (stage 2; DeepSpeedCPUAdam): the master, its gradient, a bit16
//    staging partition and a largest-parameter bit16 buffer are pinned host tensors (Adam's
//    state pageable); the GPU keeps temp_grad_buffer_for_gpu_offload (largest parameter,
//    bit16), the bucket, and per in-partition gradient an fp32 temporary (.float()) copied to
//    the host. No grads_in_partition.
//
// Stage 3 (DeepSpeedZeroOptimizer_Stage3 with DeepSpeedZeRoOffload):
//  - Every parameter (frozen ones too) is partitioned: rank 0 keeps ceil(n/d) elements
//    (ds_tensor) and the parameter's data is freed. With deepspeed.zero_init (the default:
//    transformers' from_pretrained under a ZeRO-3 config) this happens as each parameter is
//    created; without, after the model is built. Parameters of at most
//    stage3_param_persistence_threshold elements persist: they keep their whole data too.
//  - The trainable parameters' partitions are moved into one flat bit16 buffer (defragment,
//    the old partitions freed); the fp32 master per sub group (sub_group_size partition
//    elements) is a cast copy; initialize_optimizer_states allocates and drops an fp32 zeros
//    of the largest sub group; the ipg bucket (reduce_bucket_size, bit16) and the
//    grad_partitions_flat_buffer (the summed partitions, bit16) are allocated and kept.
//  - Fetching: the simulated graph's module changes (transformer layer x embedding / attention
//    / mlp / norm / head) stand for DeepSpeed's submodule hooks. Entering a module releases the
//    previous one's non-persistent parameters and all-gathers the module's missing ones in one
//    coalesced buffer (sum of ceil(n/d)*d elements; the parameters are views of it, so it dies
//    with the last of them). The first iteration records the trace; once it is complete the
//    coordinator prefetches, after each fetch, the next parameters of the trace until
//    stage3_prefetch_bucket_size elements (bounded by stage3_max_live_parameters minus those
//    live), and does not release a parameter that is used again within
//    stage3_max_reuse_distance elements of the trace or was prefetched for a later use.
//  - Gradients: each one is copied into the ipg bucket (its storage dies); a full bucket is
//    reduce-scattered (reduce_scatter_coalesced: an interleaved, padded torch.cat of the bucket's
//    gradients on the reduce stream, allocator stream 1) into the grad partitions buffer and
//    the gradients dropped. With offload_optimizer each partition also passes through a GPU
//    copy and an fp32 cast on its way to the pinned host gradient.
//  - step: all parameters are released; per sub group the partition gradients are flattened
//    (bit16) and cast to fp32, the optimizer steps the fp32 master, the fp32 gradient is
//    freed. With offload_optimizer the master, Adam's state and the gradient buffers are host
//    tensors; with offload_param the bit16 partitions are too, and each fetch copies them to
//    the GPU first (a partition-sized temporary per parameter).
//  - LoRA: the frozen base is partitioned and fetched like any parameter; only the adapters
//    are in the optimizer's groups.
//  - End of each backward (engine._backward_epilogue): the last bucket is reduced
//    (independent_gradient_partition_epilogue), then backward_epilogue ->
//    release_backward_leftovers releases the modules whose post-backward hook never fired
//    (the embedding: its input ids do not require grad), so no gathered parameter outlives
//    a micro-batch.
//
// Gradient accumulation (batch.grad_accum = gas > 1; engine.py is_gradient_accumulation_boundary:
// (micro_steps + 1) % gas == 0, the engine's step runs _take_model_step only then):
//  - Stage 3: every micro-batch's backward reduce-scatters its buckets; partition_grads
//    copies (micro_step_id 0) or add_s (later) rank 0's chunks into the same
//    grad_partitions_flat_buffer (dtype grad_accum_dtype = the model's: no new buffer, no
//    cast); with offload_optimizer the fp32 cast of each partition for the host runs at the
//    boundary micro-batch only. The coordinator's reset_step runs at every forward: the trace
//    is recorded by the first forward+backward of the run and complete from the second on,
//    whether that is the next micro-batch or the next step, so every later micro-batch
//    fetches and prefetches the same way.
//  - Stage 2: the epilogue runs every micro-batch (see above); with offload_optimizer the
//    non-boundary micro-batches accumulate through accumulated_grads_in_cpu (pinned host
//    bit16 copies of the partition's parameters' gradients; on the GPU only views of
//    temp_grad_buffer_for_gpu_offload) and the fp32 cast runs at the boundary only.
//  - Stage 1: engine.allreduce_gradients reduces at the boundary only (reduce_gradients +
//    the epilogue); before it the gradients stay whole and autograd accumulates into them,
//    and the bucket allocated by the first hook (setup_buckets) stays until the epilogue.
// Names (program/tensor_names.h, docs/tensor-names.md): each buffer says what it holds, with
// DeepSpeed's attribute in parentheses ("bf16 flat parameters of group 0 (ZeRO-2
// bit16_groups_flat)", "ZeRO-3 partition of P (ds_tensor)", "ZeRO-3 all-gather of P"); the
// fp32 partitions are the optimizer's parameters, so Adam's state and their gradients are
// "exp_avg of fp32 partition of group 0 (ZeRO-2)", "grad of fp32 partition of sub group 0
// (ZeRO-3)".
// Host memory (Program::host): the buffers listed above that live on the CPU, per rank, and
// the node total for deepspeed.ranks_per_node (default min(d, 8)); NVMe offload counts the
// swap buffers (offload_optimizer.buffer_count fp32 sub groups, offload_param.buffer_count x
// buffer_size bit16) as pinned host memory and the swapped bytes under `nvme`.
// The step's overflow check, gradient norm and clipping and engine.backward's scaled loss
// are sim/parallel/deepspeed_norm.h's (called from step, the hooks and scale_loss).
// Left out (docs/deepspeed.md): NCCL's own buffers; the all-gather after the step (in place);
// the Trainer's two param groups (decay / no decay: a second flat buffer and pad); stage 1's
// gradient reduction path when overlap_comm is on; MiCS, ZeRO++, pipeline parallelism.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "graph/runtime.h"
#include "scenario/scenario.h"
#include "sim/optim/optimizer_step.h"
#include "sim/parallel/deepspeed_norm.h"

namespace memsim {

class DeepSpeedZero : public graph::RuntimeHooks {
 public:
  // deepspeed.initialize(model, ...): partitions and flat buffers (stage 3 with zero_init
  // rewrites the construction events so that each parameter is partitioned as it is made).
  // Installs itself as rt's hooks.
  DeepSpeedZero(graph::Runtime& rt, const Scenario& scenario);
  ~DeepSpeedZero() override;
  DeepSpeedZero(const DeepSpeedZero&) = delete;
  DeepSpeedZero& operator=(const DeepSpeedZero&) = delete;

  // engine.forward: a new micro-step (stage 3: the coordinator's reset_step).
  void pre_forward(graph::Runtime& rt);
  // engine.backward(loss) before loss.backward(): optimizer.scale_if_loss's loss * loss_scale
  // (sim/parallel/deepspeed_norm.h), the root of the backward; the caller drops it after
  // post_backward (engine.backward's local).
  graph::Tensor scale_loss(graph::Runtime& rt, const graph::Tensor& loss);
  // engine.backward's end: the gradient epilogue.
  void post_backward(graph::Runtime& rt);
  // The optimizer the engine steps (wraps `inner`, the optimizer of the fp32 partitions;
  // nullptr: optimizer.type none). With offload_optimizer `inner` is ignored (CPUAdam).
  std::unique_ptr<OptimizerSim> make_step(std::unique_ptr<OptimizerSim> inner);
  // What rank 0 holds on the host (also stored in rt.program().host by the constructor).
  const HostMemory& host() const { return host_; }

  void grad_ready(graph::Runtime& rt, int32_t param) override;
  void layer_entered(graph::Runtime& rt, int32_t layer) override;
  // The first allocation of a forward (pre_forward arms it): the module it runs in is entered.
  void countdown_done(graph::Runtime& rt) override;

  // The optimizer step (called by make_step's wrapper).
  void step(graph::Runtime& rt, OptimizerSim* inner);

  // For tests: rank 0's partition elements (stage 1/2: P; stage 3: summed trainable
  // partitions), the flat bit16 buffer's elements (stage 1/2), grads_in_partition's
  // elements (stage 2, 0 before the first reduction).
  uint64_t partition_numel() const { return partition_numel_; }
  uint64_t flat_numel() const { return flat_numel_; }
  uint64_t grads_in_partition_numel() const { return grads_in_partition_numel_; }

 private:
  struct Gather {                 // one all_gather_coalesced buffer (stage 3)
    uint32_t storage = graph::kNoStorage;
    uint32_t live = 0;            // its parameters still pointing into it
  };
  struct Unit {                   // a (layer, module) of the simulated model
    int32_t layer = -1;
    graph::Module module = graph::Module::none;
    std::vector<int32_t> params;  // non-persistent parameters it uses
  };
  void setup_stage12(graph::Runtime& rt);
  void setup_stage3(graph::Runtime& rt, const Scenario& s);
  void compute_host(const Scenario& s);
  // engine._backward_epilogue for the backward that just ended (post_backward's body).
  void epilogue(graph::Runtime& rt);
  // stage 1/2
  void ensure_buckets(graph::Runtime& rt);
  void bucket_grad12(graph::Runtime& rt, int32_t param);
  void reduce_bucket12(graph::Runtime& rt);
  void take_grad_into_partition(graph::Runtime& rt, int32_t param);
  // stage 3
  size_t unit_for(int32_t layer, graph::Module module);
  void visit(graph::Runtime& rt, size_t unit);
  void fetch(graph::Runtime& rt, const std::vector<int32_t>& params, bool prefetch);
  uint32_t gather_name(graph::Runtime& rt, const std::vector<int32_t>& params, bool prefetch);
  void release_param(graph::Runtime& rt, int32_t param);
  void release_all(graph::Runtime& rt);
  void reduce_bucket3(graph::Runtime& rt);
  uint32_t named(graph::Runtime& rt, uint32_t storage, std::string_view name);
  uint32_t alloc(graph::Runtime& rt, uint64_t bytes, TensorKind kind, std::string_view name, uint8_t stream = 0);
  uint32_t alloc(graph::Runtime& rt, uint64_t bytes, TensorKind kind, uint32_t name_id, uint8_t stream = 0);
  // Names used every iteration, interned once (no string is built on the hot path): a
  // slot per kind of buffer, indexed by parameter, bucket or sub group.
  enum NameSlot { kToDevice, kGradToGpu, kGradFp32, kGradHostCast, kBucket, kStepFlat, kFixed, kSlots };
  template <class Make>
  uint32_t cached_name(graph::Runtime& rt, NameSlot slot, size_t index, Make make);
  std::vector<uint32_t> name_cache_[kSlots];

  graph::Runtime* rt_;
  int stage_ = 3;
  uint64_t d_ = 1;
  uint64_t elem_ = 2;
  DeepSpeedConfig c_;
  bool offload_opt_ = false;
  bool offload_param_ = false;
  std::string zero_;  // "ZeRO-2": in the names of the buffers (program/tensor_names.h)
  std::string bits_;  // the parameters' dtype ("bf16"), likewise
  std::vector<int32_t> trainable_;      // parameter ids in group order
  std::vector<uint64_t> numel_;         // by parameter id (model parameters only)
  std::vector<bool> persistent_;        // stage 3
  std::vector<bool> in_partition_;      // stage 1/2: overlaps rank 0's partition
  std::vector<bool> is_trainable_;
  uint64_t partition_numel_ = 0, flat_numel_ = 0, grads_in_partition_numel_ = 0;
  uint64_t largest_param_ = 0;
  std::vector<uint64_t> sub_groups_;    // stage 3: partition elements per sub group
  int32_t master_ = -1;                 // fp32 master partition (a Runtime parameter), -1: on the host
  std::vector<int32_t> masters3_;       // stage 3: one per sub group
  // buffers
  std::vector<uint32_t> ipg_;           // ipg bucket storage(s) while allocated
  uint64_t bucket_elements_ = 0;
  std::vector<int32_t> bucket_params_;
  std::vector<int32_t> extra_large_;    // stage 1/2: gradient kept in its own storage
  uint32_t grads_in_partition_ = graph::kNoStorage;
  std::vector<uint32_t> held_;          // averaged gradients kept for the step (stage 1/2)
  bool backward_seen_ = false;
  bool in_backward_ = false;
  uint64_t gas_ = 1;                    // batch.grad_accum (gradient_accumulation_steps)
  uint64_t backwards_ = 0;              // backwards completed so far (the engine's micro_steps)
  // engine.is_gradient_accumulation_boundary() for the backward now running.
  bool boundary() const { return (backwards_ + 1) % gas_ == 0; }
  // stage 3 coordinator
  std::vector<Unit> units_;
  std::vector<std::vector<size_t>> units_of_param_;
  std::vector<size_t> trace_, recording_;  // unit visits of a complete iteration / this one
  bool trace_complete_ = false;
  size_t step_ = 0;                     // visits so far in this iteration
  size_t current_ = SIZE_MAX;           // unit being run
  std::vector<Gather> gathers_;
  std::unordered_map<uint64_t, uint32_t> gather_names_;  // hash of a gathered list -> name id
  std::vector<int32_t> gather_of_;      // by parameter: index into gathers_, -1: not gathered
  std::vector<size_t> fetched_for_;     // most recent trace step a parameter was fetched for
  size_t queue_pos_ = 0;                // prefetch queue position (index into queue_)
  std::vector<std::pair<size_t, int32_t>> queue_;  // (trace step, parameter) in use order
  uint64_t available_ = 0;              // gathered non-persistent elements
  HostMemory host_;
  // The step's overflow check, gradient norm and clipping, the loss scaling
  // (sim/parallel/deepspeed_norm.h), and what it needs: stage 1/2 each partition
  // gradient's elements inside rank 0's partition (by parameter id; in group order),
  // stage 3 each sub group's partition elements per parameter.
  std::unique_ptr<DeepSpeedNorm> norm_;
  std::vector<uint64_t> in_partition_numel_;
  std::vector<uint64_t> partition_grads_;
  std::vector<std::vector<uint64_t>> sub_group_parts_;
  std::vector<uint64_t> sub_group_counts_;  // parameters per sub group
  bool busy_ = false;                   // DeepSpeed's own allocations: no module hooks
};

// DeepSpeed's FusedAdam (ops/adam/fused_adam.py) on the fp32 partitions: exp_avg and
// exp_avg_sq zeros_like at the first step, no temporaries, no device step tensor.
std::unique_ptr<OptimizerSim> make_deepspeed_fused_adam();

}  // namespace memsim
