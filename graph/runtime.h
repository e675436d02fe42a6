// graph::Runtime: symbolic eager PyTorch (see the design note in graph/ir.h).
//
// Contract:
//  - Storage ids are Program tensor ids: Runtime::alloc appends an alloc event and the
//    storage starts with one reference, owned by the returned Tensor handle.
//  - A storage's free event is emitted the moment its reference count reaches 0, in the
//    context (phase, layer, op) current at that moment.
//  - Parameters are created once (add_parameter) and never freed; their .grad storages
//    are owned by the Runtime until zero_grad_set_to_none().
//  - The autograd graph recorded since the last backward() is consumed by backward();
//    discard_graph() drops it without running it (forward-only steps whose outputs die).
#pragma once

#include <cstdint>
#include <exception>
#include <string_view>
#include <vector>

#include "graph/ir.h"
#include "program/program.h"

namespace memsim::graph {

class Runtime;
class CheckpointEngine;  // graph/checkpoint.h
class CompileEngine;     // graph/compile.h
class OffloadEngine;     // graph/offload.h
class NumericContext;    // graph/numeric/numeric.h
inline constexpr uint32_t kNoStorage = UINT32_MAX;

// What torch DDP / FSDP hook into: called by the Runtime, may emit events themselves.
class RuntimeHooks {
 public:
  virtual ~RuntimeHooks() = default;
  // An AccumulateGrad node ran for parameter `param` (its .grad was just set or added to).
  virtual void grad_ready(Runtime& rt, int32_t param) = 0;
  // The next allocation is in a different transformer layer or module (ctx.layer,
  // ctx.module) than the last one: module pre-forward / pre-backward hooks key on this.
  virtual void layer_entered(Runtime& rt, int32_t layer) = 0;
  // Only when Runtime::param_hooks is set (FSDP1 units that own one parameter, PEFT's
  // wrap policy: sim/parallel/fsdp.h): parameter `param` is about to be read by a forward
  // op (Runtime::param, before the op allocates), or a backward node is about to compute
  // its gradient (the node has an edge to the parameter's AccumulateGrad; before the node
  // allocates): a module's pre-forward / pre-backward hook.
  virtual void param_used(Runtime& rt, int32_t param, bool backward) {
    (void)rt, (void)param, (void)backward;
  }
  // Runtime::hook_countdown reached 0: called at the start of the allocation that made it
  // so (set it to 2 in param_used: after the op's output, before the next allocation).
  virtual void countdown_done(Runtime& rt) { (void)rt; }
};

// A Python-visible tensor: one reference to a storage plus its autograd identity.
// Copying a Tensor is binding another Python name (retain); destroying or reset()
// drops the name (release). `bytes` is this tensor's size (views may be smaller than
// their storage).
class Tensor {
 public:
  Tensor() = default;
  Tensor(const Tensor& o);
  Tensor(Tensor&& o) noexcept;
  Tensor& operator=(const Tensor& o);
  Tensor& operator=(Tensor&& o) noexcept;
  ~Tensor() { reset(); }
  void reset();
  bool defined() const { return rt_ != nullptr; }
  bool requires_grad() const { return grad_fn >= 0; }

  uint32_t storage = kNoStorage;
  uint64_t bytes = 0;
  int32_t grad_fn = -1;  // autograd node that produced it (AccumulateGrad for a parameter)
  uint8_t out_slot = 0;  // which output of that node

 private:
  friend class Runtime;
  Runtime* rt_ = nullptr;
};

// Where an emitted event belongs (copied into every event and node).
struct OpContext {
  Phase phase = Phase::setup;
  int32_t layer = -1;
  Module module = Module::none;
  uint32_t region = 0;  // checkpoint region id; 0 = none
};

struct Edge {
  int32_t node = -1;  // -1: that input needs no grad
  uint8_t slot = 0;
};

// An autograd node. `size` holds op-specific byte counts documented in graph/ops/ops.cpp.
struct Node {
  OpKind kind = OpKind::other;
  uint8_t n_next = 0;
  uint8_t flags = 0;
  Module module = Module::none;
  int32_t layer = -1;
  uint32_t seq = 0;
  uint32_t region = 0;
  uint32_t graph = 0;               // graph generation (one per forward with grad)
  Edge next[3];
  uint64_t size[4] = {0, 0, 0, 0};
  double flops = 0;                 // backward FLOPs
  uint32_t saved_first = 0, saved_count = 0;
  uint32_t deps = 0;
  int32_t param = -1;               // accumulate_grad: parameter index (else: one it names, -1 none)
  uint32_t grad[2] = {kNoStorage, kNoStorage};  // input buffer per output slot
  bool grad_is_view[2] = {false, false};
  // Backward GEMM bytes (operands read + results written, program/step_cost.h): set with
  // `flops` by GEMM-class ops. A float fits the struct's tail padding.
  float gemm_bytes = 0;
};

// A grad produced by a backward function, on its way to the next node.
struct Grad {
  uint32_t storage = kNoStorage;
  bool is_view = false;    // a view of another result: InputBuffer won't add into it in place
  bool transposed = false; // layout differs from the parameter's: AccumulateGrad clones it
};

struct Parameter {
  uint32_t storage = kNoStorage;
  uint64_t bytes = 0;
  uint32_t grad = kNoStorage;  // .grad (None when kNoStorage)
  int32_t acc_node = -1;       // AccumulateGrad node in the current graph
  uint32_t graph_epoch = 0;
  bool frozen = false;         // requires_grad=False (LoRA base weights): param() gives a
                               // handle without grad_fn, so it never gets a .grad
  uint8_t elem = 0;            // bytes per element; 0: the model's dtype (LoRA adapters may
                               // differ: lora.adapter_dtype)
  uint64_t rows = 0;           // a matrix's shape[0] (numel / shape[-1]); 0: a vector, or a
                               // family that does not record shapes (Adafactor factors on it)
  // FSDP2's float8 all-gather (sim/parallel/fsdp2.h): the gathered weight is already e4m3 and
  // this is its scale's storage (a 0-d fp32, or the precomputed scale vector it views), which
  // the Float8Linear saves (graph/ops/ops_float8.h); kNoStorage for every other parameter.
  uint32_t float8_scale = kNoStorage;
};

// What a tensor derived from parameter P is, for its name (program/program.h's NameRole).
using ParamLabel = NameRole;

// Storage a Runtime may borrow for its lifetime (and hands back when destroyed), so that
// consecutive builds reuse capacity instead of faulting in fresh memory. What it holds
// between Runtimes is meaningless.
struct RuntimeBuffers {
  std::vector<int32_t> refs;
  std::vector<Node> nodes;
  std::vector<uint32_t> saved;
};

class Runtime {
 public:
  explicit Runtime(Program& program, RuntimeBuffers* buffers = nullptr);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Program& program() { return program_; }
  // Capacity hint: about this many events will be emitted (avoids regrowing the
  // Program's arrays, which dominates build time otherwise).
  void reserve(size_t events);
  OpContext ctx;
  bool grad_enabled = true;
  // Activation checkpointing (graph/checkpoint.h): the installed engine takes over the
  // saves of checkpointed regions (a saved slot then holds kNoStorage until recomputed)
  // and re-runs a region at its first unpack. `recomputing` is set during such a re-run:
  // forward ops inside backward keep their forward names and count recompute FLOPs.
  CheckpointEngine* checkpoint = nullptr;
  bool recomputing = false;
  // torch.compile (graph/compile.h): the installed engine records compiled regions and
  // rewrites their events; nullptr (the default) calls none of its hooks.
  CompileEngine* compile = nullptr;
  // Activation offload (graph/offload.h, save_on_cpu around chosen layers): the installed
  // engine packs the forward saves of those layers to host and unpacks them before their
  // node runs; nullptr (the default) calls none of its hooks.
  OffloadEngine* offload = nullptr;
  // Module and autograd hooks of data-parallel wrappers (sim/parallel/data_parallel.h,
  // sim/parallel/fsdp.h); nullptr: none.
  RuntimeHooks* hooks = nullptr;
  // Numeric mode (graph/numeric/numeric.h): null in normal runs (then no hook does any work).
  NumericContext* numeric = nullptr;
  // Test-only fault injection: the save with this ordinal (0 = the first save of the
  // run) takes no reference, so its storage is freed early (a deliberate schedule bug
  // that numeric mode must catch). -1: off.
  int64_t test_drop_save = -1;

  // --- storages ---------------------------------------------------------------
  // New storage of `bytes`, one reference owned by the returned handle. The event's op
  // is `op` (forward name in forward, backward name in backward).
  Tensor alloc(uint64_t bytes, TensorKind kind, OpKind op);
  // Same, returning a raw storage id with one reference owned by the caller.
  uint32_t alloc_raw(uint64_t bytes, TensorKind kind, OpKind op);
  void retain(uint32_t s) { ++refs_[s]; }
  // A storage whose free event a compiled region removed gets one reference back (owned
  // by the caller, graph/compile.h).
  void revive_storage(uint32_t s) { refs_[s] = 1; }
  void release(uint32_t s);
  int32_t refs(uint32_t s) const { return refs_[s]; }
  // Runs now the module hooks (RuntimeHooks::layer_entered) that the next allocation in
  // `layer` would run, as if it were made in `layer` / the current ctx.module, and emits
  // no event of its own: a compiled block's FSDP2 pre-forward hook runs eagerly, before
  // the compiled graph (graph/compile.cpp compile_region). No-op without hooks.
  void run_layer_hooks(int32_t layer);
  // Calls hooks->param_used (RuntimeHooks); off by default (no cost per op).
  bool param_hooks = false;
  // Allocations until hooks->countdown_done (0: off); counts while hooks are installed.
  uint32_t hook_countdown = 0;
  // Stops emitting: handles destroyed after this (the end of the simulated program,
  // when the builder's C++ objects go away) free nothing.
  void freeze() { frozen_ = true; }
  // A new handle on an existing storage (a view): retains it.
  Tensor view_of(const Tensor& base, uint64_t bytes);
  // A handle that takes over one reference the caller owned on `storage` (no retain): a
  // selective checkpoint's cached op output handed back to the re-run (graph/checkpoint.h).
  Tensor adopt(uint32_t storage, uint64_t bytes);
  // Emits a mark event.
  void mark(std::string_view name) { program_.mark(name, ctx.phase); }

  // --- names (program/tensor_names.h) --------------------------------------------------
  // Names storage s (TensorInfo::name = `id`, a Program string id): what it is.
  void name(uint32_t s, uint32_t id) {
    program_.tensors[s].name = id;
    program_.tensors[s].role = NameRole::none;
  }
  // Names storage s as `role` of parameter i ("grad of P"): a parameter id and a byte,
  // spelled out by program/tensor_names.h at report time.
  void name_as(uint32_t s, int32_t param, ParamLabel role) {
    program_.tensors[s].name = program_.tensors[params_[param].storage].name;
    program_.tensors[s].role = role;
  }
  // Parameter i's name ("model.layers.3.mlp.up_proj.weight").
  const std::string& param_name(int32_t param) const {
    return program_.str(program_.tensors[params_[param].storage].name);
  }

  // --- parameters ----------------------------------------------------------------
  int32_t add_parameter(uint64_t bytes, std::string_view name);
  // A handle on parameter i that requires grad (its grad_fn is AccumulateGrad).
  Tensor param(int32_t i);
  const std::vector<Parameter>& parameters() const { return params_; }
  std::vector<Parameter>& parameters() { return params_; }
  // optimizer.zero_grad(set_to_none=True): frees every .grad.
  void zero_grad_set_to_none();

  // --- leaves that are not parameters ----------------------------------------------
  // torch.empty(..., requires_grad=True): a new storage (as alloc) that is a leaf of the
  // graph recorded from now on, as Megatron's received pipeline activations are. Its
  // grad accumulates into a .grad of its own (no parameter, no hooks); *leaf names it.
  Tensor alloc_leaf(uint64_t bytes, TensorKind kind, OpKind op, int32_t* leaf);
  // That leaf's .grad after backward (kNoStorage if none reached it): the caller owns
  // the reference from now on.
  uint32_t take_leaf_grad(int32_t leaf);
  // t.requires_grad_(True) on a tensor that has no grad_fn (PEFT's
  // enable_input_require_grads hook on the frozen embedding's output): t becomes a leaf
  // of the graph being recorded. Its AccumulateGrad node holds the tensor (torch's
  // AccumulateGrad keeps `variable`), so t and the .grad that backward gives it stay
  // alive until that graph dies (discard_graph), the .grad first (TensorImpl's
  // release_resources drops the autograd meta before the storage).
  void requires_grad_(Tensor& t);

  // --- autograd recording (called by ops) ---------------------------------------
  // Creates a node whose inputs are `inputs` (grad edges taken from their grad_fn).
  int32_t make_node(OpKind kind, std::initializer_list<const Tensor*> inputs);
  Node& node(int32_t id) { return nodes_[id]; }
  // SavedVariable: keeps `t`'s storage alive until node `id` has run.
  void save(int32_t id, const Tensor& t);
  void save_storage(int32_t id, uint32_t storage);
  // Drops node n's saved variables now (a composite node whose inner nodes would have
  // released them part-way through its backward). The engine's release is then a no-op.
  void release_saved(Node& n);
  // Drops node n's k-th saved variable now (the inner node that used it has run); the
  // engine's release later skips the emptied slot.
  void release_saved_slot(Node& n, uint32_t k);
  // An empty saved slot of node `id` (no reference; saves are contiguous, so right after
  // its other saves) that fill_saved fills later: Megatron's CheckpointWithoutOutput keeps
  // its recomputed output in ctx.outputs (graph/ops/ops_megatron_arch.h).
  void save_placeholder(int32_t id) {
    saved_.push_back(kNoStorage);
    ++nodes_[id].saved_count;
  }
  // Fills node `id`'s k-th saved slot (a checkpoint placeholder) with `storage`, retained.
  void fill_saved(int32_t id, uint32_t k, uint32_t storage);
  // Same, taking over one reference the caller owns (an offloaded slot's device copy).
  void adopt_saved(int32_t id, uint32_t k, uint32_t storage) {
    saved_[nodes_[id].saved_first + k] = storage;
  }
  // Node n's k-th saved storage (kNoStorage once released): a backward that hands a
  // saved buffer back as its grad (graph/ops/ops_liger.h) retains it from here.
  uint32_t saved_storage(const Node& n, uint32_t k) const {
    return k < n.saved_count ? saved_[n.saved_first + k] : kNoStorage;
  }

  // --- graphs -------------------------------------------------------------------
  // Starts a new graph generation: nodes recorded from now on belong to it. Several
  // generations may be alive at once (a script that keeps an old output's graph).
  uint32_t begin_graph() {
    graph_start_.push_back(static_cast<uint32_t>(nodes_.size()));
    return ++graph_epoch_;
  }
  uint32_t current_graph() const { return graph_epoch_; }
  // The output holding graph `g` died without backward: its saved tensors are released.
  void discard_graph(uint32_t g);

  // --- backward -------------------------------------------------------------------
  // loss.backward(): root grad = ones_like(loss) (a 0-d tensor), then the engine. The
  // nodes reached are consumed (retain_graph=False).
  void backward(const Tensor& loss);
  // Megatron's custom_backward: the C++ engine run from output slot `out_slot` of node
  // `grad_fn` with grad_tensors = `grad` (a storage the caller keeps its own reference
  // to): the output's data may be gone already (deallocate_pipeline_outputs).
  void backward(int32_t grad_fn, uint8_t out_slot, uint32_t grad);

  // --- cuBLAS workspaces ----------------------------------------------------------
  // Bytes of one cuBLAS workspace (0 = none). The first GEMM on the forward thread and
  // the first on the autograd thread each allocate one, kept for the process lifetime
  // (cs336-model.md §1, aten-saved-tensors.md §E).
  uint64_t cublas_workspace = 0;
  void note_gemm();
  // A cuBLASLt GEMM (addmm with a bias: the epilogue fuses it): the thread's cuBLAS
  // workspace, then cuBLASLt's own 1 MiB one (CUBLASLT_WORKSPACE_SIZE's default), also
  // kept for the process lifetime (H100 trace, torch 2.11: GPT-2's first Conv1D addmm).
  // None when cublas_workspace is 0.
  void note_gemm_lt();
  static constexpr uint64_t kCublasLtWorkspace = 1 << 20;
  // Allocate CUDA kernels' scratch (DeviceConfig::kernel_scratch).
  bool kernel_scratch = true;

  // Helpers for backward functions.
  uint32_t grad_alloc(uint64_t bytes, OpKind op, TensorKind kind = TensorKind::temporary) {
    return alloc_raw(bytes, kind, op);
  }
  // A GEMM-class kernel (matmul, attention) of `f` FLOPs that reads and writes `bytes`:
  // counted in Program::flops and, as one GEMM in `dtype`, in the time model's cost
  // (program/step_cost.h).
  void add_flops_forward(double f, double bytes) { add_flops_forward(f, bytes, gemm_dtype); }
  void add_flops_forward(double f, double bytes, MathDtype dtype) {
    (recomputing ? program_.flops.recompute : program_.flops.forward) += f;
    program_.cost.add_gemm(recomputing ? CostPart::recompute : CostPart::forward, dtype, f, bytes);
  }
  void add_flops_backward(double f, double bytes, MathDtype dtype) {
    program_.flops.backward += f;
    program_.cost.add_gemm(CostPart::backward, dtype, f, bytes);
  }
  // The dtype GEMMs multiply in (the time model's peak row): the autocast dtype when
  // autocast is on, else the parameters'; fp32 stays fp32 (torch's default
  // allow_tf32=False for matmuls). Set by the schedule; float8 linears pass fp8 themselves.
  MathDtype gemm_dtype = MathDtype::fp32;

 private:
  friend class Tensor;
  // The engine from `root_grad` in node grad_fn's slot out_slot (both backward()s).
  void run_engine(int32_t grad_fn, uint8_t out_slot, uint32_t root_grad);
  void run_node(int32_t id, std::vector<int32_t>& ready);
  void deliver(const Edge& e, Grad g, std::vector<int32_t>& ready);
  void run_accumulate_grad(Node& n);
  void note_module_path(std::string_view param_name);  // add_parameter: Program::module_path
  // One reference on new storage `s`. Ids are dense in a stored build (s == refs_.size())
  // and recycled in a streamed one (program/program.h): a reused id is overwritten.
  void set_refs(uint32_t s) {
    if (s >= refs_.size()) refs_.resize(size_t{s} + 1, 0);
    refs_[s] = 1;
  }
  void name_saved(const Node& n, uint32_t storage);    // "saved input of M" (save_storage)
  uint32_t op_id(OpKind k, bool backward) const {
    return backward && !recomputing ? bwd_name_[static_cast<int>(k)]
                                    : fwd_name_[static_cast<int>(k)];
  }

  Program& program_;
  RuntimeBuffers* buffers_ = nullptr;  // borrowed storage, handed back by the destructor
  std::vector<int32_t> refs_;
  std::vector<Node> nodes_;
  std::vector<uint32_t> saved_;
  std::vector<Parameter> params_;
  std::vector<uint32_t> leaf_grads_;  // alloc_leaf's .grad storages, by leaf id
  struct HeldLeaf {  // requires_grad_: a leaf its graph's AccumulateGrad keeps alive
    uint32_t graph = 0, storage = kNoStorage;
    int32_t leaf = -1;
  };
  std::vector<HeldLeaf> held_leaves_;
  uint32_t seq_ = 0;
  int64_t saves_ = 0;
  uint64_t save_bytes_ = 0;  // save(): the saved tensor's own bytes (a view's), for offload
  uint32_t graph_epoch_ = 1;
  // Where graph g's nodes begin: nodes_[graph_start_[g - 2]] for g >= 2 (graph 1 begins
  // at 0). Epochs only grow and nodes take the current epoch, so all of graph g lies at or
  // after its start, and discard_graph scans only that tail (a checkpoint re-run's graph
  // is discarded once per region: scanning every node made that quadratic). A graph begun
  // before nodes_ was last cleared (cleared_epoch_) starts at 0.
  std::vector<uint32_t> graph_start_;
  uint32_t cleared_epoch_ = 0;
  std::vector<uint32_t> owners_scratch_;  // discard_graph's buffers, kept for capacity
  std::vector<int32_t> stack_scratch_;
  // run_engine's visit marks: node id -> the epoch of the last engine walk that reached it.
  std::vector<uint32_t> engine_stamp_;
  uint32_t engine_epoch_ = 0;
  uint32_t workspace_[2] = {kNoStorage, kNoStorage};
  uint32_t lt_workspace_[2] = {kNoStorage, kNoStorage};
  uint32_t live_nodes_ = 0;
  uint32_t fwd_name_[kOpKindCount];
  uint32_t bwd_name_[kOpKindCount];
  bool in_backward_ = false;
  bool frozen_ = false;
  int32_t hooked_layer_ = -1;  // ctx.layer / ctx.module of the last allocation seen by hooks
  Module hooked_module_ = Module::none;
  OpKind cur_op_ = OpKind::other;  // op whose frees are being emitted
};

// The module (or layer) an op belongs to, for one C++ scope: a Python module's forward.
// The constructor sets rt.ctx.module (rt.ctx.layer); the destructor puts the outer value
// back after the scope's later locals have died (their frees belong to the module), or
// restore() does it earlier where the caller's context owns what dies next. A checkpoint
// re-run that stops early unwinds through the emitters by exception (graph/checkpoint.h);
// then nothing is restored here: what dies while unwinding keeps the context of the op
// that stopped, and the engine restores the whole context afterwards.
class ModuleScope {
 public:
  ModuleScope(Runtime& rt, Module m)
      : rt_(rt), outer_(rt.ctx.module), unwinding_(std::uncaught_exceptions()) {
    rt.ctx.module = m;
  }
  ~ModuleScope() {
    if (std::uncaught_exceptions() == unwinding_) restore();
  }
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
  void restore() {
    if (active_) rt_.ctx.module = outer_;
    active_ = false;
  }
 private:
  Runtime& rt_;
  Module outer_;
  int unwinding_;
  bool active_ = true;
};

class LayerScope {
 public:
  LayerScope(Runtime& rt, int32_t layer)
      : rt_(rt), outer_(rt.ctx.layer), unwinding_(std::uncaught_exceptions()) {
    rt.ctx.layer = layer;
  }
  ~LayerScope() {
    if (std::uncaught_exceptions() == unwinding_) restore();
  }
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;
  void restore() {
    if (active_) rt_.ctx.layer = outer_;
    active_ = false;
  }
 private:
  Runtime& rt_;
  int32_t outer_;
  int unwinding_;
  bool active_ = true;
};

}  // namespace memsim::graph
