#include "graph/checkpoint.h"

#include <utility>

#include "graph/autocast.h"
#include "graph/compile.h"
#include "graph/numeric/numeric.h"
#include "graph/offload.h"
#include "graph/offload_streams.h"

namespace memsim::graph {

namespace {
// torch's _StopRecomputationError: unwinds the re-run once every placeholder is filled.
struct StopRecomputation {};
}  // namespace

const char* to_string(LayerCheckpoint c) {
  switch (c) {
    case LayerCheckpoint::keep: return "keep";
    case LayerCheckpoint::core_attention: return "core_attention";
    case LayerCheckpoint::attention: return "attention";
    case LayerCheckpoint::mlp: return "mlp";
    case LayerCheckpoint::modules: return "modules";
    case LayerCheckpoint::layer: return "layer";
  }
  return "keep";
}

bool CheckpointPlan::any() const {
  for (LayerCheckpoint c : layers)
    if (c != LayerCheckpoint::keep) return true;
  return false;
}

bool SelectivePolicy::any() const {
  for (SacRule r : rule)
    if (r != SacRule::recompute) return true;
  return false;
}

CheckpointEngine::CheckpointEngine(Runtime& rt, CheckpointPlan plan)
    : rt_(rt), plan_(std::move(plan)) {
  rt_.checkpoint = this;
}

CheckpointEngine::~CheckpointEngine() {
  if (rt_.checkpoint == this) rt_.checkpoint = nullptr;
}

bool CheckpointEngine::wants(RegionKind kind, int32_t layer) const {
  // No nesting, and nothing to drop when nothing is saved (checkpoint under no_grad
  // just calls the function).
  if (forward_region_ != 0 || recompute_region_ != 0 || !rt_.grad_enabled) return false;
  const LayerCheckpoint c = plan_.at(layer);
  switch (kind) {
    case RegionKind::layers: return c == LayerCheckpoint::layer;
    case RegionKind::attention:
      return c == LayerCheckpoint::attention || c == LayerCheckpoint::modules;
    case RegionKind::mlp: return c == LayerCheckpoint::mlp || c == LayerCheckpoint::modules;
    case RegionKind::core_attention: return c == LayerCheckpoint::core_attention;
  }
  return false;
}

Tensor CheckpointEngine::run(Inputs inputs, RegionFn fn, std::vector<uint8_t> ctx_held) {
  regions_.emplace_back();
  const uint32_t r = static_cast<uint32_t>(regions_.size());
  {
    Region& reg = regions_.back();
    reg.inputs = std::move(inputs);
    reg.fn = std::move(fn);
    reg.ctx = rt_.ctx;
    reg.ctx.region = r;
    reg.autocast = autocast_ != nullptr && autocast_->active();
    if (plan_.reentrant) reg.ctx_held = std::move(ctx_held);
    reg.graph = rt_.current_graph();
  }
  // _NoopSaveInputs saves the inputs through the ambient saved-tensor hooks before the
  // checkpoint's own take over: torchtune's OffloadActivations packs them
  // (graph/offload_streams.h).
  StreamOffload* streams = rt_.offload != nullptr ? rt_.offload->streams() : nullptr;
  const bool offloaded = streams != nullptr && streams->pack_inputs(r, regions_[r - 1].inputs);
  const uint32_t outer = rt_.ctx.region;
  rt_.ctx.region = r;
  forward_region_ = r;
  Tensor out;
  try {
    // regions_ does not grow while fn runs (no nesting), so the reference stays valid.
    const Region& reg = regions_[r - 1];
    out = reg.fn(reg.inputs);
  } catch (...) {
    rt_.ctx.region = outer;
    forward_region_ = 0;
    throw;
  }
  rt_.ctx.region = outer;
  forward_region_ = 0;
  if (rt_.compile != nullptr && plan_.selective.any()) drop_unread_cache(r);
  // The frame's saved inputs that were offloaded are ids in the hooks' tracker: the frame
  // holds no device reference to them (checkpoint()'s own `args` die as it returns).
  if (offloaded)
    for (size_t k = 0; k < regions_[r - 1].inputs.size(); ++k)
      if (streams->input_packed(r, k)) regions_[r - 1].inputs[k].reset();
  // CheckpointFunction.apply made a node (its ctx) when the output requires grad.
  regions_[r - 1].has_node = out.grad_fn >= 0;
  // Nothing saved (e.g. no input requires grad): no placeholder holds the frame.
  if (regions_[r - 1].live == 0) {
    drop_frame(regions_[r - 1]);
  } else if (plan_.reentrant && out.grad_fn >= 0) {
    // CheckpointFunctionBackward: the node the region's output grad is delivered to.
    const size_t node = static_cast<size_t>(out.grad_fn);
    if (output_of_.size() <= node) output_of_.resize(node + 1, 0);
    output_of_[node] = r;
  }
  return out;
}

void CheckpointEngine::drop_unread_cache(uint32_t r) {
  // torch.compile of a selectively checkpointed block: the policy's answers become the
  // nodes' recompute tags; a MUST_SAVE node is banned from recomputation
  // (partitioners.py should_ban_recomputation: "marked MUST_SAVE") but saved only when
  // the min-cut cuts it, i.e. when the backward or its recompute reads it. The last mm of
  // a Llama block (down_proj) is cached by the eager policy but read by nothing the
  // backward needs (its output feeds only the residual sum): not saved. Its entry stays
  // as an empty slot, so that the re-run's calls still line up (it hands back nothing).
  Region& reg = regions_[r - 1];
  for (Region::Cached& c : reg.cache) {
    if (c.storage == kNoStorage) continue;
    bool needed = false;
    for (uint32_t s : reg.saved_storages) needed = needed || s == c.storage;
    if (!needed && rt_.compile->read_up_to(c.storage, reg.last_save_node)) needed = true;
    if (needed) continue;
    sac_bytes_ -= c.bytes;
    rt_.release(c.storage);
    c.storage = kNoStorage;
  }
  reg.saved_storages.clear();
  reg.saved_storages.shrink_to_fit();
}

void CheckpointEngine::undo_unborn_output() {
  const uint32_t t = unborn_output_;
  unborn_output_ = kNoStorage;
  if (t == kNoStorage) return;
  auto& events = rt_.program().events;
  // Its alloc, and its free while the exception unwound (none: a kept tensor such as a
  // cuBLAS workspace, which stays).
  size_t a = events.size(), f = events.size();
  for (size_t i = events.size(); i-- > 0;) {
    if (events[i].tensor != t) continue;
    if (events[i].type == EventType::free && f == events.size()) f = i;
    if (events[i].type == EventType::alloc) {
      a = i;
      break;
    }
  }
  if (a == events.size() || f == events.size() || f < a) return;
  events.erase(events.begin() + static_cast<std::ptrdiff_t>(f));
  events.erase(events.begin() + static_cast<std::ptrdiff_t>(a));
}

bool CheckpointEngine::pack(int32_t node, uint32_t storage) {
  if (recompute_region_ != 0) {
    Region& reg = regions_[recompute_region_ - 1];
    const size_t k = recompute_next_++;
    if (k < reg.placeholders.size()) {
      const Placeholder& p = reg.placeholders[k];
      // A placeholder whose node is gone (its graph was discarded) is not filled.
      if (static_cast<size_t>(p.node) < node_holds_.size() && node_holds_[p.node] > 0) {
        rt_.fill_saved(p.node, p.slot, storage);
        // A compiled block's re-run (graph/compile.h, 4b): what the backward reads.
        if (rt_.compile != nullptr) rt_.compile->on_fill(p.node, p.slot, storage);
      }
      if (plan_.early_stop && !plan_.reentrant && recompute_next_ == reg.placeholders.size()) {
        // torch makes an op's node and saves its inputs before the kernel runs
        // (VariableType); memsim's ops allocate their output first. When the save that
        // ends the re-run is not of the tensor just allocated, that output never existed
        // in the real re-run (H100 trace: no down_proj output in an MLP region's re-run).
        // A selective checkpoint's cached op allocated nothing: the last alloc belongs to
        // an earlier op and did exist.
        const auto& events = rt_.program().events;
        unborn_output_ = (!events.empty() && rt_.program().event_count() != reused_at_ &&
                          events.back().type == EventType::alloc &&
                          events.back().tensor != storage)
                             ? events.back().tensor
                             : kNoStorage;
        // torch exits the re-run's autocast context while the exception unwinds; the
        // re-run's locals die later, with the traceback that holds their frames.
        leave_autocast();
        throw StopRecomputation{};
      }
    }
    return true;  // the re-run's own graph keeps nothing
  }
  if (forward_region_ == 0) return false;
  Region& reg = regions_[forward_region_ - 1];
  if (rt_.compile != nullptr && plan_.selective.any()) {
    reg.saved_storages.push_back(storage);
    reg.last_save_node = node;
  }
  // A block compiled inside the checkpoint (torchtune's order, graph/compile.h 4c): what
  // the placeholder stands for is what the compiled forward saves.
  if (rt_.compile != nullptr) rt_.compile->on_pack(node, rt_.node(node).saved_count, storage);
  reg.placeholders.push_back({node, rt_.node(node).saved_count});
  ++reg.live;
  if (node_holds_.size() <= static_cast<size_t>(node)) node_holds_.resize(node + 1, 0);
  ++node_holds_[node];
  return true;
}

void CheckpointEngine::unpack(int32_t node) {
  if (static_cast<size_t>(node) < output_of_.size() && output_of_[node] != 0) {
    const uint32_t r = output_of_[node];
    output_of_[node] = 0;
    Region& reg = regions_[r - 1];
    if (reg.live > 0) {  // the frame is still alive: this is the region's backward
      const Node& n = rt_.node(node);
      for (int s = 0; s < 2 && reg.held_grad == kNoStorage; ++s) {
        if (n.grad[s] == kNoStorage) continue;
        reg.held_grad = n.grad[s];
        rt_.retain(reg.held_grad);
      }
      if (!reg.recomputed) recompute(r);
    }
  }
  if (static_cast<size_t>(node) >= node_holds_.size() || node_holds_[node] == 0) return;
  const uint32_t r = rt_.node(node).region;
  if (r == 0 || r > regions_.size() || regions_[r - 1].recomputed) return;
  recompute(r);
}

void CheckpointEngine::recompute(uint32_t r) {
  Region& reg = regions_[r - 1];
  const OpContext outer_ctx = rt_.ctx;
  const bool outer_grad = rt_.grad_enabled;
  const bool outer_recomputing = rt_.recomputing;
  rt_.ctx.layer = reg.ctx.layer;
  rt_.ctx.module = reg.ctx.module;
  rt_.ctx.region = r;  // the phase stays: this happens inside backward
  // ctx.saved_tensors of _NoopSaveInputs: offloaded inputs come back through the hooks'
  // unpack (graph/offload_streams.h), as `args`, a local of the checkpoint's unpack hook, before
  // the re-run starts.
  Inputs unpacked;
  const Inputs* args = &reg.inputs;
  StreamOffload* streams = rt_.offload != nullptr ? rt_.offload->streams() : nullptr;
  if (streams != nullptr && streams->input_packed(r)) {
    unpacked = reg.inputs;
    streams->unpack_inputs(r, unpacked);
    args = &unpacked;
  }
  rt_.grad_enabled = true;
  rt_.recomputing = true;
  recompute_region_ = r;
  recompute_next_ = 0;
  // The re-run records a graph of its own, discarded at once (torch detaches what it
  // keeps and drops the re-run's output).
  const uint32_t g = rt_.begin_graph();
  if (reg.autocast && autocast_ != nullptr) {
    // Reentrant: the re-run's inputs are detach_variable()'s leaves (graph/autocast.h).
    autocast_->enter_nested(plan_.reentrant ? &reg.inputs : nullptr);
    autocast_entered_ = true;
  }
  Tensor out;
  try {
    out = reg.fn(*args);
  } catch (const StopRecomputation&) {
    // early stop: the re-run's locals died while unwinding, as in Python
    undo_unborn_output();
  } catch (...) {
    leave_autocast();
    throw;
  }
  leave_autocast();  // the with-block ends: the re-run's casts leave the cache
  // Reentrant: `outputs` is a local of CheckpointFunction.backward while it runs the
  // inner torch.autograd.backward over the region. Non-reentrant (no early stop):
  // unpack's `_unused` dies when unpack returns.
  if (plan_.reentrant) reg.output = std::move(out);
  out.reset();
  unpacked.clear();
  recompute_region_ = 0;
  rt_.discard_graph(g);
  rt_.ctx = outer_ctx;
  rt_.grad_enabled = outer_grad;
  rt_.recomputing = outer_recomputing;
  reg.recomputed = true;
  ++recomputations_;
}

void CheckpointEngine::leave_autocast() {
  if (!autocast_entered_) return;
  autocast_entered_ = false;
  autocast_->leave_nested();
}

void CheckpointEngine::released(int32_t node) {
  if (static_cast<size_t>(node) >= node_holds_.size() || node_holds_[node] == 0) return;
  const uint32_t r = rt_.node(node).region;
  Region& reg = regions_[r - 1];
  reg.live -= node_holds_[node];
  node_holds_[node] = 0;
  if (reg.live == 0) drop_frame(reg);
}

void CheckpointEngine::graph_died(uint32_t g) {
  if (held_.empty()) return;
  // The nodes die from the graph's output back to its inputs, so the regions' ctxs go in
  // the order their frames dropped in backward (the last layer's first); a tensor shared
  // by every layer's ctx (the (cos, sin) tables) is freed with the first layer's.
  size_t kept = 0;
  for (size_t i = 0; i < held_.size(); ++i) {
    const Held h = held_[i];
    if (h.graph != g) {
      held_[kept++] = h;
      continue;
    }
    held_bytes_ -= h.bytes;
    rt_.release(h.storage);
  }
  held_.resize(kept);
}

bool CheckpointEngine::sac_saves(OpKind k, uint32_t& calls) const {
  switch (plan_.selective.rule[static_cast<size_t>(k)]) {
    case SacRule::recompute: return false;
    case SacRule::save: return true;
    case SacRule::save_odd: return ++calls % 2 == 1;
  }
  return false;
}

void CheckpointEngine::sac_cache(OpKind k, std::initializer_list<const Tensor*> outs) {
  if (forward_region_ == 0) return;
  Region& reg = regions_[forward_region_ - 1];
  if (!sac_saves(k, reg.forward_calls)) return;
  // One entry per output slot, an undefined output included (SDPA's logsumexp without
  // grad), so that the re-run's call takes back exactly its own entries.
  for (const Tensor* t : outs) {
    if (t == nullptr || !t->defined()) {
      reg.cache.push_back({kNoStorage, 0});
      continue;
    }
    rt_.retain(t->storage);  // _VersionWrapper(x.detach()): an alias of the output
    if (rt_.numeric != nullptr) rt_.numeric->stash(t->storage);
    reg.cache.push_back({t->storage, t->bytes});
    sac_bytes_ += t->bytes;
  }
}

bool CheckpointEngine::sac_reused(OpKind k, std::initializer_list<Tensor*> outs) {
  if (recompute_region_ == 0) return false;
  Region& reg = regions_[recompute_region_ - 1];
  if (!sac_saves(k, reg.recompute_calls)) return false;
  // The forward cached exactly these outputs in this order (same policy, same calls).
  if (reg.cache.size() - reg.cache_next < outs.size()) return false;
  for (Tensor* t : outs) {
    const Region::Cached c = reg.cache[reg.cache_next++];
    if (c.storage == kNoStorage) {
      t->reset();
      continue;
    }
    sac_bytes_ -= c.bytes;
    if (rt_.numeric != nullptr) rt_.numeric->restore(c.storage);
    *t = rt_.adopt(c.storage, c.bytes);  // the entry is _CONSUMED: its reference moves
  }
  reused_at_ = rt_.program().event_count();
  return true;
}

void CheckpointEngine::drop_frame(Region& reg) {
  // The frame (inputs, function, SAC cache) dies with its last placeholder.
  for (size_t i = reg.cache_next; i < reg.cache.size(); ++i) {
    if (reg.cache[i].storage == kNoStorage) continue;
    if (rt_.numeric != nullptr) rt_.numeric->drop_stash(reg.cache[i].storage);
    sac_bytes_ -= reg.cache[i].bytes;
    rt_.release(reg.cache[i].storage);
  }
  reg.cache.clear();
  reg.cache.shrink_to_fit();
  reg.cache_next = 0;
  reg.fn = nullptr;
  // Reentrant: ctx.inputs / ctx.run_function outlive the saved tensors; the node's ctx
  // keeps them until the graph dies (graph_died). One reference each, taken before the
  // frame's own go below.
  if (reg.has_node)
    for (const uint8_t k : reg.ctx_held) {
      if (k >= reg.inputs.size() || !reg.inputs[k].defined()) continue;
      const Tensor& t = reg.inputs[k];
      rt_.retain(t.storage);
      held_.push_back({reg.graph, t.storage, t.bytes});
      held_bytes_ += t.bytes;
    }
  reg.ctx_held.clear();
  // First input to last: each Tensor's free is an event, and std::vector::clear's order is
  // the library's (libstdc++ first to last, libc++, the WebAssembly build's, last to first).
  for (Tensor& t : reg.inputs) t.reset();
  reg.inputs.clear();
  reg.output.reset();
  if (reg.held_grad != kNoStorage) {
    const uint32_t g = reg.held_grad;
    reg.held_grad = kNoStorage;
    rt_.release(g);
  }
  reg.placeholders.clear();
  reg.placeholders.shrink_to_fit();
}

// ------------------------------------------------------------------ emitter side
Tensor run_layers(Runtime& rt, int32_t n_layers, Tensor x, const Inputs& extra,
                  const LayerFn& block, const std::vector<uint8_t>& ctx_held) {
  CheckpointEngine* e = rt.checkpoint;
  for (int32_t l = 0; l < n_layers;) {
    if (e == nullptr || !e->wants(RegionKind::layers, l)) {
      x = block(l, x, extra);
      ++l;
      continue;
    }
    const CheckpointPlan& plan = e->plan();
    auto segment_of = [&plan](int32_t j) {
      return plan.segment.empty() ? j : plan.segment[static_cast<size_t>(j)];
    };
    int32_t end = l + 1;
    while (end < n_layers && plan.at(end) == LayerCheckpoint::layer &&
           segment_of(end) == segment_of(l))
      ++end;
    Inputs in;
    in.reserve(extra.size() + 1);
    in.push_back(x);
    in.insert(in.end(), extra.begin(), extra.end());
    const int32_t first = l;
    std::vector<uint8_t> held;  // indices into extra, shifted past x
    held.reserve(ctx_held.size());
    for (const uint8_t k : ctx_held) held.push_back(static_cast<uint8_t>(k + 1));
    x = e->run(std::move(in), [block, first, end](const Inputs& args) {
      // def segment(x, *extra): for layer in layers[first:end]: x = layer(x, *extra)
      const Inputs rest(args.begin() + 1, args.end());
      Tensor y = args[0];
      for (int32_t j = first; j < end; ++j) y = block(j, y, rest);
      return y;
    }, std::move(held));
    l = end;
  }
  return x;
}

Tensor run_region(Runtime& rt, RegionKind kind, const Inputs& inputs, const RegionFn& fn,
                  const std::vector<uint8_t>& ctx_held) {
  CheckpointEngine* e = rt.checkpoint;
  if (e == nullptr || !e->wants(kind, rt.ctx.layer)) return fn(inputs);
  return e->run(inputs, fn, ctx_held);
}

}  // namespace memsim::graph
