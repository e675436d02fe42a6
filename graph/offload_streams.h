// torchtune's activation offloading (scenario key checkpoint.offload_activations; issue #16
// item 7; docs/offload.md "torchtune's OffloadActivations"), emulated on graph::Runtime.
//
// Modelled on pytorch/torchtune v0.6.1 (a6290a5b40758f13bca61c386bc8756a49ef417e)
// torchtune/training/_activation_offloading.py: OffloadActivations(use_pin_memory=True,
// use_streams=True, max_fwd_stash_size=5, min_offload_size=1024), the defaults
// get_act_offloading_ctx_manager passes, entered by the recipes around `self._model(**batch)`
// only (recipes/full_finetune_single_device.py _loss_step), with a NoOpManager around
// `model.output`. Read with torch/utils/checkpoint.py (torch 2.11, /work/src517):
// _NoopSaveInputs saves the dummy and the region's tensor inputs through the ambient hooks,
// before the checkpoint's own hooks (innermost inside the region) take every other save.
//
// Contract (one engine per Runtime, reached through an OffloadEngine built on it and
// installed as rt.offload, graph/offload.h; the Runtime's and the checkpoint engine's hooks
// call it when rt.offload->streams() is set):
//  - Which saves reach the hooks (pack): forward saves (not backward, not a checkpoint
//    re-run) outside checkpointed regions and outside the head (Module::head: the
//    NoOpManager), in Phase::forward (the loss is computed after the `with` block), plus
//    each checkpointed region's _NoopSaveInputs save: its 0-byte dummy, then each defined
//    input (pack_inputs). Every pack takes the next tensor id (torchtune's tensor_id).
//  - Offloaded: a pack of at least min_bytes that is not a parameter (isinstance Parameter:
//    a storage of TensorKind::parameter here; its nn.Buffer test matches only tensors built
//    as nn.Buffer, none of which is saved outside the layers). Its slot holds no reference; a host
//    copy of its bytes lives until it is unpacked (tracker); device-to-host bytes count in
//    Program::cost.host_bytes. Smaller packs and parameters are saved as usual (tracker keeps
//    the tensor itself).
//  - Forward stash (lines 154-193): before an offloaded pack with id t, every stash entry
//    with id <= t - max_fwd_stash (oldest first, stopping at the first newer one) drops its
//    device reference; then the device tensor enters the stash (one reference), so the last
//    few offloaded tensors stay on the device after their last Python name died.
//  - Backward unpack (lines 227-346) of an offloaded id, when node N runs (a direct slot,
//    or a region input unpacked by the checkpoint's re-run inside N): if N is not the node
//    that last unpacked, N's hook will drop every id then in the backward stash
//    (prev_node_ids). Still in the forward stash: that device tensor is returned (no copy).
//    Else a device copy is allocated on stream kOffloadStream (`.to("cuda")` under
//    torch.cuda.stream(s1): the allocator's pool for that stream) and held by the backward
//    stash. The host copy dies (the tracker entry is deleted).
//  - N's post hook (post_hook, after N's apply, before its incoming grads die: engine.cpp's
//    call_function holds `inputs` until it returns, and calls the post hooks registered
//    during the apply too): the apply's unpacked locals are gone; the forward
//    stash is emptied; the ids in N's prev_node_ids leave the backward stash. A copy still
//    referenced by something else then (record_stream's case, a view kept by the re-run)
//    is not modelled: it throws.
//  - End of the backward (backward_done; the queued callback): the backward stash empties.
// Nothing here allocates per event once its vectors have grown.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/runtime.h"

namespace memsim::graph {

inline constexpr uint8_t kOffloadStream = 1;  // OffloadActivations' s1 (comms stream)

struct StreamOffloadConfig {
  uint64_t min_bytes = 1024;   // min_offload_size
  uint32_t max_fwd_stash = 5;  // max_fwd_stash_size
  // The allocator's stream id for s1's copies: kOffloadStream, or another when FSDP2's
  // streams (1-3, sim/parallel/fsdp2.h) exist too: s1 is a stream of its own, its own pool.
  uint8_t stream = kOffloadStream;
};

class StreamOffload {
 public:
  StreamOffload(Runtime& rt, StreamOffloadConfig cfg);
  ~StreamOffload();
  StreamOffload(const StreamOffload&) = delete;
  StreamOffload& operator=(const StreamOffload&) = delete;

  // --- Runtime hooks (graph/runtime.cpp, through rt.offload->streams()) ---------------
  // Node `node` saves storage (a tensor of `bytes`) into slot `slot`. True: offloaded (the
  // Runtime keeps no reference).
  bool pack(int32_t node, uint32_t slot, uint32_t storage, uint64_t bytes);
  // The engine is about to run `node` (before any unpack of it).
  void node_begins(int32_t node);
  // `node`'s offloaded slots get their device tensors.
  void unpack(int32_t node);
  // `node`'s apply returned: its post hooks.
  void post_hook(int32_t node);
  // The graph task finished.
  void backward_done();
  // The Runtime dropped every node (ids restart at 0).
  void nodes_cleared();

  // --- CheckpointEngine hooks (graph/checkpoint.cpp) ---------------------------------
  // Checkpointed region `region` starts its forward with `inputs`: the _NoopSaveInputs
  // save. Returns whether any input was offloaded (the frame then holds those by id only).
  bool pack_inputs(uint32_t region, const std::vector<Tensor>& inputs);
  // Whether input k of `region` was offloaded (k = SIZE_MAX: any of them).
  bool input_packed(uint32_t region, size_t k = SIZE_MAX) const;
  // The re-run of `region` (inside the running node) gets its offloaded inputs back.
  void unpack_inputs(uint32_t region, std::vector<Tensor>& args);

  uint64_t host_peak() const { return host_peak_; }
  uint64_t host_live() const { return host_live_; }
  uint64_t offloaded_count() const { return offloaded_; }
  uint64_t copies_back() const { return copies_; }

 private:
  struct Packed {  // an offloaded tensor (tracker entry with modified=True)
    uint32_t id;
    uint32_t slot;     // node slot or region input index
    uint64_t bytes;
  };
  struct Owner {  // packs of one node or region, contiguous in packed_
    uint32_t first = 0;
    uint32_t count = 0;
  };
  struct Stashed {
    uint32_t id;
    uint32_t storage;
  };
  // Offload pack bookkeeping common to slots and region inputs (the stash rule).
  void offload(uint32_t id, uint32_t storage, uint64_t bytes);
  // Device tensor for offloaded id (a stash hit or a new copy on the offload stream), one
  // reference owned by the caller.
  uint32_t bring_back(uint32_t id, uint64_t bytes);
  // The running node unpacks an offloaded tensor: torchtune's per-node bookkeeping.
  void note_unpack();

  Runtime& rt_;
  StreamOffloadConfig cfg_;
  uint32_t next_id_ = 0;
  std::vector<Packed> packed_;
  std::vector<Owner> nodes_;    // by node id
  std::vector<Owner> regions_;  // by region id
  std::vector<Stashed> fwd_stash_;  // increasing ids
  std::vector<Stashed> bwd_stash_;  // (id, copy)
  // The running node's hook state.
  int32_t running_ = -1;
  int32_t curr_node_ = -1;          // torchtune's curr_autograd_node
  bool hooked_ = false;             // the running node registered a hook
  std::vector<uint32_t> prev_ids_;  // its prev_node_ids
  std::vector<uint32_t> checked_;   // copies it brought back (refcount check in the hook)
  uint64_t host_live_ = 0;
  uint64_t host_peak_ = 0;
  uint64_t offloaded_ = 0;
  uint64_t copies_ = 0;
};

}  // namespace memsim::graph
