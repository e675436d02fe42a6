#include "graph/runtime.h"

#include <algorithm>
#include <string>

#include "graph/checkpoint.h"
#include "graph/offload.h"
#include "graph/offload_streams.h"
#include "graph/compile.h"
#include "graph/op_cost.h"
#include "graph/numeric/numeric.h"
#include "graph/ops/ops.h"

namespace memsim::graph {

namespace {
// A node whose graph has been consumed or discarded (its saves are released).
constexpr uint32_t kDeadNode = UINT32_MAX - 1;
}  // namespace

// ---------------------------------------------------------------- Tensor handle
Tensor::Tensor(const Tensor& o)
    : storage(o.storage), bytes(o.bytes), grad_fn(o.grad_fn), out_slot(o.out_slot),
      rt_(o.rt_) {
  if (rt_ != nullptr) rt_->retain(storage);
}
Tensor::Tensor(Tensor&& o) noexcept
    : storage(o.storage), bytes(o.bytes), grad_fn(o.grad_fn), out_slot(o.out_slot),
      rt_(o.rt_) {
  o.rt_ = nullptr;
  o.storage = kNoStorage;
}
Tensor& Tensor::operator=(const Tensor& o) {
  if (this == &o) return *this;
  if (o.rt_ != nullptr) o.rt_->retain(o.storage);
  reset();  // Python: the new value is bound before the old one is dropped
  storage = o.storage; bytes = o.bytes; grad_fn = o.grad_fn; out_slot = o.out_slot;
  rt_ = o.rt_;
  return *this;
}
Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this == &o) return *this;
  reset();
  storage = o.storage; bytes = o.bytes; grad_fn = o.grad_fn; out_slot = o.out_slot;
  rt_ = o.rt_;
  o.rt_ = nullptr;
  o.storage = kNoStorage;
  return *this;
}
void Tensor::reset() {
  if (rt_ == nullptr) return;
  Runtime* rt = rt_;
  rt_ = nullptr;
  rt->release(storage);
  storage = kNoStorage;
  grad_fn = -1;
}

// ---------------------------------------------------------------- Runtime
Runtime::Runtime(Program& program, RuntimeBuffers* buffers)
    : program_(program), buffers_(buffers) {
  for (int k = 0; k < kOpKindCount; ++k) {
    fwd_name_[k] = program_.intern(forward_name(static_cast<OpKind>(k)));
    bwd_name_[k] = program_.intern(backward_name(static_cast<OpKind>(k)));
  }
  for (int m = 0; m < kModuleCount; ++m)
    program_.module_label[m] = m == 0 ? 0 : program_.intern(to_string(static_cast<Module>(m)));
  if (buffers_ != nullptr) {
    refs_.swap(buffers_->refs);
    nodes_.swap(buffers_->nodes);
    saved_.swap(buffers_->saved);
    refs_.clear();
    nodes_.clear();
    saved_.clear();
  }
  refs_.reserve(1 << 14);
  nodes_.reserve(1 << 12);
  saved_.reserve(1 << 13);
}

Runtime::~Runtime() {
  if (buffers_ == nullptr) return;
  refs_.swap(buffers_->refs);
  nodes_.swap(buffers_->nodes);
  saved_.swap(buffers_->saved);
}

void Runtime::reserve(size_t events) {
  program_.reserve(events);
  program_.tensors.reserve(events / 2 + 16);
  refs_.reserve(events / 2 + 16);
}

uint32_t Runtime::alloc_raw(uint64_t bytes, TensorKind kind, OpKind op) {
  if (hooks != nullptr) {
    if (hook_countdown != 0 && --hook_countdown == 0) hooks->countdown_done(*this);
    if (ctx.layer != hooked_layer_ || ctx.module != hooked_module_) {
      hooked_layer_ = ctx.layer;  // first: the hook's own allocations do not re-enter
      hooked_module_ = ctx.module;
      hooks->layer_entered(*this, ctx.layer);
    }
  }
  cur_op_ = op;
  uint32_t op_name = op_id(op, in_backward_);
  // No name: tensor_names.h composes one from the op and ctx.module (stored here, in
  // TensorInfo's padding) unless a later step names the tensor (grads, saved inputs, ...).
  uint32_t id = program_.alloc(bytes, kind, ctx.phase, op_name, ctx.layer, 0);
  TensorInfo& info = program_.tensors[id];  // not back(): ids are recycled with a sink
  info.module = static_cast<uint8_t>(ctx.module);
  info.flags = recomputing ? kTensorRecomputed : 0;
  // Time model (graph/op_cost.h): HBM bytes of ops that are not GEMMs, by part. The
  // optimizer's are counted per parameter by the optimizer (sim/optim/optimizer_cost.h).
  if (const int crossings = hbm_writes_and_reads(op); crossings > 0) {
    const Phase p = ctx.phase;
    if (p == Phase::forward || p == Phase::loss || p == Phase::backward) {
      const CostPart part = recomputing ? CostPart::recompute
                            : p == Phase::backward ? CostPart::backward
                                                   : CostPart::forward;
      program_.cost.traffic[static_cast<int>(part)] += static_cast<double>(crossings) * bytes;
    }
  }
  set_refs(id);
  if (numeric != nullptr) numeric->on_alloc(id, bytes);
  if (compile != nullptr) compile->on_alloc(id, bytes, op);
  return id;
}

void Runtime::run_layer_hooks(int32_t layer) {
  if (hooks == nullptr) return;
  const OpContext outer = ctx;
  ctx.layer = layer;
  // The hook's own allocations are made in this context: they do not re-enter it.
  if (ctx.layer != hooked_layer_ || ctx.module != hooked_module_) {
    hooked_layer_ = ctx.layer;
    hooked_module_ = ctx.module;
    hooks->layer_entered(*this, layer);
  }
  ctx = outer;
}

Tensor Runtime::alloc(uint64_t bytes, TensorKind kind, OpKind op) {
  Tensor t;
  t.storage = alloc_raw(bytes, kind, op);
  t.bytes = bytes;
  t.rt_ = this;
  return t;
}

void Runtime::release(uint32_t s) {
  if (frozen_) return;
  if (--refs_[s] == 0) {
    // The last reference: the id may be recycled (program/program.h).
    program_.free(s, ctx.phase, op_id(cur_op_, in_backward_), ctx.layer, /*recycle=*/true);
    if (numeric != nullptr) numeric->on_free(s);
  }
}

Tensor Runtime::adopt(uint32_t storage, uint64_t bytes) {
  Tensor t;
  t.storage = storage;
  t.bytes = bytes;
  t.rt_ = this;
  return t;
}

Tensor Runtime::view_of(const Tensor& base, uint64_t bytes) {
  Tensor t(base);
  t.bytes = bytes;
  return t;
}

int32_t Runtime::add_parameter(uint64_t bytes, std::string_view name) {
  Parameter p;
  p.bytes = bytes;
  uint32_t op = program_.intern("empty");
  p.storage = program_.alloc(bytes, TensorKind::parameter, ctx.phase, op, ctx.layer,
                             program_.intern(name));
  program_.tensors[p.storage].module = static_cast<uint8_t>(ctx.module);
  note_module_path(name);
  set_refs(p.storage);  // owned by the module (never freed)
  params_.push_back(p);
  if (numeric != nullptr) {
    numeric->on_alloc(p.storage, bytes);
    numeric->on_parameter(static_cast<int32_t>(params_.size() - 1), p.storage, name);
  }
  return static_cast<int32_t>(params_.size() - 1);
}

Tensor Runtime::alloc_leaf(uint64_t bytes, TensorKind kind, OpKind op, int32_t* leaf) {
  Tensor t = alloc(bytes, kind, op);
  *leaf = static_cast<int32_t>(leaf_grads_.size());
  leaf_grads_.push_back(kNoStorage);
  Node n;
  n.kind = OpKind::accumulate_grad;
  n.seq = UINT32_MAX;  // AccumulateGrad runs as soon as it is ready
  n.param = -2 - *leaf;
  n.graph = graph_epoch_;
  n.size[0] = bytes;
  n.layer = ctx.layer;
  n.module = ctx.module;
  nodes_.push_back(n);
  ++live_nodes_;
  t.grad_fn = static_cast<int32_t>(nodes_.size() - 1);
  return t;
}

void Runtime::requires_grad_(Tensor& t) {
  if (!t.defined() || t.grad_fn >= 0) return;  // already in the graph: a no-op in torch
  const int32_t leaf = static_cast<int32_t>(leaf_grads_.size());
  leaf_grads_.push_back(kNoStorage);
  Node n;
  n.kind = OpKind::accumulate_grad;
  n.seq = UINT32_MAX;  // AccumulateGrad runs as soon as it is ready
  n.param = -2 - leaf;
  n.graph = graph_epoch_;
  n.size[0] = t.bytes;
  n.layer = ctx.layer;
  n.module = ctx.module;
  nodes_.push_back(n);
  ++live_nodes_;
  t.grad_fn = static_cast<int32_t>(nodes_.size() - 1);
  retain(t.storage);  // AccumulateGrad's `variable`
  held_leaves_.push_back({graph_epoch_, t.storage, leaf});
}

uint32_t Runtime::take_leaf_grad(int32_t leaf) {
  const uint32_t g = leaf_grads_[static_cast<size_t>(leaf)];
  leaf_grads_[static_cast<size_t>(leaf)] = kNoStorage;
  return g;
}

Tensor Runtime::param(int32_t i) {
  if (param_hooks && hooks != nullptr) hooks->param_used(*this, i, false);
  Parameter& p = params_[i];
  Tensor t;
  t.storage = p.storage;
  t.bytes = p.bytes;
  t.rt_ = this;
  retain(p.storage);
  if (grad_enabled && !p.frozen) {
    if (p.graph_epoch != graph_epoch_ || p.acc_node < 0) {
      Node n;
      n.kind = OpKind::accumulate_grad;
      n.seq = UINT32_MAX;  // AccumulateGrad runs as soon as it is ready
      n.param = i;
      n.graph = graph_epoch_;
      n.size[0] = p.bytes;
      n.layer = ctx.layer;
      n.module = ctx.module;
      nodes_.push_back(n);
      ++live_nodes_;
      p.acc_node = static_cast<int32_t>(nodes_.size() - 1);
      p.graph_epoch = graph_epoch_;
    }
    t.grad_fn = p.acc_node;
  }
  return t;
}

void Runtime::zero_grad_set_to_none() {
  cur_op_ = OpKind::other;
  for (Parameter& p : params_) {
    if (p.grad != kNoStorage) {
      release(p.grad);
      p.grad = kNoStorage;
    }
  }
}

int32_t Runtime::make_node(OpKind kind, std::initializer_list<const Tensor*> inputs) {
  Node n;
  n.kind = kind;
  n.seq = seq_++;
  n.layer = ctx.layer;
  n.module = ctx.module;
  n.region = ctx.region;
  n.graph = graph_epoch_;
  for (const Tensor* t : inputs) {
    Edge e;
    if (t != nullptr && t->grad_fn >= 0) {
      e.node = t->grad_fn;
      e.slot = t->out_slot;
    }
    n.next[n.n_next++] = e;
  }
  n.saved_first = static_cast<uint32_t>(saved_.size());
  nodes_.push_back(n);
  ++live_nodes_;
  const int32_t id = static_cast<int32_t>(nodes_.size() - 1);
  if (numeric != nullptr) numeric->on_node(id, kind);
  if (compile != nullptr) compile->on_node(id, kind, inputs);
  return id;
}

void Runtime::save_storage(int32_t id, uint32_t storage) {
  // Saves are recorded right after make_node, so a node's saves are contiguous.
  if (checkpoint != nullptr && checkpoint->pack(id, storage)) {
    saved_.push_back(kNoStorage);  // a checkpoint placeholder: no reference
    ++nodes_[id].saved_count;
    return;
  }
  if (offload != nullptr) {
    const uint64_t bytes = save_bytes_ ? save_bytes_ : program_.tensors[storage].bytes;
    const bool forward = !in_backward_ && !recomputing;
    // save_on_cpu around layers, or torchtune's OffloadActivations (graph/offload_streams.h)
    StreamOffload* streams = offload->streams();
    if (streams != nullptr ? forward && streams->pack(id, nodes_[id].saved_count, storage, bytes)
                           : offload->pack(id, nodes_[id].saved_count, bytes, ctx.layer, forward)) {
      saved_.push_back(kNoStorage);  // packed to host: no reference on the device tensor
      ++nodes_[id].saved_count;
      return;
    }
  }
  Node& n = nodes_[id];
  if (saves_++ != test_drop_save) retain(storage);  // test_drop_save: see runtime.h
  name_saved(n, storage);
  saved_.push_back(storage);
  ++n.saved_count;
  if (compile != nullptr) compile->on_save(id, storage);
}

void Runtime::name_saved(const Node& n, uint32_t storage) {
  // An activation saved by an op on a parameter (a linear's input, a norm's normalised
  // input) is "saved input of <that parameter's module>"; the first such save names it.
  TensorInfo& info = program_.tensors[storage];
  if (info.name != 0 || info.kind == TensorKind::parameter || info.kind == TensorKind::input)
    return;
  for (uint8_t k = 0; k < n.n_next; ++k) {
    const int32_t next = n.next[k].node;
    if (next < 0) continue;
    const Node& w = nodes_[next];
    if (w.kind != OpKind::accumulate_grad || w.param < 0) continue;
    info.name = program_.tensors[params_[w.param].storage].name;
    info.role = recomputing ? NameRole::saved_input_recomputed : NameRole::saved_input;
    return;
  }
}

void Runtime::fill_saved(int32_t id, uint32_t k, uint32_t storage) {
  retain(storage);
  name_saved(nodes_[id], storage);
  saved_[nodes_[id].saved_first + k] = storage;
}

void Runtime::save(int32_t id, const Tensor& t) {
  save_bytes_ = t.bytes;  // a view is packed at its own size (graph/offload.h)
  save_storage(id, t.storage);
  save_bytes_ = 0;
}

namespace {
// "model.layers.3.mlp.up_proj.weight" -> "model.layers.3.mlp.up_proj".
std::string_view module_of(std::string_view param_name) {
  const size_t dot = param_name.rfind('.');
  return dot == std::string_view::npos ? param_name : param_name.substr(0, dot);
}
// The longest common dotted prefix of two module paths ("" when none).
std::string_view common_path(std::string_view a, std::string_view b) {
  size_t n = 0, last_dot = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) {
    if (a[n] == '.') last_dot = n;
    ++n;
  }
  const bool whole = (n == a.size() || a[n] == '.') && (n == b.size() || b[n] == '.');
  return whole ? a.substr(0, n) : a.substr(0, last_dot);
}
}  // namespace

void Runtime::note_module_path(std::string_view param_name) {
  // The path of (ctx.layer, ctx.module): the common prefix of the modules of the
  // parameters created there (a layer's two norms share "model.layers.3").
  // A name with a space describes a buffer ("fp32 partition of group 0 (ZeRO-2)", an FSDP
  // shard), not a state_dict key: it names no module.
  if (param_name.find(' ') != std::string_view::npos) return;
  const uint8_t m = static_cast<uint8_t>(ctx.module);
  const std::string_view mine = module_of(param_name);
  const uint32_t old = program_.module_path(ctx.layer, m);
  // A copy: intern() may grow the string table that `old`'s text lives in.
  if (old != 0 && common_path(program_.str(old), mine).size() == program_.str(old).size())
    return;  // the path stands (most parameters): nothing to intern
  // A copy: intern() may grow the string table that `old`'s text lives in.
  const std::string path(old == 0 ? mine : common_path(program_.str(old), mine));
  if (!path.empty()) program_.set_module_path(ctx.layer, m, program_.intern(path));
}

void Runtime::release_saved(Node& n) {
  for (uint32_t i = 0; i < n.saved_count; ++i)
    if (saved_[n.saved_first + i] != kNoStorage) release(saved_[n.saved_first + i]);
  n.saved_count = 0;
  const int32_t id = static_cast<int32_t>(&n - nodes_.data());
  // In the forward this is a node that died there (a tensor off the loss's path, e.g. a
  // router's group-selection top-k): a checkpoint's placeholders for it die with it, so the
  // re-run does not refill them (torch's non-reentrant checkpoint stores a recomputed
  // tensor only while the original node's Holder lives). In backward the node's run
  // notifies the engine itself.
  if (checkpoint != nullptr && !in_backward_ && !recomputing) checkpoint->released(id);
  if (offload != nullptr) offload->released(id);
}

void Runtime::release_saved_slot(Node& n, uint32_t k) {
  if (k >= n.saved_count) return;
  uint32_t& s = saved_[n.saved_first + k];
  if (s == kNoStorage) return;
  release(s);
  s = kNoStorage;
}

void Runtime::discard_graph(uint32_t g) {
  // The output holding the graph died: torch::autograd::deleteNode. From each root
  // (a node no other live node points to; the newest first) the node's saved variables
  // are released, then each next function whose last owner this edge was is pushed on a
  // stack; the stack is popped from the back. Each node is freed when its last owner
  // goes, so saved tensors die from the output back towards the inputs.
  const OpKind saved_op = cur_op_;
  cur_op_ = OpKind::other;
  // Only nodes_[first..] can belong to g (see graph_start_).
  size_t first = 0;
  if (g >= 2 && g > cleared_epoch_ && g - 2 < graph_start_.size()) first = graph_start_[g - 2];
  first = std::min(first, nodes_.size());
  // Scratch buffers taken from the members (and handed back below) keep their capacity
  // across calls; taking them also keeps a nested call (none today) from sharing them.
  std::vector<uint32_t> owners = std::move(owners_scratch_);
  std::vector<int32_t> stack = std::move(stack_scratch_);
  owners.assign(nodes_.size() - first, 0);  // owners[id - first]
  stack.clear();
  for (size_t id = first; id < nodes_.size(); ++id) {
    const Node& n = nodes_[id];
    if (n.graph != g || n.seq == kDeadNode) continue;
    for (int i = 0; i < n.n_next; ++i) {
      const int32_t t = n.next[i].node;
      // An edge into an older graph (a re-run's graph points into the outer one) is
      // never followed below; only g's own nodes need owner counts.
      if (t >= 0 && static_cast<size_t>(t) >= first) ++owners[t - first];
    }
  }
  auto kill = [&](int32_t id) {
    Node& n = nodes_[id];
    for (uint32_t i = 0; i < n.saved_count; ++i)
      if (saved_[n.saved_first + i] != kNoStorage) release(saved_[n.saved_first + i]);
    n.saved_count = 0;
    if (checkpoint != nullptr) checkpoint->released(id);
    if (compile != nullptr) compile->released(id);
    if (offload != nullptr) offload->released(id);
    for (int s = 0; s < 2; ++s)
      if (n.grad[s] != kNoStorage) release(n.grad[s]);
    n.grad[0] = n.grad[1] = kNoStorage;
    n.seq = kDeadNode;
    --live_nodes_;
    for (int i = 0; i < n.n_next; ++i) {
      const int32_t t = n.next[i].node;
      // Only this graph's nodes: a checkpoint re-run's graph points into the outer one.
      if (t >= 0 && static_cast<size_t>(t) >= first && nodes_[t].graph == g &&
          --owners[t - first] == 0 &&
          nodes_[t].seq != kDeadNode)
        stack.push_back(t);
    }
  };
  for (int32_t id = static_cast<int32_t>(nodes_.size()) - 1; id >= static_cast<int32_t>(first);
       --id) {
    const Node& n = nodes_[id];
    if (n.graph != g || n.seq == kDeadNode || owners[id - first] != 0) continue;
    kill(id);
    while (!stack.empty()) {
      const int32_t t = stack.back();
      stack.pop_back();
      kill(t);
    }
  }
  // Reentrant checkpoints' ctx objects (graph/checkpoint.h): their nodes lie between the
  // output and the embedding's AccumulateGrad, so they go before the leaves below.
  if (checkpoint != nullptr) checkpoint->graph_died(g);
  // requires_grad_ leaves of g: their AccumulateGrad died with the graph (.grad first).
  for (size_t i = 0; i < held_leaves_.size();) {
    HeldLeaf& h = held_leaves_[i];
    if (h.graph != g) {
      ++i;
      continue;
    }
    const uint32_t grad = take_leaf_grad(h.leaf);
    const uint32_t storage = h.storage;
    held_leaves_.erase(held_leaves_.begin() + static_cast<std::ptrdiff_t>(i));
    if (grad != kNoStorage) release(grad);
    release(storage);
  }
  if (live_nodes_ == 0) {
    nodes_.clear();
    saved_.clear();
    cleared_epoch_ = graph_epoch_;
    if (offload != nullptr) offload->nodes_cleared();
  }
  owners_scratch_ = std::move(owners);
  stack_scratch_ = std::move(stack);
  cur_op_ = saved_op;
}

void Runtime::note_gemm() {
  const int thread = in_backward_ ? 1 : 0;
  if (cublas_workspace == 0 || workspace_[thread] != kNoStorage) return;
  workspace_[thread] = alloc_raw(cublas_workspace, TensorKind::other, OpKind::other);
}

void Runtime::note_gemm_lt() {
  note_gemm();
  const int thread = in_backward_ ? 1 : 0;
  if (cublas_workspace == 0 || lt_workspace_[thread] != kNoStorage) return;
  lt_workspace_[thread] = alloc_raw(kCublasLtWorkspace, TensorKind::other, OpKind::other);
}

// ------------------------------------------------------------------- backward
void Runtime::backward(const Tensor& loss) {
  if (loss.grad_fn < 0) return;
  // torch.autograd.backward: grad_tensors = ones_like(loss), a 0-d tensor.
  ctx.layer = nodes_[loss.grad_fn].layer;
  in_backward_ = true;  // the engine's thread allocates it (its op name is fill's backward one)
  const uint32_t root_grad = alloc_raw(loss.bytes, TensorKind::temporary, OpKind::fill);
  in_backward_ = false;
  if (numeric != nullptr) numeric->on_root_grad(root_grad, loss.storage);
  // The Python frame of torch.autograd.backward holds grad_tensors until it returns.
  run_engine(loss.grad_fn, loss.out_slot, root_grad);
  cur_op_ = OpKind::fill;
  release(root_grad);
  if (numeric != nullptr) numeric->on_backward_done(*this);
}

void Runtime::backward(int32_t grad_fn, uint8_t out_slot, uint32_t grad) {
  run_engine(grad_fn, out_slot, grad);
  if (numeric != nullptr) numeric->on_backward_done(*this);
}

void Runtime::run_engine(int32_t grad_fn, uint8_t out_slot, uint32_t root_grad) {
  const Phase phase = ctx.phase;
  // Dependencies: the number of edges into each node from nodes reachable from root.
  // The nodes reached are listed (and killed below) instead of flagging all of nodes_:
  // a pipeline schedule keeps many micro-batches' graphs alive, and a scan of every node
  // after each backward made a long pipeline quadratic (issue #20). A node is "seen" in
  // this call when its stamp equals this call's epoch (a nested call, from a reentrant
  // checkpoint's backward, takes a new epoch only after this walk is over).
  if (grad_fn < 0) return;
  const uint32_t epoch = ++engine_epoch_;
  if (engine_stamp_.size() < nodes_.size()) engine_stamp_.resize(nodes_.size(), 0);
  std::vector<int32_t> stack;
  std::vector<int32_t> reached;
  stack.push_back(grad_fn);
  reached.push_back(grad_fn);
  engine_stamp_[grad_fn] = epoch;
  while (!stack.empty()) {
    int32_t id = stack.back();
    stack.pop_back();
    Node& n = nodes_[id];
    for (int i = 0; i < n.n_next; ++i) {
      int32_t t = n.next[i].node;
      if (t < 0) continue;
      ++nodes_[t].deps;
      if (engine_stamp_[t] != epoch) {
        engine_stamp_[t] = epoch;
        reached.push_back(t);
        stack.push_back(t);
      }
    }
  }
  in_backward_ = true;
  Node& root = nodes_[grad_fn];
  ctx.layer = root.layer;
  retain(root_grad);  // the root node's input buffer; the caller keeps its own
  root.grad[out_slot] = root_grad;
  std::vector<int32_t> ready;  // binary heap on seq
  ready.push_back(grad_fn);
  auto cmp = [this](int32_t a, int32_t b) { return nodes_[a].seq < nodes_[b].seq; };
  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end(), cmp);
    int32_t id = ready.back();
    ready.pop_back();
    run_node(id, ready);
  }
  // An AccumulateGrad whose uses did not all deliver (an edge whose producer handed back
  // no grad) still runs once with what its buffer holds, as the engine's node does when
  // its graph task's dependencies are exhausted; its count is reset for any outer walk.
  for (const int32_t i : reached) {
    Node& a = nodes_[i];
    if (a.kind != OpKind::accumulate_grad) continue;
    a.deps = 0;
    if (a.grad[0] == kNoStorage) continue;
    a.grad_is_view[1] = false;
    run_accumulate_grad(a);
  }
  // OffloadActivations' callback queued on the engine: the backward stash empties.
  if (offload != nullptr && offload->streams() != nullptr) offload->streams()->backward_done();
  in_backward_ = false;
  // Reached nodes are dead now (retain_graph=False).
  for (const int32_t i : reached) {
    if (nodes_[i].seq != kDeadNode) {
      nodes_[i].seq = kDeadNode;
      --live_nodes_;
    }
  }
  if (live_nodes_ == 0) {
    nodes_.clear();
    saved_.clear();
    cleared_epoch_ = graph_epoch_;
    if (offload != nullptr) offload->nodes_cleared();
  }
  ctx.phase = phase;
}

void Runtime::run_node(int32_t id, std::vector<int32_t>& ready) {
  // Unpacking a checkpoint placeholder (or reaching a reentrant region's output node) may
  // re-run its region first (appending nodes).
  StreamOffload* streams = offload != nullptr ? offload->streams() : nullptr;
  if (streams != nullptr) streams->node_begins(id);
  if (checkpoint != nullptr) checkpoint->unpack(id);
  if (compile != nullptr) compile->unpack(id);
  Node& n = nodes_[id];
  ctx.layer = n.layer;
  ctx.module = n.module;
  ctx.region = n.region;
  cur_op_ = n.kind;
  if (offload != nullptr) {  // save_on_cpu's or OffloadActivations' unpack hook
    if (streams != nullptr)
      streams->unpack(id);
    else
      offload->unpack(id);
    cur_op_ = n.kind;
  }
  if (n.kind == OpKind::accumulate_grad) {
    run_accumulate_grad(n);
    return;
  }
  Grad in[2];
  for (int s = 0; s < 2; ++s) {
    in[s].storage = n.grad[s];
    in[s].is_view = n.grad_is_view[s];
  }
  if (param_hooks && hooks != nullptr) {
    // A node that reads a frozen parameter and was told so (Node::param on a node that is
    // not an AccumulateGrad: torchtune's frozen output, graph/models/decoder_impl.cpp): the
    // module's pre-backward hook on its output runs here as well.
    if (n.param >= 0 && params_[n.param].frozen) hooks->param_used(*this, n.param, true);
    for (int i = 0; i < n.n_next; ++i) {  // a parameter's gradient is computed here
      const int32_t t = n.next[i].node;
      if (t >= 0 && nodes_[t].kind == OpKind::accumulate_grad && nodes_[t].param >= 0)
        hooks->param_used(*this, nodes_[t].param, true);
    }
    ctx.layer = n.layer;  // the hook's own allocations may have moved it
    ctx.module = n.module;
    cur_op_ = n.kind;
  }
  Grad out[3];
  if (numeric != nullptr) numeric->backward_begin(*this, id, n, saved_.data() + n.saved_first);
  run_backward(*this, n, in, out);
  if (numeric != nullptr) numeric->backward_end(out);
  // torchao's tensorwise Float8Linear runs its backward GEMMs in fp8 as well.
  if (n.flops > 0 || n.gemm_bytes > 0)
    add_flops_backward(n.flops, n.gemm_bytes,
                       n.kind == OpKind::float8_linear ? MathDtype::fp8 : gemm_dtype);
  cur_op_ = n.kind;
  // Post hooks run while the engine still holds the node's inputs (call_function).
  if (streams != nullptr) streams->post_hook(id);
  // The node's inputs (incoming grads) die when it returns, then its saved variables
  // are released (retain_graph=False).
  for (int s = 0; s < 2; ++s) {
    if (n.grad[s] != kNoStorage) {
      uint32_t g = n.grad[s];
      n.grad[s] = kNoStorage;
      release(g);
    }
  }
  for (uint32_t i = 0; i < n.saved_count; ++i)
    if (saved_[n.saved_first + i] != kNoStorage) release(saved_[n.saved_first + i]);
  n.saved_count = 0;
  if (checkpoint != nullptr) checkpoint->released(id);
  if (compile != nullptr) compile->released(id);
  if (offload != nullptr) offload->released(id);
  // Outputs go to the next nodes' input buffers, in input order.
  const Edge* next = n.next;  // only a checkpoint re-run (before n is bound) adds nodes
  const int n_next = n.n_next;
  for (int i = 0; i < n_next; ++i) {
    if (out[i].storage == kNoStorage) continue;
    deliver(next[i], out[i], ready);
  }
}

void Runtime::deliver(const Edge& e, Grad g, std::vector<int32_t>& ready) {
  if (e.node < 0) {  // that input does not require grad
    release(g.storage);
    return;
  }
  Node& t = nodes_[e.node];
  if (t.kind == OpKind::accumulate_grad) {
    // AccumulateGrad has the highest priority: it runs before anything else is popped,
    // once every use of the parameter in this graph has delivered (deps edges). A
    // parameter used more than once (torchtune's chunked head: one mm per chunk) has its
    // grads meet in the node's InputBuffer first, accumulated as any other buffer:
    // InputBuffer::accumulate adds in place only into a dense grad that it holds alone;
    // a Linear's weight grad is TBackward0's view of the mm result (the base shares its
    // storage), so the first two grads are added out of place (a third weight-sized
    // tensor), the rest in place into that sum (H200 trace, torch 2.11,
    // tests/data/gpu/stacks stacks_loss_chunked8; input_buffer.cpp can_accumulate_inplace).
    // Slot 0 of grad_is_view holds `transposed` (AccumulateGrad's layout rule), slot 1
    // `is_view` (the buffer's in-place rule); slot 1 is otherwise unused by this node.
    // A parameter used more than once: each use's grad is named after it for the reports
    // (a single use's grad is the .grad AccumulateGrad names at once).
    // (A role byte spelled at report time: no string is built in backward.)
    if (t.param >= 0 && (t.deps > 1 || t.grad[0] != kNoStorage))
      name_as(g.storage, t.param, ParamLabel::grad_use);
    if (t.deps > 0) --t.deps;
    if (t.grad[0] == kNoStorage) {
      t.grad[0] = g.storage;
      t.grad_is_view[0] = g.transposed;
      t.grad_is_view[1] = g.is_view || g.transposed;
    } else if (!t.grad_is_view[1] && refs_[t.grad[0]] == 1) {
      const OpKind saved_op = cur_op_;
      cur_op_ = OpKind::accumulate_grad;  // the add_ into the parameter's buffer
      if (numeric != nullptr) numeric->accumulate(t.grad[0], g.storage);
      release(g.storage);
      cur_op_ = saved_op;
    } else {
      const OpKind saved_op = cur_op_;
      uint32_t sum = alloc_raw(program_.tensors[t.grad[0]].bytes, TensorKind::gradient, OpKind::add);
      if (numeric != nullptr) numeric->add_into(sum, t.grad[0], g.storage);
      release(t.grad[0]);
      release(g.storage);
      cur_op_ = saved_op;
      t.grad[0] = sum;
      t.grad_is_view[0] = false;
      t.grad_is_view[1] = false;
    }
    if (t.deps == 0) {
      t.grad_is_view[1] = false;
      run_accumulate_grad(t);
    }
    return;
  }
  uint32_t& buf = t.grad[e.slot];
  if (buf == kNoStorage) {
    buf = g.storage;
    t.grad_is_view[e.slot] = g.is_view;
  } else if (!t.grad_is_view[e.slot] && refs_[buf] == 1) {
    // InputBuffer::accumulate: the buffered grad is dense and solely owned: add_ in place.
    if (numeric != nullptr) numeric->accumulate(buf, g.storage);
    release(g.storage);
  } else {
    // Otherwise old + new is a new tensor (both operands are dropped) of the grads' shape.
    // A buffered view may be smaller than the storage it views (Megatron's global buffer:
    // graph/ops/ops_megatron_moe.h seq_gather); a dense incoming grad is its own size.
    const uint32_t sized = t.grad_is_view[e.slot] && !g.is_view ? g.storage : buf;
    uint32_t sum = alloc_raw(program_.tensors[sized].bytes, TensorKind::temporary, OpKind::add);
    if (numeric != nullptr) numeric->add_into(sum, buf, g.storage);
    release(buf);
    release(g.storage);
    buf = sum;
    t.grad_is_view[e.slot] = false;
  }
  if (--t.deps == 0) {
    ready.push_back(e.node);
    std::push_heap(ready.begin(), ready.end(),
                   [this](int32_t a, int32_t b) { return nodes_[a].seq < nodes_[b].seq; });
  }
}

void Runtime::run_accumulate_grad(Node& n) {
  const uint32_t g = n.grad[0];
  const bool transposed = n.grad_is_view[0];
  n.grad[0] = kNoStorage;
  const OpKind saved_op = cur_op_;
  cur_op_ = OpKind::accumulate_grad;
  if (n.param <= -2) {  // an alloc_leaf tensor: the same rules, into its own .grad
    uint32_t& leaf_grad = leaf_grads_[static_cast<size_t>(-2 - n.param)];
    if (leaf_grad == kNoStorage && !transposed && refs_[g] == 1) {
      leaf_grad = g;
    } else if (leaf_grad == kNoStorage) {
      leaf_grad = alloc_raw(n.size[0], TensorKind::temporary, OpKind::accumulate_grad);
      release(g);
    } else {
      release(g);
    }
    cur_op_ = saved_op;
    return;
  }
  Parameter& p = params_[n.param];
  if (p.grad == kNoStorage) {
    if (!transposed && refs_[g] == 1) {
      p.grad = g;  // stolen: no copy
    } else {
      // The grad's strides do not obey the parameter's layout: clone into .grad.
      p.grad = alloc_raw(p.bytes, TensorKind::gradient, OpKind::accumulate_grad);
      if (numeric != nullptr) numeric->copy(p.grad, g);
      release(g);
    }
    name_as(p.grad, n.param, NameRole::grad);
  } else {
    if (numeric != nullptr) numeric->accumulate(p.grad, g);
    release(g);  // .grad += grad, in place
  }
  if (hooks != nullptr) hooks->grad_ready(*this, n.param);
  cur_op_ = saved_op;
}

}  // namespace memsim::graph
