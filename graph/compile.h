// torch.compile's memory on graph::Runtime: a compiled region (the whole model forward,
// or each transformer block) keeps what the AOTAutograd partition saves and allocates
// only the buffers Inductor materialises (docs/compile.md).
//
// How a region runs (CompileEngine::run):
//  1. The region's emitter runs as eager, while the engine records its tensor graph: each
//     allocation (a vertex, classified by its op: graph/compile.cpp op_class), the
//     storages each autograd node read, and what each node saved (what the backward
//     reads).
//  2. graph/compile_partition.h picks the saved set: the min-cut partition of the
//     recorded graph at step.compile_memory_budget.
//  3. The region's events are rewritten in place (the region is a contiguous tail of the
//     Program): a value produced by a fusible op whose every reader is fusible, that is
//     not saved and does not outlive the region, is inside one fused Inductor kernel: its
//     alloc and free are removed. Every other value the region allocated and that dies in
//     it is freed right after its last reader ran (Inductor's `del buf` after last use),
//     not when its Python name would have died.
//  4. Saves: a value in the saved set stays saved (the compiled forward returns it and
//     the autograd node holds it); a value eager would save but the partition does not is
//     released at the region's end and recomputed in the backward. A saved value that eager
//     did not save (an upstream value the recomputation starts from) is held by the engine
//     until every backward node that recomputes from it has run.
//  4b. Compile + activation checkpointing (a checkpointed block, torchtitan's apply_ac
//     before apply_compile): dynamo turns torch.utils.checkpoint into the
//     tag_activation_checkpoint HOP, whose nodes the partitioner must recompute, so the
//     compiled forward saves only the block's inputs. memsim runs such a block inside the
//     CheckpointEngine's region (graph/checkpoint.h): the forward saves nothing but the
//     frame's inputs, and the re-run at the block's first backward unpack is recorded as a
//     compiled region of its own (the recompute part of the compiled backward graph):
//     fused as above; a value the backward reads stays a buffer when its producer or one
//     of its readers is not fusible, else it is recomputed inside its backward kernel and
//     the materialised values it is computed from are held until those readers ran. The
//     re-run stops after its last saved value (the compiled backward computes only what
//     it reads: dead code is eliminated). Selective checkpointing (sac-op): the policy's
//     MUST_SAVE outputs are saved when the backward or its recompute reads them (the
//     CheckpointEngine drops the other cache entries, graph/checkpoint.cpp
//     drop_unread_cache); the re-run takes the cached ones as inputs.
//  4c. Activation checkpointing around a compiled block (torchtune: compile_model, then
//     set_activation_checkpointing, so checkpoint_wrapper's eager non-reentrant checkpoint
//     calls the compiled layer; CompileOptions::checkpoint_outside). The compiled forward
//     is partitioned as without checkpointing, and its CompiledFunction saves the min-cut
//     set with ctx.save_for_backward, whose tensors the checkpoint's pack hook replaces by
//     holders (the hooks are plain Python, not inlineable into the graph). So in the
//     forward the saved set is materialised and stays alive to the region's end (the
//     compiled graph returns it), then dies (freed in reverse order: ctx.to_save's tuple);
//     nothing is held but the frame's inputs (on_pack records what the placeholders
//     stand for). At the block's first backward unpack the checkpoint re-runs the layer,
//     i.e. the whole compiled forward again: the same partition, in Phase::backward, whose
//     saves fill the placeholders (on_fill) and are then handled as in 4 and 5 (eager saves
//     the partition does not keep are released and recomputed in the backward's kernels).
//     torch's early stop raises only when the last saved tensor is packed, which happens
//     after the compiled forward returned: it cannot cut the compiled region short.
//  5. Backward: when the engine runs a node that reads a recomputed value, a fusible
//     reader recomputes it inside its own kernel (no buffer); a non-fusible reader (the
//     matmul that needs its input) gets it materialised (a new buffer with the forward op's
//     name, in Phase::backward), shared by every node of the region that reads it and
//     freed after the last of them.
// What is not modelled (docs/compile.md "Limits"): the backward's own fusion (its grads
// follow eager's per-node recipes, an upper bound), Inductor's buffer reuse and
// reordering (memory.py), CUDA graphs, dynamic shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "graph/compile_partition.h"
#include "graph/runtime.h"

namespace memsim::graph {

// Where the compiled regions are: `model` = torch.compile(model) with the loss computed
// outside (a graph break at the model's return); `block` = torchtitan's per-block
// compile (each transformer block its own graph; embeddings, final norm, head eager).
// `loss`: a loss function compiled alone (torchtune's compile_loss: each output chunk's
// compute_cross_entropy is its own graph), on when CompileOptions::compile_loss is.
enum class CompileScope : uint8_t { model, block, loss };

struct CompileOptions {
  CompileScope scope = CompileScope::model;
  double memory_budget = 1.0;  // torch._functorch.config.activation_memory_budget
  PartitionerVersion partitioner = PartitionerVersion::torch25;
  // torchtune's training.compile_loss (recipes call it with `compile: True`): the chunked
  // loss's compute_cross_entropy is compiled as well, whatever `scope` is.
  bool compile_loss = false;
  // torchtune's order (compile_model, then set_activation_checkpointing): an eager
  // torch.utils.checkpoint runs around each compiled block (4c in the file comment), not
  // torchtitan's tagged region inside the graph (4b).
  bool checkpoint_outside = false;
};

// What one compiled region kept, for tests and reports.
struct CompiledRegionStats {
  int32_t layer = -1;
  uint32_t vertices = 0;
  uint32_t saved = 0;             // saved values that are activations (not parameters)
  uint64_t saved_bytes = 0;       // their bytes (views counted once: one vertex per storage)
  uint64_t eager_saved_bytes = 0; // what eager autograd saved in the same region
  uint32_t fused_away = 0;        // allocations removed (inside fused kernels)
  uint64_t fused_away_bytes = 0;
  struct Value {
    OpKind op;        // the producing op (OpKind::other for a region input)
    uint64_t bytes;
    bool input;       // a region input (primal)
  };
  std::vector<Value> saved_values;  // the activations counted in `saved`, in graph order
  // A checkpointed block's re-run inside the backward (compile + activation checkpointing:
  // the recompute part of the compiled backward graph); `saved` then counts the values
  // it materialises for the backward.
  bool recompute = false;
};

class CompileEngine {
 public:
  // Installs itself as rt.compile; the destructor uninstalls.
  CompileEngine(Runtime& rt, CompileOptions options);
  ~CompileEngine();
  CompileEngine(const CompileEngine&) = delete;
  CompileEngine& operator=(const CompileEngine&) = delete;

  const CompileOptions& options() const { return options_; }
  // Whether a region of `scope` opened now is compiled (no nesting; the forward only).
  bool wants(CompileScope scope) const;
  Tensor run(const std::function<Tensor()>& fn);
  const std::vector<CompiledRegionStats>& regions() const { return stats_; }
  // Of the region recorded last: whether a node with id <= `node` read `storage`
  // (graph/checkpoint.cpp: which cached outputs a compiled selective checkpoint keeps).
  bool read_up_to(uint32_t storage, int32_t node) const;

  // --- Runtime hooks (graph/runtime.cpp) ------------------------------------------------
  void on_alloc(uint32_t storage, uint64_t bytes, OpKind op);
  void on_node(int32_t node, OpKind kind, std::initializer_list<const Tensor*> inputs);
  void on_save(int32_t node, uint32_t storage);
  void unpack(int32_t node);    // the engine is about to run `node`
  // A checkpoint re-run filled forward node `node`'s placeholder `slot` with `storage`
  // (graph/checkpoint.cpp): in a recorded re-run, what the backward reads.
  void on_fill(int32_t node, uint32_t slot, uint32_t storage);
  // The checkpoint's forward replaced node `node`'s save `slot` of `storage` by a
  // placeholder (graph/checkpoint.cpp): with checkpoint_outside (4c), what the partition's
  // backward reads; ignored otherwise (4b: the tagged block saves nothing).
  void on_pack(int32_t node, uint32_t slot, uint32_t storage);
  void released(int32_t node);  // `node`'s saved tensors were released

 private:
  struct Vertex {
    uint32_t storage = kNoStorage;
    uint64_t bytes = 0;
    OpKind op = OpKind::other;
    int32_t producer = -1;  // recorded node index, -1: no autograd node (a constant)
  };
  struct RecNode {
    int32_t id = -1;
    OpKind kind = OpKind::other;
    size_t event = 0;  // program event count when it was made (its kernel ran just before)
    std::vector<uint32_t> inputs;  // storages read
  };
  struct Save {
    int32_t node;
    uint32_t slot;
    uint32_t storage;
  };
  // A recomputed value, per region: the placeholders that read it.
  struct Recompute {
    uint32_t storage = kNoStorage;  // the forward value (dead now)
    uint64_t bytes = 0;
    OpKind op = OpKind::other;
    bool materialise = false;
    std::vector<std::pair<int32_t, uint32_t>> slots;  // (node, saved slot)
    uint32_t live = 0;  // backward copy: placeholders not yet released (0: not made)
  };

  void finish_region(size_t begin, int32_t layer);

  Runtime& rt_;
  CompileOptions options_;
  bool recording_ = false;
  bool rerun_ = false;  // the region being recorded is a checkpoint re-run (in backward)
  bool packed_ = false;  // 4c: the region's saves went to checkpoint placeholders
  // The region being recorded.
  std::vector<Vertex> vertices_;
  std::vector<uint32_t> vertex_of_;  // storage -> vertex index + 1 (0: not of the region)
  std::vector<RecNode> nodes_;
  std::vector<Save> saves_;
  size_t pending_ = 0;  // vertices_[pending_..] not yet assigned to a node
  // Backward state of every region so far.
  std::vector<Recompute> recompute_;
  std::vector<std::vector<uint32_t>> node_recompute_;  // per node id: recompute_ indices
  std::vector<std::vector<uint32_t>> node_holds_;      // per node id: held_ indices
  struct Held {
    uint32_t storage;
    uint32_t dependents;  // nodes that recompute from it and have not run
  };
  std::vector<Held> held_;
  std::vector<CompiledRegionStats> stats_;
};

// The region entry point emitters call: fn() plainly, or as a compiled region when the
// installed engine compiles `scope` (graph/models/decoder.cpp). `layer` (block scope:
// the block's index) runs the module hooks of that block first, outside the region:
// torchtitan applies fully_shard to the torch.compile'd block (the OptimizedModule), so
// FSDP2's pre-forward all-gather runs eagerly before the compiled forward and its
// post-forward reshard after it (docs/compile.md, "With FSDP2").
Tensor compile_region(Runtime& rt, CompileScope scope, const std::function<Tensor()>& fn,
                      int32_t layer = -1);

}  // namespace memsim::graph
