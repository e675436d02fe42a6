#include "graph/offload.h"

#include "graph/offload_streams.h"

namespace memsim::graph {

OffloadEngine::OffloadEngine(Runtime& rt, std::vector<bool> layers)
    : rt_(rt), layers_(std::move(layers)) {
  rt_.offload = this;
  packed_.reserve(1 << 10);
}

OffloadEngine::OffloadEngine(Runtime& rt, StreamOffload& streams) : rt_(rt), streams_(&streams) {
  rt_.offload = this;
}

OffloadEngine::~OffloadEngine() {
  if (rt_.offload == this) rt_.offload = nullptr;
}

uint64_t OffloadEngine::host_peak() const {
  return streams_ != nullptr ? streams_->host_peak() : host_peak_;
}

bool OffloadEngine::pack(int32_t node, uint32_t slot, uint64_t bytes, int32_t layer,
                         bool forward) {
  // save_on_cpu is a context manager around the layer's forward: saves made by the
  // backward (or by a checkpoint's re-run inside it) are outside it.
  if (!forward || layer < 0 || static_cast<size_t>(layer) >= layers_.size() || !layers_[layer])
    return false;
  const size_t id = static_cast<size_t>(node);
  if (id >= nodes_.size()) nodes_.resize(id + 1);
  NodePacks& n = nodes_[id];
  // A node's saves are recorded right after make_node, so its packs are contiguous.
  if (n.count == 0) n.first = static_cast<uint32_t>(packed_.size());
  packed_.push_back(Packed{slot, bytes});
  ++n.count;
  ++packs_;
  host_live_ += bytes;
  if (host_live_ > host_peak_) host_peak_ = host_live_;
  rt_.program().cost.host_bytes += static_cast<double>(bytes);  // device -> host
  return true;
}

void OffloadEngine::unpack(int32_t node) {
  const size_t id = static_cast<size_t>(node);
  if (id >= nodes_.size()) return;
  NodePacks& n = nodes_[id];
  if (n.count == 0 || n.unpacked) return;
  n.unpacked = true;
  const Node& nd = rt_.node(node);
  // The unpack runs in the node's context (its layer and module), as the backward does.
  const OpContext saved_ctx = rt_.ctx;
  rt_.ctx.layer = nd.layer;
  rt_.ctx.module = nd.module;
  rt_.ctx.region = nd.region;
  for (uint32_t i = 0; i < n.count; ++i) {
    const Packed& p = packed_[n.first + i];
    const uint32_t s = rt_.alloc_raw(p.bytes, TensorKind::activation, OpKind::offload_unpack);
    rt_.adopt_saved(node, p.slot, s);
    rt_.program().cost.host_bytes += static_cast<double>(p.bytes);  // host -> device
  }
  rt_.ctx = saved_ctx;
}

void OffloadEngine::released(int32_t node) {
  const size_t id = static_cast<size_t>(node);
  if (id >= nodes_.size()) return;
  NodePacks& n = nodes_[id];
  for (uint32_t i = 0; i < n.count; ++i) host_live_ -= packed_[n.first + i].bytes;
  n.count = 0;
}

void OffloadEngine::nodes_cleared() {
  if (streams_ != nullptr) streams_->nodes_cleared();
  // Every node is dead, so every host copy was released already.
  nodes_.clear();
  packed_.clear();
}

}  // namespace memsim::graph
