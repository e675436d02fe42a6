// Activation checkpointing: torch.utils.checkpoint(fn, *inputs, use_reentrant=False)
// emulated on graph::Runtime (aten-saved-tensors.md §F).
//
// How a family uses it. Emitters open *candidate regions* and never decide anything:
//   x = run_layers(rt, L, x, extra, block);            // the transformer layer loop
//   a = run_region(rt, RegionKind::attention, {x}, fn); // inside a layer
// With no engine installed (rt.checkpoint == nullptr) or a plan that keeps the region,
// these call the emitter directly: the event stream is the same as without them.
//
// What a checkpointed region does (the engine, installed for one Runtime):
//  - Forward: fn runs with grad mode on, so nodes and edges are recorded as usual, but
//    every tensor a node would save becomes a placeholder (the pack hook keeps nothing).
//    Intermediates therefore die at their last Python reference. The region's inputs are
//    kept alive (the checkpoint frame holds them) until the last placeholder of the
//    region is released.
//  - Backward: the first time the engine runs a node of the region that has
//    placeholders (its first unpack), fn is re-run on the same inputs with grad mode on,
//    inside backward (events in Phase::backward, forward op names, the autograd thread's
//    cuBLAS workspace, FLOPs counted in Program::flops.recompute). The k-th save of the
//    re-run fills the k-th placeholder (a reference, no copy); everything else the re-run
//    allocates dies with its Python name, and the re-run's own graph is discarded.
//    With early_stop (torch >= 2.1's default) the re-run is abandoned right after the
//    last placeholder is filled; without it (torch 1.13) fn runs to its end.
//  - A recomputed tensor is then released like any saved tensor: when the node holding
//    it has run (so a region's saved set drains progressively through its backward).
//  - Regions do not nest: a candidate region opened inside a checkpointed region (in its
//    forward or its re-run) runs plainly. With grad mode off a region runs plainly.
//  - Reentrant mode (plan.reentrant: torch.utils.checkpoint(use_reentrant=True), which
//    Hugging Face's gradient_checkpointing_enable() passes by default, and Megatron-LM's
//    own tensor_parallel.CheckpointFunction): the forward runs under no_grad and saves
//    only the inputs, which keeps the same bytes as the placeholders above. In backward
//    the checkpoint's node re-runs the whole region with grad (no early stop), then calls
//    torch.autograd.backward(outputs, grads) on the re-run's graph: the re-run's output
//    stays alive until that inner backward is done. The engine models exactly those two
//    differences: the re-run goes to its end, and its output is held with the frame
//    (freed when the region's last saved tensor is released). The grad arriving at the
//    region's output is held as long (CheckpointFunction.backward's `args`, which the
//    inner backward's root also keeps), and the re-run starts when the output's node is
//    about to run (CheckpointFunctionBackward is that node), saves or not.
//  - Reentrant mode, the checkpoint's non-tensor arguments (ctx_held): CheckpointFunction
//    .forward puts the tensor arguments in ctx.save_for_backward (released when its node has
//    run, like the frame above) but keeps every other argument as it is in ctx.inputs, and
//    the function in ctx.run_function; backward never clears either (torch/utils/
//    checkpoint.py, pytorch 0008d771 and torch 1.13). The ctx belongs to the node, which
//    lives until the autograd graph dies (the output that holds it is rebound or deleted,
//    graph_died), not until its backward. So a tensor that reaches the call inside a
//    Python object (HF's position_embeddings tuple (cos, sin); in transformers 5.x every
//    keyword argument, bound into functools.partial(super().__call__, **kwargs) by
//    GradientCheckpointingLayer) stays alive after backward, until the graph dies. The
//    emitter names those inputs (ctx_held, in the order the ctx's death frees them);
//    when the frame drops they move to a hold keyed by the region's graph. Non-reentrant
//    checkpointing keeps non-tensor arguments in the frame, which dies with the region's
//    saved tensors: ctx_held is ignored there.
//  - Autocast (set_autocast): a region opened while torch.autocast is active records it,
//    as torch.utils.checkpoint records the autocast state (_get_autocast_kwargs), and its
//    re-run happens inside a nested autocast context with an empty weight-cast cache
//    (graph/autocast.h enter_nested), so the weights are cast again. The context exits
//    when the re-run ends (after fn returns, or while the early stop unwinds, before the
//    re-run's locals die); its exit clears the cache, and the recomputed casts live on
//    only as the saved tensors they fill. The re-run's output (non-reentrant: `_unused`
//    in unpack; reentrant: `outputs`) outlives that exit.
//  - Selective checkpointing (plan.selective: torch.utils.checkpoint's context_fn =
//    create_selective_checkpoint_contexts(policy_fn), torch/utils/checkpoint.py
//    _CachingTorchDispatchMode / _CachedTorchDispatchMode). In a checkpointed region's
//    forward, each op the policy saves (MUST_SAVE) has its outputs stored in the frame's
//    cache (a detached alias: the storage stays alive) besides everything above; the
//    policy is asked once per op call, so a rule that counts calls (torchtitan's "every
//    other mm") counts them per region. In the re-run the same op hands back its cached
//    outputs instead of running (no allocation, no kernel, no FLOPs; the cache entry is
//    _CONSUMED, so the reference moves to the re-run's tensor). Entries the re-run never
//    reaches (early stop) live with the frame, and die with it. Only the ops that call
//    detail::sac_reused / sac_cache (graph/ops/op_helpers.h) can be saved: every other op
//    is recomputed, which is the policy's answer for any op outside its save list.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "graph/runtime.h"

namespace memsim::graph {

// The candidate regions emitters open.
enum class RegionKind : uint8_t {
  layers,          // one or more consecutive transformer layers (run_layers)
  attention,       // the attention half of a layer: its norm + self-attention
  mlp,             // the MLP half of a layer: its norm + feed-forward
  core_attention,  // QK^T, softmax, dropout, attn·V (Megatron's selective recompute)
};

// What one layer checkpoints.
enum class LayerCheckpoint : uint8_t {
  keep,            // nothing
  core_attention,  // selective
  attention,       // the attention half
  mlp,             // the MLP half
  modules,         // attention half and MLP half, as two regions
  layer,           // the whole layer (possibly grouped with neighbours, see segment)
};
inline constexpr int kLayerCheckpointCount = 6;
const char* to_string(LayerCheckpoint c);

// An op-level selective checkpointing policy (see the file comment): per op kind, what
// the policy function answers for a call of that op in a checkpointed region.
enum class SacRule : uint8_t {
  recompute,  // PREFER_RECOMPUTE (every op outside the save list)
  save,       // MUST_SAVE
  save_odd,   // MUST_SAVE on the region's 1st, 3rd, 5th... call of this kind, else
              // PREFER_RECOMPUTE (torchtitan's mm rule; one kind per policy at most)
};
struct SelectivePolicy {
  std::array<SacRule, kOpKindCount> rule{};  // all recompute
  bool any() const;
};

// A checkpointing plan for a model of layers.size() transformer layers.
struct CheckpointPlan {
  std::vector<LayerCheckpoint> layers;
  // Per layer (same size as layers, or empty = every layer its own segment): consecutive
  // layers whose choice is `layer` and whose segment ids are equal form one region.
  std::vector<int32_t> segment;
  // torch >= 2.1 stops the re-run after the last saved tensor is recomputed; torch 1.13
  // (and use_reentrant=True) re-runs the whole region.
  bool early_stop = true;
  // Reentrant checkpoint semantics (see the file comment); implies no early stop.
  bool reentrant = false;
  // Selective checkpointing for every checkpointed region (non-reentrant only; empty:
  // plain checkpointing, which recomputes everything).
  SelectivePolicy selective;

  bool any() const;
  LayerCheckpoint at(int32_t layer) const {
    return layer >= 0 && static_cast<size_t>(layer) < layers.size() ? layers[layer]
                                                                      : LayerCheckpoint::keep;
  }
};

using Inputs = std::vector<Tensor>;
// A region body: the inputs in, the region's output out (the inputs are the only
// tensors it may use that are not parameters or buffers alive for the whole run).
using RegionFn = std::function<Tensor(const Inputs& in)>;
// One transformer layer: layer index, hidden state, the extra inputs given to run_layers.
using LayerFn = std::function<Tensor(int32_t layer, const Tensor& x, const Inputs& extra)>;

class Autocast;

class CheckpointEngine {
 public:
  // Installs itself as rt.checkpoint (one engine per Runtime); the destructor uninstalls.
  CheckpointEngine(Runtime& rt, CheckpointPlan plan);
  ~CheckpointEngine();
  CheckpointEngine(const CheckpointEngine&) = delete;
  CheckpointEngine& operator=(const CheckpointEngine&) = delete;

  const CheckpointPlan& plan() const { return plan_; }
  // Whether a candidate region of `kind` opened in `layer` is checkpointed now.
  bool wants(RegionKind kind, int32_t layer) const;
  // Runs fn as a checkpointed region (see the file comment). ctx_held: indices into inputs
  // of the tensors that reach the checkpoint call inside non-tensor objects, in the order
  // the node's ctx frees them (reentrant only; see the file comment).
  Tensor run(Inputs inputs, RegionFn fn, std::vector<uint8_t> ctx_held = {});
  uint32_t regions_recomputed() const { return recomputations_; }
  // Reentrant: a checkpointed region's forward is running, which torch runs under no_grad
  // (memsim records it with grad on for the placeholders). Ops whose grad mode allocates
  // more than their saves (an in-place op's clone of self: ops_moe.cpp div_inplace) skip
  // that allocation here; the re-run makes it.
  bool forward_without_grad() const { return plan_.reentrant && forward_region_ != 0; }
  // The model's torch.autocast state (null: no autocast in this run).
  void set_autocast(Autocast* autocast) { autocast_ = autocast; }

  // --- Runtime hooks (graph/runtime.cpp) -------------------------------------------
  // Node `node` is saving `storage`. True: the engine took it over (a placeholder in the
  // checkpoint's forward, or the re-run's save handed to its placeholder); the Runtime
  // then keeps no reference.
  bool pack(int32_t node, uint32_t storage);
  // The backward is about to run `node`: recomputes its region first if the node has
  // placeholders (or, reentrant, is the region's output node, whose incoming grad it then
  // holds). May append nodes (the re-run's), so callers re-fetch node refs.
  void unpack(int32_t node);
  // `node`'s saved tensors have just been released (it ran, or its graph was discarded).
  void released(int32_t node);
  // Graph `g` died (Runtime::discard_graph, after its nodes): the reentrant ctx's held
  // objects of its regions are released, the first region to drop its frame first.
  void graph_died(uint32_t g);
  // Bytes held now by reentrant ctxs whose graph is alive (tests and reports).
  uint64_t ctx_held_bytes() const { return held_bytes_; }

  // --- Op hooks for selective checkpointing (graph/ops/op_helpers.h) ---------------------
  // Forward of a checkpointed region: op `k` has just allocated `outs`; the region caches
  // them if the policy saves this call.
  void sac_cache(OpKind k, std::initializer_list<const Tensor*> outs);
  // Re-run of a region: if the policy saved this call of op `k` in the forward, *outs
  // become the cached outputs (true) and the op runs no kernel; false: run it.
  bool sac_reused(OpKind k, std::initializer_list<Tensor*> outs);
  // Bytes held by cache entries now (tests and reports).
  uint64_t sac_cached_bytes() const { return sac_bytes_; }

 private:
  struct Placeholder {
    int32_t node;
    uint32_t slot;  // index among the node's saved tensors
  };
  struct Region {
    Inputs inputs;  // held by the checkpoint frame
    RegionFn fn;
    Tensor output;  // reentrant: the re-run's output, alive until the frame dies
    OpContext ctx;  // where the region was opened (layer, module)
    std::vector<Placeholder> placeholders;
    uint32_t live = 0;  // placeholders not yet released
    bool recomputed = false;
    bool autocast = false;  // opened inside a torch.autocast region
    uint32_t held_grad = kNoStorage;  // reentrant: the grad that reached the output
    // Reentrant: inputs the node's ctx keeps until graph `graph` dies (see run()); moved
    // to held_ when the frame drops, if the region made a node (its output has a grad_fn).
    std::vector<uint8_t> ctx_held;
    uint32_t graph = 0;
    bool has_node = false;
    // Selective checkpointing: the cached op outputs (one reference each; kNoStorage for
    // an output slot the op left undefined), one entry per output slot of every saved call,
    // in forward order; the re-run consumes them from cache_next on. Numeric mode keeps
    // their values as written (graph/numeric/numeric.h stash).
    struct Cached {
      uint32_t storage;
      uint64_t bytes;
    };
    std::vector<Cached> cache;
    size_t cache_next = 0;
    // A compiled block (graph/compile.h 4b): the storages its forward saved (placeholders)
    // and the last saving node, to drop the cached outputs the backward never needs.
    std::vector<uint32_t> saved_storages;
    int32_t last_save_node = -1;
    uint32_t forward_calls = 0;    // calls of the policy's save_odd kind in the forward
    uint32_t recompute_calls = 0;  // ... and in the re-run
  };
  // Whether the policy saves this call of `k` (counts it when the rule counts).
  bool sac_saves(OpKind k, uint32_t& calls) const;
  void recompute(uint32_t region);
  // Compiled selective checkpointing: releases the cache entries of region `r` that
  // neither a saved tensor is nor a node up to the last saving one reads.
  void drop_unread_cache(uint32_t r);
  void drop_frame(Region& r);

  void leave_autocast();
  // Early stop: removes the alloc and free of an output that the real re-run never made
  // (see pack()).
  void undo_unborn_output();

  Runtime& rt_;
  CheckpointPlan plan_;
  Autocast* autocast_ = nullptr;
  bool autocast_entered_ = false;  // the re-run's nested autocast context is open
  std::vector<Region> regions_;       // region id r is regions_[r - 1]
  std::vector<uint32_t> node_holds_;  // per node id: its placeholders not yet released
  std::vector<uint32_t> output_of_;   // reentrant, per node id: the region it outputs (0: none)
  uint32_t forward_region_ = 0;       // the region whose forward is running
  uint32_t recompute_region_ = 0;     // the region being re-run
  size_t recompute_next_ = 0;         // next placeholder the re-run fills
  uint32_t unborn_output_ = kNoStorage;  // early stop: an output allocated before the stop
  uint32_t recomputations_ = 0;
  size_t reused_at_ = SIZE_MAX;  // event_count() right after the last cache hand-out
  uint64_t sac_bytes_ = 0;
  // Reentrant ctx.inputs / ctx.run_function objects whose frame has dropped: one reference
  // each, released by graph_died(graph), in this order.
  struct Held {
    uint32_t graph;
    uint32_t storage;
    uint64_t bytes;
  };
  std::vector<Held> held_;
  uint64_t held_bytes_ = 0;
};

// --- Emitter entry points ---------------------------------------------------------------
// The layer loop `for l in range(n): x = block(l, x, *extra)`. Consecutive layers that the
// plan checkpoints as one segment run as one region whose inputs are x and `extra`.
// ctx_held: indices into extra of the tensors the checkpoint call gets inside non-tensor
// objects (CheckpointEngine::run).
Tensor run_layers(Runtime& rt, int32_t n_layers, Tensor x, const Inputs& extra,
                  const LayerFn& block, const std::vector<uint8_t>& ctx_held = {});
// A candidate region inside layer rt.ctx.layer (ctx_held: indices into inputs, as above).
Tensor run_region(Runtime& rt, RegionKind kind, const Inputs& inputs, const RegionFn& fn,
                  const std::vector<uint8_t>& ctx_held = {});

}  // namespace memsim::graph
