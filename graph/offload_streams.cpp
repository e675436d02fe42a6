#include "graph/offload_streams.h"

#include <stdexcept>
#include <string>

namespace memsim::graph {

StreamOffload::StreamOffload(Runtime& rt, StreamOffloadConfig cfg) : rt_(rt), cfg_(cfg) {
  packed_.reserve(256);
  fwd_stash_.reserve(16);
  bwd_stash_.reserve(16);
}

StreamOffload::~StreamOffload() = default;

void StreamOffload::offload(uint32_t id, uint32_t storage, uint64_t bytes) {
  // "sync back and dereference previously offloaded tensors": the stash's oldest entries
  // with id <= tensor_id - max_fwd_stash_size, stopping at the first newer one.
  size_t k = 0;
  while (k < fwd_stash_.size() && fwd_stash_[k].id + cfg_.max_fwd_stash <= id) ++k;
  for (size_t i = 0; i < k; ++i) rt_.release(fwd_stash_[i].storage);
  fwd_stash_.erase(fwd_stash_.begin(), fwd_stash_.begin() + static_cast<std::ptrdiff_t>(k));
  // cpu_tensor = empty_like(pinned).copy_(activation) on s1; the stash keeps the device
  // tensor alive until s1 is done with it.
  rt_.retain(storage);
  fwd_stash_.push_back({id, storage});
  host_live_ += bytes;
  if (host_live_ > host_peak_) host_peak_ = host_live_;
  rt_.program().cost.host_bytes += static_cast<double>(bytes);  // device -> host
  ++offloaded_;
}

bool StreamOffload::pack(int32_t node, uint32_t slot, uint32_t storage, uint64_t bytes) {
  const OpContext& c = rt_.ctx;
  // Inside `with activations_handling_ctx: logits = model(...)` only; the NoOpManager
  // around model.output hands the head's saves back untouched (no tensor id taken).
  if (c.phase != Phase::forward || c.module == Module::head) return false;
  const uint32_t id = ++next_id_;
  if (bytes < cfg_.min_bytes || rt_.program().tensors[storage].kind == TensorKind::parameter)
    return false;  // tracker[id] = (activation, False): saved as it is
  offload(id, storage, bytes);
  const size_t n = static_cast<size_t>(node);
  if (n >= nodes_.size()) nodes_.resize(n + 1);
  Owner& o = nodes_[n];
  if (o.count == 0) o.first = static_cast<uint32_t>(packed_.size());
  packed_.push_back({id, slot, bytes});
  ++o.count;
  return true;
}

bool StreamOffload::pack_inputs(uint32_t region, const std::vector<Tensor>& inputs) {
  // _NoopSaveInputs.apply(dummy, kwargs, *args): save_for_backward(dummy, *tensor args).
  ++next_id_;  // the 0-element dummy: under min_offload_size, kept as it is
  if (regions_.size() <= region) regions_.resize(size_t{region} + 1);
  Owner& o = regions_[region];
  o.first = static_cast<uint32_t>(packed_.size());
  o.count = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& t = inputs[k];
    if (!t.defined()) continue;
    const uint32_t id = ++next_id_;
    if (t.bytes < cfg_.min_bytes || rt_.program().tensors[t.storage].kind == TensorKind::parameter)
      continue;
    offload(id, t.storage, t.bytes);
    packed_.push_back({id, static_cast<uint32_t>(k), t.bytes});
    ++o.count;
  }
  return o.count > 0;
}

bool StreamOffload::input_packed(uint32_t region, size_t k) const {
  if (region >= regions_.size()) return false;
  const Owner& o = regions_[region];
  for (uint32_t i = 0; i < o.count; ++i)
    if (k == SIZE_MAX || packed_[o.first + i].slot == k) return true;
  return false;
}

void StreamOffload::node_begins(int32_t node) {
  running_ = node;
  hooked_ = false;
  prev_ids_.clear();
  checked_.clear();
}

void StreamOffload::note_unpack() {
  // "If we're on a new node, mark prev node's tensors to be freed later".
  if (running_ != curr_node_) {
    curr_node_ = running_;
    prev_ids_.clear();
    for (const Stashed& s : bwd_stash_) prev_ids_.push_back(s.id);
  }
  hooked_ = true;  // node.register_hook(hook)
}

uint32_t StreamOffload::bring_back(uint32_t id, uint64_t bytes) {
  host_live_ -= bytes;  // del self.tracker[id]: the host copy goes
  for (const Stashed& s : fwd_stash_) {
    if (s.id != id) continue;
    rt_.retain(s.storage);  // the activation itself, no copy
    return s.storage;
  }
  // with torch.cuda.stream(s1): cpu_tensor.to("cuda", non_blocking=True)
  const uint32_t copy = rt_.alloc_raw(bytes, TensorKind::activation, OpKind::offload_unpack);
  rt_.program().events.back().stream = cfg_.stream;  // alloc_raw's event is the last one
  rt_.program().cost.host_bytes += static_cast<double>(bytes);  // host -> device
  rt_.retain(copy);  // bwd_tensor_stash[id]
  bwd_stash_.push_back({id, copy});
  checked_.push_back(copy);
  ++copies_;
  return copy;
}

void StreamOffload::unpack(int32_t node) {
  const size_t n = static_cast<size_t>(node);
  if (n >= nodes_.size() || nodes_[n].count == 0) return;
  const Owner& o = nodes_[n];
  for (uint32_t i = 0; i < o.count; ++i) {
    const Packed p = packed_[o.first + i];
    note_unpack();
    rt_.adopt_saved(node, p.slot, bring_back(p.id, p.bytes));  // the apply's local
  }
}

void StreamOffload::unpack_inputs(uint32_t region, std::vector<Tensor>& args) {
  if (region >= regions_.size()) return;
  Owner& o = regions_[region];
  // The copy is made inside the running node's apply: its layer and module.
  const OpContext saved = rt_.ctx;
  if (running_ >= 0) {
    rt_.ctx.layer = rt_.node(running_).layer;
    rt_.ctx.module = rt_.node(running_).module;
  }
  for (uint32_t i = 0; i < o.count; ++i) {
    const Packed p = packed_[o.first + i];
    note_unpack();
    args[p.slot] = rt_.adopt(bring_back(p.id, p.bytes), p.bytes);
  }
  rt_.ctx = saved;
  o.count = 0;  // unpacked once (the checkpoint re-runs a region once)
}

void StreamOffload::post_hook(int32_t node) {
  if (node != running_ || !hooked_) return;
  hooked_ = false;
  const size_t n = static_cast<size_t>(node);
  if (n < nodes_.size() && nodes_[n].count > 0) {
    // The apply's unpacked locals died when it returned.
    Node& nd = rt_.node(node);
    const Owner& o = nodes_[n];
    for (uint32_t i = 0; i < o.count; ++i) rt_.release_saved_slot(nd, packed_[o.first + i].slot);
    nodes_[n].count = 0;
  }
  // Note [Track views of the unpacked]: a copy that something besides the stash still
  // references would take record_stream(s0), whose free waits for the compute stream.
  for (const uint32_t s : checked_)
    if (rt_.refs(s) > 1)
      throw std::runtime_error(
          "checkpoint.offload_activations: a tensor brought back from the host is still "
          "referenced after its node ran (a view kept by the checkpoint's re-run: "
          "OffloadActivations calls record_stream, whose free depends on GPU progress); not "
          "modelled");
  checked_.clear();
  // "if there are still things in the fwd_stash, get rid of them as we're in bwd now"
  for (const Stashed& s : fwd_stash_) rt_.release(s.storage);
  fwd_stash_.clear();
  // "wait on prev node's events and del those"
  for (const uint32_t id : prev_ids_) {
    for (size_t i = 0; i < bwd_stash_.size(); ++i) {
      if (bwd_stash_[i].id != id) continue;
      const uint32_t s = bwd_stash_[i].storage;
      bwd_stash_.erase(bwd_stash_.begin() + static_cast<std::ptrdiff_t>(i));
      rt_.release(s);
      break;
    }
  }
  prev_ids_.clear();
}

void StreamOffload::backward_done() {
  // wait_and_del_remaining_references, queued on the engine at the first unpack.
  for (const Stashed& s : bwd_stash_) rt_.release(s.storage);
  bwd_stash_.clear();
  running_ = -1;
}

void StreamOffload::nodes_cleared() {
  nodes_.clear();
  // Every pack was unpacked (the tracker is empty, as torchtune asserts at the next
  // forward): the pack records can go, keeping their capacity.
  if (host_live_ == 0) {
    packed_.clear();
    for (Owner& o : regions_) o.count = 0;
  }
}

}  // namespace memsim::graph
