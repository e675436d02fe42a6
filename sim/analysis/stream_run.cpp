#include "sim/analysis/stream_run.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "program/tensor_names.h"
#include "sim/analysis/live_set.h"
#include "sim/analysis/online_peaks.h"
#include "sim/step/executor.h"

namespace memsim {
namespace {

// What event_point() reads about one moment, kept for the moments a report may name
// (small: the top-peak stack copies one per event).
struct PointInfo {
  uint64_t allocated = 0;
  uint64_t reserved = 0;
  uint64_t requested = 0;
  uint32_t name = 0;  // string index: the op, or a mark's name
  int32_t layer = -1;
  Phase phase = Phase::other;
};

// A live tensor's allocation (what the live set reports; the bytes are the tensor
// table's, which the builders keep equal to the event's), by tensor id. Ids are recycled
// in a streamed Program (program/program.h), so only live tensors have one: `alloc` is
// kNever for an id whose tensor is dead (or zero-byte).
struct Lifetime {
  static constexpr uint32_t kNever = std::numeric_limits<uint32_t>::max();
  uint32_t op = 0;
  int32_t layer = -1;
  uint32_t alloc = kNever;  // event index of its (non-empty) alloc
  uint32_t serial = 0;      // Program::serial_of: its id in a stored build
  TensorKind kind = TensorKind::other;
  Phase phase = Phase::other;
};

// A tensor that was live at the current peak and has died since: the live set at the
// peak still lists it, and its id may already name another tensor, so its facts are
// copied here when it is freed (TensorInfo included: its name).
struct DeadAtPeak {
  Lifetime life;
  TensorInfo info;
};

// What StreamRun reads from the Program about the events it is handed: an alloc's serial,
// a free's TensorInfo (its id may be recycled once the free is handed on), a mark's name.
// Read from the Program itself while the builder waits (DirectFacts), or from a copy made
// when the chunk was handed on, for a consumer on another thread while the builder goes on
// (CopiedFacts, StreamOptions::pipelined). `k` is the event's position in the chunk.
struct DirectFacts {
  const Program& program;
  const MemoryEvent* events;
  uint32_t serial(size_t k) const { return program.serial_of(events[k].tensor); }
  const TensorInfo& info(size_t k) const { return program.tensors[events[k].tensor]; }
  const std::string& mark(size_t k) const { return program.str(static_cast<uint32_t>(events[k].bytes)); }
};

// A chunk as handed on, with the facts above copied (the builder may grow the Program's
// tables, recycle ids and overwrite their TensorInfo while the consumer reads this).
struct Chunk {
  std::vector<MemoryEvent> events;
  std::vector<uint32_t> serials;    // alloc: Program::serial_of; mark: index into marks
  std::vector<TensorInfo> infos;    // free: the tensor's TensorInfo at its free
  std::vector<std::string> marks;   // the marks' names, in order
  size_t first = 0;
  size_t tensor_capacity = 0;       // the Program's tensor table capacity (a reserve hint)

  // Empties the chunk; its next events are the Program's from `first_event` on.
  void reset(size_t first_event) {
    events.clear();
    serials.clear();
    infos.clear();
    marks.clear();
    first = first_event;
  }
  // Appends events [e, e + n) with their facts (the next ones after those held).
  void append(const Program& program, const MemoryEvent* e, size_t n) {
    const size_t at = events.size();
    events.insert(events.end(), e, e + n);
    serials.resize(at + n);
    infos.resize(at + n);
    tensor_capacity = program.tensors.capacity();
    for (size_t k = 0; k < n; ++k) {
      switch (e[k].type) {
        case EventType::alloc: serials[at + k] = program.serial_of(e[k].tensor); break;
        case EventType::free:
          infos[at + k] = e[k].tensor < program.tensors.size() ? program.tensors[e[k].tensor] : TensorInfo{};
          break;
        case EventType::mark:
          serials[at + k] = static_cast<uint32_t>(marks.size());
          marks.push_back(program.str(static_cast<uint32_t>(e[k].bytes)));
          break;
        case EventType::empty_cache: break;
      }
    }
  }
};

struct CopiedFacts {
  const Chunk& chunk;
  uint32_t serial(size_t k) const { return chunk.serials[k]; }
  const TensorInfo& info(size_t k) const { return chunk.infos[k]; }
  const std::string& mark(size_t k) const { return chunk.marks[chunk.serials[k]]; }
};

class StreamRun final : public EventSink {
 public:
  StreamRun(const AllocatorConfig& config, DeviceMemory& device, const StreamOptions& options)
      : options_(options),
        executor_(config, device, options.reset_peaks_at_mark, nullptr, 0, &block_of_,
                  &rounded_of_),
        peaks_(options.analysis.min_peak_prominence),
        marks_(options.analysis.marks.size()),
        watch_info_(options.name_serials.size()) {
    for (uint32_t k = 0; k < options.name_serials.size(); ++k)
      watch_serial_.emplace(options.name_serials[k], k);
  }

  // The builder reserved its tensor table for the Program it expects: reserve as much
  // (address space only) so that the per-tensor arrays are not copied as they grow. A
  // pipelined run calls this on the builder's thread before the first chunk is handed on
  // (Pipeline::consume), so that the arrays come from that thread's heap (the memsim
  // executable's is in huge pages: tools/cli/host_malloc.h), not the consumer's, whose
  // first touch of each 4 KiB page is on the run's critical path. dead_at_peak_ gets room
  // for as many tensors as a run's live set commonly holds (cs336-xl: 1,587 at the peak).
  void reserve_tensors(size_t tensor_capacity) {
    if (lifetimes_.capacity() >= tensor_capacity) return;
    if (options_.analysis.live_set) {
      lifetimes_.reserve(tensor_capacity);
      dead_at_peak_.reserve(std::min<size_t>(tensor_capacity, 4096));
    }
    block_of_.reserve(tensor_capacity);
    rounded_of_.reserve(tensor_capacity);
  }

  bool consume(const Program& program, const MemoryEvent* events, size_t n,
               size_t first) override {
    handed_ = first + n;
    return process(program, DirectFacts{program, events}, events, n, first,
                   program.tensors.capacity());
  }

  // Executes and observes events [first, first + n), whose facts `f` gives. `program` is
  // read only by the Executor's alloc / free / empty_cache steps, which do not read it
  // (a mark's reset is decided here by name: see step()), and by nothing else, so a
  // pipelined consumer may pass the Program the builder is still writing. Returns false
  // at an out-of-memory with stop_at_oom.
  template <class Facts>
  bool process(const Program& program, const Facts& f, const MemoryEvent* events, size_t n,
               size_t first, size_t tensor_capacity) {
    if (first + n >= Lifetime::kNever)  // beyond the event budget (sim/step/event_budget.h)
      throw std::length_error("streaming run: more than 2^32 events");
    reserve_tensors(tensor_capacity);
    size_t k = 0;
    if (!executor_.oom()) {
      const MemoryStats& stats = executor_.stats();
      for (; k < n; ++k) {
        const MemoryEvent& e = events[k];
        const size_t i = first + k;
        if (!step(program, f, e, i, k)) break;
        if (!options_.verdict_only) observe(f, e, i, k, stats);
      }
      if (k == n) {
        executed_ = first + n;
        return true;
      }
      oom_event_ = events[k];
      oom_serial_ = f.serial(k);
      oom_by_kind_ = executor_.by_kind();
      executed_ = first + k;
      if (options_.stop_at_oom) {
        // A pipelined consumer still sees the chunks handed on before the builder learnt
        // of the stop: only the ids they recycle matter (below), not their marks.
        scan_marks_ = false;
        if (!std::is_same_v<Facts, CopiedFacts>) return false;
      }
      ++k;
    }
    // After the out-of-memory nothing executes; only the measured step's first mark is
    // still looked for (the summary labels events by it, as over a stored Program). The
    // Program keeps recycling ids (program/program.h): a tensor the report still names (live
    // at the peak, or the failing one) has its TensorInfo copied when its free goes by.
    for (; k < n; ++k) {
      const MemoryEvent& e = events[k];
      if (e.type == EventType::mark && !measured_mark_ && scan_marks_ &&
          f.mark(k) == options_.analysis.measured_from_mark)
        measured_mark_ = first + k;
      if (e.type != EventType::free) continue;
      if (e.tensor == oom_event_.tensor && !oom_info_) oom_info_ = f.info(k);
      if (e.tensor < lifetimes_.size() && lifetimes_[e.tensor].alloc != Lifetime::kNever) {
        Lifetime& l = lifetimes_[e.tensor];
        if (have_peak_ && l.alloc <= peak_index_) dead_at_peak_.push_back(DeadAtPeak{l, f.info(k)});
        l.alloc = Lifetime::kNever;
      }
    }
    return !options_.stop_at_oom || !executor_.oom();
  }

  // Records a pipelined hand-over's count (the sink's consume() does it otherwise).
  void handed(size_t count) { handed_ = count; }

  StreamResult result(const Program& program, bool complete);

 private:
  // The Executor's step. A mark read from a copy is stepped here: the Executor would read
  // its name from the Program, and a mark resets the peak statistics exactly when it is
  // named StreamOptions::reset_peaks_at_mark (Executor's contract, sim/step/executor.h).
  bool step(const Program& program, const DirectFacts&, const MemoryEvent& e, size_t i, size_t) {
    return executor_.step(program, e, i);
  }
  bool step(const Program& program, const CopiedFacts& f, const MemoryEvent& e, size_t i, size_t k) {
    if (e.type != EventType::mark) return executor_.step(program, e, i);
    if (options_.reset_peaks_at_mark != nullptr && f.mark(k) == options_.reset_peaks_at_mark)
      executor_.allocator().reset_peak_stats();
    return true;
  }
  template <class Facts>
  void observe(const Facts& f, const MemoryEvent& e, size_t i, size_t k, const MemoryStats& stats);
  void start_measured(size_t i);
  template <class Facts>
  void watch(const Facts& f, const MemoryEvent& e, size_t k);
  EventPoint point(const Program& program, size_t index, const PointInfo& p) const;
  std::vector<LiveAlloc> live_at(const Program& program, size_t index) const;

  const StreamOptions& options_;
  std::vector<BlockId> block_of_;     // the Executor's per-tensor arrays, reserved here
  std::vector<uint64_t> rounded_of_;
  Executor executor_;
  size_t executed_ = 0;
  size_t handed_ = 0;  // events handed on so far
  bool scan_marks_ = true;  // false once stopped at the out-of-memory
  std::vector<Lifetime> lifetimes_;  // by tensor id: the live tensors
  // Tensors live at the peak (peak_index_) and freed since; cleared when the peak moves
  // (a tensor freed before the new peak is not live there). With lifetimes_ this is the
  // live set at the peak, and both are bounded by the live tensors, not the run's.
  std::vector<DeadAtPeak> dead_at_peak_;
  // The measured part (reset at its first mark).
  bool measured_seen_ = false;
  std::optional<size_t> measured_mark_;  // the first such mark emitted, executed or not
  size_t measured_begin_ = 0;
  bool have_peak_ = false;
  size_t peak_index_ = 0;
  PointInfo peak_;
  std::array<uint64_t, kTensorKindCount> peak_by_kind_{};
  uint64_t peak_reserved_ = 0;
  uint64_t peak_requested_ = 0;
  OnlinePeaks<PointInfo> peaks_;
  std::vector<std::optional<MarkPoint>> marks_;  // by AnalysisOptions::marks position
  // The out-of-memory, if any.
  MemoryEvent oom_event_;
  std::optional<TensorInfo> oom_info_;
  uint32_t oom_serial_ = 0;
  uint64_t reserved_high_ = 0;  // StreamResult::reserved_high
  // StreamOptions::name_serials: serial -> position; the watched tensors live now (id ->
  // position); what each had at its free (or, at the end, now).
  std::unordered_map<uint32_t, uint32_t> watch_serial_;
  std::unordered_map<uint32_t, uint32_t> watch_live_;
  std::vector<std::optional<TensorInfo>> watch_info_;
  std::array<uint64_t, kTensorKindCount> oom_by_kind_{};
};

template <class Facts>
void StreamRun::watch(const Facts& f, const MemoryEvent& e, size_t k) {
  if (e.type == EventType::alloc) {
    const auto it = watch_serial_.find(f.serial(k));
    if (it != watch_serial_.end()) watch_live_[e.tensor] = it->second;
  } else if (e.type == EventType::free) {
    const auto it = watch_live_.find(e.tensor);
    if (it == watch_live_.end()) return;
    watch_info_[it->second] = f.info(k);  // its id may be reused now
    watch_live_.erase(it);
  }
}

void StreamRun::start_measured(size_t i) {
  measured_begin_ = i;
  have_peak_ = false;
  peak_reserved_ = 0;
  peak_requested_ = 0;
  peaks_.reset();
  dead_at_peak_.clear();
  for (auto& m : marks_) m.reset();
}

template <class Facts>
void StreamRun::observe(const Facts& f, const MemoryEvent& e, size_t i, size_t k,
                        const MemoryStats& stats) {
  const uint64_t allocated = static_cast<uint64_t>(stats.allocated_bytes.all.current);
  const uint64_t reserved = static_cast<uint64_t>(stats.reserved_bytes.all.current);
  const uint64_t requested = static_cast<uint64_t>(stats.requested_bytes.all.current);
  reserved_high_ = std::max(reserved_high_, reserved);
  if (!watch_serial_.empty()) watch(f, e, k);
  switch (e.type) {
    case EventType::alloc:
      if (e.bytes > 0 && options_.analysis.live_set) {
        // Grown 1024 ids past the one asked for (the vector's capacity grows
        // geometrically): one resize per 1024 tensors, and at most 20 KiB past the last
        // tensor touched. live_at() skips the entries never allocated.
        if (e.tensor >= lifetimes_.size()) lifetimes_.resize(size_t{e.tensor} + 1024);
        lifetimes_[e.tensor] = Lifetime{e.op, e.layer, static_cast<uint32_t>(i), f.serial(k),
                                        e.kind, e.phase};
      }
      break;
    case EventType::free:
      if (e.tensor < lifetimes_.size() && lifetimes_[e.tensor].alloc != Lifetime::kNever) {
        Lifetime& l = lifetimes_[e.tensor];
        // Live at the peak (allocated at or before it; freed now, after it): keep a copy.
        if (have_peak_ && l.alloc <= peak_index_)
          dead_at_peak_.push_back(DeadAtPeak{l, f.info(k)});
        l.alloc = Lifetime::kNever;  // the id may be reused
      }
      break;
    case EventType::mark: {
      const std::string& name = f.mark(k);
      if (!measured_seen_ && name == options_.analysis.measured_from_mark) {
        measured_seen_ = true;
        measured_mark_ = i;
        start_measured(i);
      }
      for (size_t m = 0; m < marks_.size(); ++m)
        if (name == options_.analysis.marks[m]) marks_[m] = MarkPoint{name, i, allocated, reserved};
      break;
    }
    case EventType::empty_cache:
      break;
  }
  PointInfo here{allocated, reserved, requested,
                 e.type == EventType::mark ? static_cast<uint32_t>(e.bytes) : e.op, e.layer,
                 e.phase};
  if (!have_peak_ || allocated > peak_.allocated) {
    have_peak_ = true;
    peak_index_ = i;
    peak_ = here;
    peak_by_kind_ = executor_.by_kind();
    dead_at_peak_.clear();  // freed before this event: not live at the new peak
  }
  peak_reserved_ = std::max(peak_reserved_, reserved);
  peak_requested_ = std::max(peak_requested_, requested);
  peaks_.push(i, allocated, here);
}

EventPoint StreamRun::point(const Program& program, size_t index, const PointInfo& p) const {
  EventPoint out;
  out.index = index;
  out.op = program.str(p.name);
  out.phase = p.phase;
  out.layer = p.layer;
  out.allocated = p.allocated;
  out.reserved = p.reserved;
  out.requested = p.requested;
  return out;
}

std::vector<LiveAlloc> StreamRun::live_at(const Program& program, size_t index) const {
  // Called for the peak only (index == peak_index_): the tensors still live that were
  // allocated by then, and those freed since (dead_at_peak_).
  std::vector<LiveAlloc> live;
  auto add = [&](const Lifetime& l, const TensorInfo& info) {
    MemoryEvent a;
    a.type = EventType::alloc;
    a.kind = l.kind;
    a.phase = l.phase;
    a.layer = l.layer;
    a.tensor = l.serial;
    a.op = l.op;
    a.bytes = info.bytes;
    live.push_back(LiveAlloc{l.serial, l.alloc, a, info});
  };
  for (uint32_t t = 0; t < lifetimes_.size(); ++t) {
    const Lifetime& l = lifetimes_[t];
    if (l.alloc == Lifetime::kNever || l.alloc > index) continue;
    add(l, program.tensors[t]);
  }
  for (const DeadAtPeak& d : dead_at_peak_) add(d.life, d.info);
  return live;
}

StreamResult StreamRun::result(const Program& program, bool complete) {
  const AnalysisOptions& o = options_.analysis;
  StreamResult r;
  r.complete = complete;
  r.final_stats = executor_.stats();
  r.measured_mark = measured_mark_;
  r.oom_serial = oom_serial_;
  r.reserved_high = reserved_high_;
  for (const auto& [id, k] : watch_live_) watch_info_[k] = program.tensors[id];
  r.final_infos = watch_info_;
  if (executor_.oom()) r.oom_alloc = oom_event_;
  Analysis& a = r.analysis;
  // A stopped build: the events handed on (what the builder emitted after that, while
  // unwinding, is not part of the Program).
  a.events = complete ? program.event_count() : handed_;
  const size_t end = executed_;
  a.events_executed = end;
  a.flops = program.flops;
  a.measured_begin = measured_begin_;
  if (measured_begin_ < end && have_peak_) {
    a.peak_allocated = peak_.allocated;
    a.peak_reserved = peak_reserved_;
    a.peak_requested = peak_requested_;
    a.peak = point(program, peak_index_, peak_);
    if (o.live_set) {
      std::vector<LiveAlloc> live = live_at(program, peak_index_);
      a.live_at_peak = summarize_live_set(program, peak_index_, live, o.top_tensors);
      if (options_.keep_live_allocs) r.live_allocs = std::move(live);
    }
    a.breakdown_at_peak = to_breakdown(peak_by_kind_);
    for (const auto& p : peaks_.top(o.top_peaks))
      a.top_peaks.push_back(point(program, p.peak.index, p.extra));
  }
  if (o.use_final_stats) {
    auto peak_of = [](const Stat& s) { return s.peak > 0 ? static_cast<uint64_t>(s.peak) : 0; };
    a.peak_allocated = std::max(a.peak_allocated, peak_of(r.final_stats.allocated_bytes.all));
    a.peak_reserved = std::max(a.peak_reserved, peak_of(r.final_stats.reserved_bytes.all));
    a.peak_requested = std::max(a.peak_requested, peak_of(r.final_stats.requested_bytes.all));
  }
  for (size_t m = 0; m < marks_.size(); ++m) a.marks.emplace_back(o.marks[m], marks_[m]);
  if (executor_.oom()) {
    const OomPoint& p = *executor_.oom();
    OomReport rep;
    rep.index = p.event_index;
    const MemoryEvent& e = oom_event_;
    rep.op = program.str(e.op);
    rep.phase = e.phase;
    rep.layer = e.layer;
    rep.kind = e.kind;
    if (oom_info_) rep.tensor = tensor_name(program, *oom_info_, e);
    else if (e.tensor < program.tensors.size()) rep.tensor = tensor_name(program, e.tensor, e);
    rep.requested_bytes = p.details.requested_bytes;
    rep.allocated_bytes = p.details.allocated_bytes;
    rep.reserved_bytes = p.details.reserved_bytes;
    rep.capacity_bytes = p.details.device_total;
    rep.free_bytes = p.details.device_free;
    rep.message = p.details.message;
    if (p.event_index > 0) rep.breakdown = to_breakdown(oom_by_kind_);
    a.oom = std::move(rep);
  }
  return r;
}

// StreamOptions::pipelined: the Program's sink, handing chunks of events (with their facts
// copied) to a thread that runs the StreamRun on them while the builder emits the next
// ones. The Program hands events on in small batches (kBatch: stream_run attaches it so),
// each appended to the chunk being filled at once (its ids may be recycled after that); a
// chunk is published when it holds StreamOptions::chunk events, or as soon as the consumer
// has nothing left to do: the first events of a run (the setup phase, then the first
// batch) reach it without waiting for a whole chunk, and it never idles while events wait
// in an unpublished chunk. Two chunks are in flight at most (one being consumed, one filled
// or waiting), so the builder waits when it is that far ahead. After an out-of-memory with
// stop_at_oom the consumer says so and consume() returns false at the next hand-over (the
// build then stops as a synchronous run's does, up to two chunks later).
class Pipeline final : public EventSink {
 public:
  // What the Program hands on at a time (its SinkAttachment::chunk): small, so that the
  // first events are not held back; the chunks published are still StreamOptions::chunk.
  static constexpr size_t kBatch = 512;

  Pipeline(StreamRun& run, const Program& program, size_t chunk)
      : run_(run), program_(program), chunk_(std::max<size_t>(1, chunk)) {
    // A slot's arrays grow to a chunk and a batch at most (held setup events aside): set
    // aside at once, instead of grown and copied through 512, 1024, ... while the builder
    // fills the first chunks (address space only until written).
    const size_t room = std::min<size_t>(chunk_, size_t{1} << 16) + kBatch;
    for (Chunk& c : slots_) {
      c.events.reserve(room);
      c.serials.reserve(room);
      c.infos.reserve(room);
    }
    worker_ = std::thread([this] { work(); });
  }
  ~Pipeline() {
    close();
    if (worker_.joinable()) worker_.join();
  }

  bool consume(const Program& program, const MemoryEvent* events, size_t n,
               size_t first) override {
    if (failed_.load()) std::rethrow_exception(error_);
    // Before the first chunk: the consumer has read nothing of run_ yet (StreamRun::
    // reserve_tensors says why here).
    if (next_fill_ == 0 && filling_ == nullptr) run_.reserve_tensors(program.tensors.capacity());
    if (filling_ == nullptr) {
      wait_for_slot();
      if (failed_.load()) std::rethrow_exception(error_);
      filling_ = &slots_[(next_fill_++) % kSlots];  // the builder's until published
      filling_->reset(first);
    }
    filling_->append(program, events, n);
    run_.handed(first + n);
    if (filling_->events.size() >= chunk_ || filled_.load(std::memory_order_acquire) == 0)
      publish();
    return !stopped_.load(std::memory_order_relaxed);
  }

  // Waits until every chunk handed on was consumed (the end of the build); rethrows what
  // the consumer threw. The consumer's thread is joined later (~Pipeline): waiting for its
  // exit (its stack released, the joiner woken) is not on the way to the result.
  void drain() {
    if (filling_ != nullptr) publish();
    close();
    wait([&] { return done_.load(std::memory_order_acquire); });
    if (failed_.load()) std::rethrow_exception(error_);
  }

 private:
  static constexpr size_t kSlots = 2;
  // The waiting side sleeps at once. Spinning up to ~0.1 ms first (tried: 4000 `pause`s)
  // made a cold cs336-xl run's median 4.83-7.33 ms against 4.81-5.16 without it on the idle
  // 2-core VM, and slower sweeps where threads outnumber cores (docs/engine.md).
  template <class Ready>
  void wait(const Ready& ready) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, ready);
  }
  void wake() {
    { std::lock_guard<std::mutex> lock(mutex_); }  // a sleeper is either waiting or sees the change
    changed_.notify_all();
  }
  // The builder, two chunks ahead, waits for the consumer to free a slot. It looks again
  // every kPoll (up to kPolls times) instead of being woken: the wake-up (a futex call on
  // the consumer's thread, ~7 us a chunk on the 2-core VM) was on the run's critical path,
  // the consumer's, while the builder has time to spare. Past that it sleeps until woken
  // (builder_asleep_: the consumer then wakes it), so a long wait costs no polling.
  static constexpr std::chrono::microseconds kPoll{30};
  static constexpr int kPolls = 64;
  void wait_for_slot() {
    auto ready = [&] { return filled_.load() < kSlots || failed_.load(); };
    std::unique_lock<std::mutex> lock(mutex_);
    for (int k = 0; k < kPolls && !ready(); ++k) changed_.wait_for(lock, kPoll);
    if (ready()) return;
    builder_asleep_.store(true);  // seq_cst, as filled_'s update and the consumer's load
    changed_.wait(lock, ready);
    builder_asleep_.store(false);
  }
  void publish() {
    filling_ = nullptr;
    filled_.fetch_add(1, std::memory_order_release);
    wake();
  }
  void close() {
    closing_.store(true, std::memory_order_release);
    wake();
  }

  void work() {
    size_t next = 0;  // the oldest filled slot
    for (;;) {
      wait([&] { return filled_.load(std::memory_order_acquire) > 0 || closing_.load(std::memory_order_acquire); });
      if (filled_.load(std::memory_order_acquire) == 0) {  // closing, all consumed
        done_.store(true, std::memory_order_release);
        wake();
        return;
      }
      Chunk& c = slots_[next];
      try {
        if (!run_.process(program_, CopiedFacts{c}, c.events.data(), c.events.size(), c.first,
                          c.tensor_capacity))
          stopped_.store(true, std::memory_order_relaxed);
      } catch (...) {
        error_ = std::current_exception();
        failed_.store(true);
        done_.store(true, std::memory_order_release);
        wake();
        return;
      }
      next = (next + 1) % kSlots;
      // Either the builder sees the slot free before it sleeps, or this sees it asleep.
      filled_.fetch_sub(1);
      if (builder_asleep_.load()) wake();
    }
  }

  StreamRun& run_;
  const Program& program_;  // passed through to StreamRun::process, which does not read it
  const size_t chunk_;      // events per published chunk (StreamOptions::chunk)
  Chunk slots_[kSlots];
  size_t next_fill_ = 0;        // the builder's: slots taken so far
  Chunk* filling_ = nullptr;    // the builder's: the slot being filled, not yet published
  std::atomic<size_t> filled_{0};  // slots handed on and not yet consumed
  std::atomic<bool> closing_{false};
  std::atomic<bool> failed_{false};  // error_ is set (before this)
  std::exception_ptr error_;
  std::atomic<bool> stopped_{false};
  std::atomic<bool> done_{false};            // the consumer returned (all consumed, or failed)
  std::atomic<bool> builder_asleep_{false};  // wait_for_slot sleeps until woken
  std::mutex mutex_;  // with changed_: sleeping until the other side moved
  std::condition_variable changed_;
  std::thread worker_;
};

}  // namespace

StreamResult stream_run(Program& program, const std::function<void(Program&)>& build,
                        const AllocatorConfig& config, DeviceMemory& device,
                        const StreamOptions& options) {
  StreamRun sink(config, device, options);
  std::optional<Pipeline> pipeline;
  // One core: a second thread would only take turns with the builder.
  static const bool two_cores = std::thread::hardware_concurrency() >= 2;
  if (options.pipelined && two_cores) pipeline.emplace(sink, program, options.chunk);
  EventSink* target = pipeline ? static_cast<EventSink*>(&*pipeline) : &sink;
  const size_t batch = pipeline ? std::min(options.chunk, Pipeline::kBatch) : options.chunk;
  program.set_sink(SinkAttachment{target, batch, options.stop_at_oom});
  struct Detach {
    Program& p;
    ~Detach() { p.take_sink(); }
  } detach{program};
  bool complete = true;
  try {
    build(program);
    program.finish();
  } catch (const StopEmitting&) {
    complete = false;
  }
  if (pipeline) pipeline->drain();
  return sink.result(program, complete);
}

}  // namespace memsim
