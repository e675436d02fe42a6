// The Program: memsim's pipeline waist.
//
// A Program is a flat, ordered list of memory events (alloc / free / mark /
// empty_cache). Simulated training steps (sim/step/schedule.h) and real PyTorch traces
// (replay/replay.h) both become Programs, so everything downstream (the allocator
// emulator, the timeline, the analysis and the reports) is one code path that the
// real snapshots test.
//
// Contract:
//  - Without a sink (a stored Program, the default) tensor ids are dense,
//    0..tensors.size()-1: each id is allocated by exactly one `alloc` event and freed by at
//    most one later `free` event (a tensor that is never freed is live at the end of the
//    program, e.g. parameters). Reports that index by id (timelines, HTML, trace,
//    snapshot, TensorNames) read stored Programs only.
//  - With a sink attached (streaming, issue #20) ids are recycled so that per-tensor
//    tables stay the size of the live set, not of the run: once a tensor's `free` event
//    has been handed to the sink, its id goes on a free list and a later alloc may reuse
//    it (its TensorInfo is then overwritten). Only frees that say so (`recycle`: the
//    Runtime's, when a storage's last reference dies) release an id. An id is therefore unique among the tensors
//    alive at any moment, and among all the events still in the unflushed tail (a free
//    still in the tail, editable, never has its id reused), but not over the whole run:
//    a consumer that needs a dead tensor's facts copies them when it sees the free
//    (sim/analysis/stream_run.cpp). Recycling stops once the sink needs no more events
//    (what is built after an out-of-memory is dropped: ids grow densely again), and
//    never happens during setup (setup events are not handed on before the first
//    non-setup event). tensor_serial() counts allocs: the id a stored build would give.
//  - `op`, `mark` and `tensor name` fields index into the string tables below, so an
//    event is a small POD and the hot loop that executes a Program touches no strings.
//  - A `mark` event carries no memory; it names a moment (e.g. "forward_end") that the
//    analysis reports allocated/reserved at.
//  - Streaming (program/event_sink.h): with a sink attached, `events` holds only the
//    events not yet handed to the sink, starting at absolute index flushed(); code that
//    remembers a position in the Program uses event_count(), the absolute count. Without a
//    sink (the default) flushed() is 0 and `events` is the whole Program.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "program/event_sink.h"
#include "program/rank_info.h"
#include "program/step_cost.h"

namespace memsim {

// What a tensor is, for the breakdowns users read ("what is live at the peak").
enum class TensorKind : uint8_t {
  parameter,
  gradient,
  optimizer_state,
  activation,  // saved for backward, or produced in forward
  temporary,   // workspace / intermediate freed within its op or its backward
  input,       // the batch
  loss,
  other,       // cuBLAS workspaces, RoPE buffers, replayed trace blocks of unknown kind
};
inline constexpr int kTensorKindCount = 8;
const char* to_string(TensorKind kind);

// Where in the step an event happens.
enum class Phase : uint8_t { setup, forward, loss, backward, optimizer, other };
inline constexpr int kPhaseCount = 6;
const char* to_string(Phase phase);

enum class EventType : uint8_t { alloc, free, mark, empty_cache };

struct MemoryEvent {
  EventType type = EventType::alloc;
  TensorKind kind = TensorKind::other;  // alloc/free: the tensor's kind
  Phase phase = Phase::other;
  uint8_t stream = 0;                   // allocator stream index (0 = default stream)
  int32_t layer = -1;                   // transformer layer, -1 when not in a layer
  uint32_t tensor = 0;                  // alloc/free: tensor id
  uint32_t op = 0;                      // index into Program::strings (op name)
  uint64_t bytes = 0;                   // alloc: requested bytes; mark: index into strings
};

// What a tensor derived from a parameter is (TensorInfo::role): its `name` then holds
// that parameter's name and program/tensor_names.h spells the whole ("grad of P",
// "saved input of M" for P's module M). Storing the parameter's id and a byte instead
// of interning "grad of P" keeps the names' cost out of every Program build.
enum class NameRole : uint8_t {
  none,                    // `name` is the tensor's own name
  grad,                    // "grad of P": the .grad AccumulateGrad stole or cloned
  saved_input,             // "saved input of M": an activation an op on P saved for backward
  saved_input_recomputed,  // the same, made by a checkpoint re-run
  exp_avg,                 // Adam's state ("exp_avg of P")
  exp_avg_sq,
  adam_sqrt,               // _foreach_sqrt(exp_avg_sqs)'s per-parameter temporary
  adam_denom,              // _single_tensor_adam's denom
  momentum,                // SGD's momentum_buffer
  master,                  // "master copy of P" (fp32 master weights)
  master_grad,             // "fp32 grad of P" (the master's .grad)
  autocast_bf16,           // "bf16 autocast copy of P"
  autocast_f16,
  // Issue #19: optimizer tensors that kept role names ("exp_avg", "optimizer state").
  adam_step,               // fused Adam's 0-d device `step` tensor ("step of P (fused Adam)")
  optimizer_temp,          // an optimizer's per-parameter temporary (out-of-place Adam, cs336)
  shard_master,            // Megatron's distributed optimizer: this rank's shard of P's
  shard_master_grad,       //   fp32 main_param, its .grad, exp_avg and exp_avg_sq
  shard_exp_avg,           //   ("exp_avg of P (distributed-optimizer shard)")
  shard_exp_avg_sq,
  grad_use,                // one use's grad of a parameter used more than once, in
                           //   AccumulateGrad's input buffer before the sum
};

// Static facts about a tensor (only what reports need; shapes are in its name).
// `name` says what the tensor is ("model.layers.3.mlp.up_proj.weight"), with `role` what
// it is of that parameter; 0 means none was given and program/tensor_names.h composes
// one from the alloc event and `module` (what the Runtime was in). `module`, `flags` and
// `role` sit in what was padding: the struct stays 16 bytes.
struct TensorInfo {
  uint32_t name = 0;  // index into Program::strings; 0: composed by tensor_names.h
  TensorKind kind = TensorKind::other;
  uint8_t module = 0;  // graph::Module code when the Runtime allocated it (opaque here)
  uint8_t flags = 0;   // kTensorRecomputed: allocated by a checkpoint re-run
  NameRole role = NameRole::none;
  uint64_t bytes = 0;
};
inline constexpr uint8_t kTensorRecomputed = 1;

struct Flops {
  double forward = 0;
  double backward = 0;
  double recompute = 0;
};

// Host (CPU) memory one rank holds for offloaded training state (DeepSpeed ZeRO-Offload /
// ZeRO-Infinity, sim/parallel/deepspeed_zero.h; issue #16 item 2). All zero for every
// other run. Bytes per rank; the node total is ranks_per_node times that.
struct HostMemory {
  uint64_t pinned = 0;    // page-locked buffers (pin_memory): not swappable, counted by the OS
  uint64_t pageable = 0;  // ordinary CPU tensors (CPUAdam's state, unpinned buffers)
  uint64_t nvme = 0;      // bytes kept in NVMe swap files instead (not host memory)
  int ranks_per_node = 1;
  std::string what;       // what is counted, one line per buffer, for the reports
  bool any() const { return pinned + pageable + nvme > 0; }
};

class Program {
 public:
  // Interns a string and returns its index; "" is always index 0.
  uint32_t intern(std::string_view s);
  const std::string& str(uint32_t index) const { return strings_[index]; }

  // Module paths for names (program/tensor_names.h): the path of module code `module`
  // in `layer` (-1: outside the layers), e.g. "model.layers.3.mlp"; 0 when unknown.
  // Set by the Runtime while parameters are created, from their names.
  void set_module_path(int32_t layer, uint8_t module, uint32_t path);
  uint32_t module_path(int32_t layer, uint8_t module) const;
  // The short label of module code `module` ("mlp"), set by the Runtime: the fallback
  // when no parameter named the path.
  uint32_t module_label[16] = {};

  // Appends an alloc and returns the new tensor's id.
  uint32_t alloc(uint64_t bytes, TensorKind kind, Phase phase, uint32_t op, int32_t layer,
                 uint32_t name, uint8_t stream = 0);
  // recycle: nothing in the builder refers to the id any more (the Runtime's reference
  // count reached zero), so with a sink it may be reused once this free is handed on.
  // Frees that leave the id referenced (FSDP and ZeRO-3 free a parameter's storage at
  // wrap time while the Runtime's parameter entry keeps it) pass false.
  void free(uint32_t tensor, Phase phase, uint32_t op, int32_t layer, bool recycle = false);
  void mark(std::string_view name, Phase phase);
  void empty_cache(Phase phase);
  // Back to a newly constructed Program (same string indices on the next build), keeping
  // the arrays' capacity: repeated builds then reuse memory already mapped.
  void clear();
  // Capacity hint for `events` (the whole Program, or the streaming tail with a sink).
  void reserve(size_t events_hint);

  // --- streaming (issue #20; program/event_sink.h) ---------------------------------
  // Attaches `a.sink` (not owned): from now on events are handed to it in chunks of
  // about `a.chunk` events. a.abort_when_done: the first alloc after the sink asked to
  // stop throws StopEmitting. Attach before the build (clear() keeps the sink).
  void set_sink(const SinkAttachment& a);
  // Detaches and returns the sink and its settings: a builder that assembles its Program
  // from others (the pipeline's worst stage) builds without it, then puts it back.
  SinkAttachment take_sink();
  EventSink* sink() const { return sink_; }
  // Hands every buffered event to the sink now (the end of the build). No-op without one.
  void finish();
  // Number of allocs so far: the dense id the next alloc would get in a stored build (ids
  // are recycled with a sink: see the contract above).
  uint32_t tensor_serial() const { return serial_; }
  // The serial (stored-build id) of the tensor that now has id `tensor`: the id itself
  // unless ids were recycled.
  uint32_t serial_of(uint32_t tensor) const {
    return tensor < serial_of_.size() ? serial_of_[tensor] : tensor;
  }
  // Absolute number of events emitted so far (flushed() + events.size()).
  size_t event_count() const { return flushed_ + events.size(); }
  // Events already handed on (or dropped after the sink stopped): events[0] is this one.
  size_t flushed() const { return flushed_; }
  // While held (nested), nothing is handed on: the holder may still rewrite the tail
  // (a torch.compile region, graph/compile.h).
  void hold() { ++holds_; }
  void unhold() { --holds_; }

  std::vector<MemoryEvent> events;
  std::vector<TensorInfo> tensors;
  Flops flops;
  RankInfo rank;  // which GPU of the job these events are (default: the only one)
  HostMemory host;  // DeepSpeed offload's CPU memory (zero otherwise)
  // Activation offload (checkpoint.offload, graph/offload.h): the peak bytes of the pinned
  // host copies save_on_cpu holds at once (requested sizes); 0 without offload.
  uint64_t host_offload_bytes = 0;
  // The measured step's work for the time model (program/step_cost.h; issue #18): reset
  // by the mark "measured_step_begin".
  StepCost cost;

 private:
  // Hands the buffer on when it is full and nothing forbids it (see event_sink.h).
  void maybe_flush(Phase phase) {
    if (sink_ != nullptr && events.size() >= chunk_ && holds_ == 0 && phase != Phase::setup)
      flush_now();
  }
  void flush_now();

  EventSink* sink_ = nullptr;
  size_t chunk_ = 4096;
  size_t flushed_ = 0;
  int holds_ = 0;
  bool sink_done_ = false;   // the sink returned false: events are counted, not handed on
  bool abort_when_done_ = false;
  bool aborted_ = false;     // StopEmitting was thrown (only once)
  uint32_t serial_ = 0;  // allocs so far
  // Ids whose free has been handed to the sink: reused by later allocs (LIFO: the most
  // recently freed id, whose per-tensor entries are still in cache).
  std::vector<uint32_t> free_ids_;
  std::vector<uint32_t> serial_of_;  // by id, kept only with a sink (ids recycled)
  std::vector<uint8_t> recyclable_;  // by id: freed with recycle = true, not yet handed on
  std::vector<uint32_t> module_paths_;  // [(layer + 1) * 16 + module]
  std::vector<std::string> strings_{""};
  // intern()'s index: an open-addressing table of indices into strings_ (kNoString:
  // empty), a power of two in size and at most half full. It holds no string of its own,
  // so a lookup builds no std::string (a std::unordered_map<std::string> needs one per
  // call in C++17: a heap allocation for every name longer than 15 characters) and a
  // copied Program's table stays valid. Built on the first intern().
  static constexpr uint32_t kNoString = UINT32_MAX;
  std::vector<uint32_t> string_slots_;
  void index_string(uint32_t index);
};

}  // namespace memsim
