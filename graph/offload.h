// Activation offload: torch.autograd.graph.save_on_cpu(pin_memory=True) around chosen
// transformer layers (scenario key checkpoint.offload; issue #18 item 4; docs/offload.md),
// emulated on graph::Runtime.
//
// Modelled on torch/autograd/graph.py `save_on_cpu` (torch 1.13.1, the same in v2.4 bar the
// device_type argument): a saved_tensors_hooks pair whose pack hook copies each tensor
// autograd saves into a new pinned host tensor of the tensor's own size
// (`torch.empty(tensor.size(), pin_memory=True).copy_(tensor)`) and returns it, keeping
// no reference to the device tensor; whose unpack hook copies it back
// (`tensor.to(device, non_blocking=True)`). SavedVariable calls the hooks for every saved
// tensor, parameters included (torch/csrc/autograd/saved_variable.cpp: hooks apply to any
// non-wrapped-number variable), and each save is its own copy.
//
// Contract (one engine per Runtime, installed as rt.offload; nullptr: no hook runs):
//  - Forward (not in backward, not a checkpoint re-run) inside an offloaded layer
//    (ctx.layer): every save becomes a packed slot (the saved_ entry holds kNoStorage, no
//    reference), so the device tensor dies at its last Python reference. Its bytes (the
//    saved tensor's, a view's own size) are a host copy: live until the node's saved
//    variables are released (it ran, or its graph died), counted in host_peak().
//  - Backward, right before a node with packed slots runs: each slot gets a new device
//    tensor (op "_to_copy", OpKind::offload_unpack, TensorKind::activation) in the node's
//    context, owned by the slot, so it is released with the node's other saved tensors
//    (the generated apply() unpacks every saved variable first and its locals die when it
//    returns). The slots are filled once: a node runs once (retain_graph=False).
//  - PCIe bytes: each pack (device-to-host) and each unpack (host-to-device) adds the
//    tensor's bytes to Program::cost.host_bytes (the time model's `transfer` part).
//  - Not modelled here (refused by the scenario checks, sim/step/activation_offload.h):
//    an offloaded layer that is also checkpointed, numeric mode, torch.compile.
// Per-node bookkeeping is a flat array appended while saving; nothing is allocated per
// event once it has grown.
//
// The Runtime's one offload hook point also serves torchtune's OffloadActivations
// (checkpoint.offload_activations): an engine built on a StreamOffload
// (graph/offload_streams.h) packs nothing itself; the Runtime and the checkpoint engine
// call that StreamOffload (streams()) at the hooks it needs instead.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/runtime.h"

namespace memsim::graph {

class StreamOffload;  // graph/offload_streams.h

class OffloadEngine {
 public:
  // layers[l]: layer l's forward runs under save_on_cpu. Installs itself as rt.offload.
  OffloadEngine(Runtime& rt, std::vector<bool> layers);
  // torchtune's OffloadActivations: installs itself as rt.offload, forwarding to `streams`
  // (not owned; it outlives this engine).
  OffloadEngine(Runtime& rt, StreamOffload& streams);
  ~OffloadEngine();
  StreamOffload* streams() const { return streams_; }
  OffloadEngine(const OffloadEngine&) = delete;
  OffloadEngine& operator=(const OffloadEngine&) = delete;

  // --- Runtime hooks (graph/runtime.cpp) -------------------------------------------
  // Node `node` saves a tensor of `bytes` into its slot `slot` now. True: packed (the
  // Runtime keeps no reference).
  bool pack(int32_t node, uint32_t slot, uint64_t bytes, int32_t layer, bool forward);
  // The backward is about to run `node`: its packed slots get device copies.
  void unpack(int32_t node);
  // `node`'s saved variables were released: its host copies die.
  void released(int32_t node);
  // The Runtime dropped every node (ids restart at 0).
  void nodes_cleared();

  uint64_t host_live() const { return host_live_; }
  // The pinned host peak: the streams' when this engine forwards to torchtune's
  // OffloadActivations (they count the host copies there), else this engine's own.
  uint64_t host_peak() const;
  uint64_t packed_count() const { return packs_; }

 private:
  struct Packed {
    uint32_t slot;
    uint64_t bytes;
  };
  struct NodePacks {
    uint32_t first = 0;  // into packed_
    uint32_t count = 0;
    bool unpacked = false;
  };
  Runtime& rt_;
  StreamOffload* streams_ = nullptr;
  std::vector<bool> layers_;
  std::vector<Packed> packed_;
  std::vector<NodePacks> nodes_;  // by node id (grown on demand)
  uint64_t host_live_ = 0;
  uint64_t host_peak_ = 0;
  uint64_t packs_ = 0;
};

}  // namespace memsim::graph
