#include "sim/analysis/stream_run.h"

#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
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

  bool consume(const Program& program, const MemoryEvent* events, size_t n,
               size_t first) override {
    if (first + n >= Lifetime::kNever)  // beyond the event budget (sim/step/event_budget.h)
      throw std::length_error("streaming run: more than 2^32 events");
    // The builder reserved its tensor table for the Program it expects: reserve as much
    // (address space only) so that the per-tensor arrays are not copied as they grow.
    if (lifetimes_.capacity() < program.tensors.capacity()) {
      if (options_.analysis.live_set) lifetimes_.reserve(program.tensors.capacity());
      block_of_.reserve(program.tensors.capacity());
      rounded_of_.reserve(program.tensors.capacity());
    }
    handed_ = first + n;
    size_t k = 0;
    if (!executor_.oom()) {
      const MemoryStats& stats = executor_.stats();
      for (; k < n; ++k) {
        const MemoryEvent& e = events[k];
        const size_t i = first + k;
        if (!executor_.step(program, e, i)) break;
        if (!options_.verdict_only) observe(program, e, i, stats);
      }
      if (k == n) {
        executed_ = first + n;
        return true;
      }
      oom_event_ = events[k];
      oom_serial_ = program.serial_of(events[k].tensor);
      oom_by_kind_ = executor_.by_kind();
      executed_ = first + k;
      if (options_.stop_at_oom) return false;
      ++k;
    }
    // After the out-of-memory nothing executes; only the measured step's first mark is
    // still looked for (the summary labels events by it, as over a stored Program). The
    // Program keeps recycling ids (program/program.h): a tensor the report still names (live
    // at the peak, or the failing one) has its TensorInfo copied when its free goes by.
    for (; k < n; ++k) {
      const MemoryEvent& e = events[k];
      if (e.type == EventType::mark && !measured_mark_ &&
          program.str(static_cast<uint32_t>(e.bytes)) == options_.analysis.measured_from_mark)
        measured_mark_ = first + k;
      if (e.type != EventType::free) continue;
      if (e.tensor == oom_event_.tensor && !oom_info_) oom_info_ = program.tensors[e.tensor];
      if (e.tensor < lifetimes_.size() && lifetimes_[e.tensor].alloc != Lifetime::kNever) {
        Lifetime& l = lifetimes_[e.tensor];
        if (have_peak_ && l.alloc <= peak_index_)
          dead_at_peak_.push_back(DeadAtPeak{l, program.tensors[e.tensor]});
        l.alloc = Lifetime::kNever;
      }
    }
    return true;
  }

  StreamResult result(const Program& program, bool complete);

 private:
  void observe(const Program& program, const MemoryEvent& e, size_t i, const MemoryStats& stats);
  void start_measured(size_t i);
  void watch(const Program& program, const MemoryEvent& e);
  EventPoint point(const Program& program, size_t index, const PointInfo& p) const;
  std::vector<LiveAlloc> live_at(const Program& program, size_t index) const;

  const StreamOptions& options_;
  std::vector<BlockId> block_of_;     // the Executor's per-tensor arrays, reserved here
  std::vector<uint64_t> rounded_of_;
  Executor executor_;
  size_t executed_ = 0;
  size_t handed_ = 0;  // events handed on so far
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

void StreamRun::watch(const Program& program, const MemoryEvent& e) {
  if (e.type == EventType::alloc) {
    const auto it = watch_serial_.find(program.serial_of(e.tensor));
    if (it != watch_serial_.end()) watch_live_[e.tensor] = it->second;
  } else if (e.type == EventType::free) {
    const auto it = watch_live_.find(e.tensor);
    if (it == watch_live_.end()) return;
    watch_info_[it->second] = program.tensors[e.tensor];  // its id may be reused now
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

void StreamRun::observe(const Program& program, const MemoryEvent& e, size_t i,
                        const MemoryStats& stats) {
  const uint64_t allocated = static_cast<uint64_t>(stats.allocated_bytes.all.current);
  const uint64_t reserved = static_cast<uint64_t>(stats.reserved_bytes.all.current);
  const uint64_t requested = static_cast<uint64_t>(stats.requested_bytes.all.current);
  reserved_high_ = std::max(reserved_high_, reserved);
  if (!watch_serial_.empty()) watch(program, e);
  switch (e.type) {
    case EventType::alloc:
      if (e.bytes > 0 && options_.analysis.live_set) {
        // Grown 1024 ids past the one asked for (the vector's capacity grows
        // geometrically): one resize per 1024 tensors, and at most 20 KiB past the last
        // tensor touched. live_at() skips the entries never allocated.
        if (e.tensor >= lifetimes_.size()) lifetimes_.resize(size_t{e.tensor} + 1024);
        lifetimes_[e.tensor] = Lifetime{e.op, e.layer, static_cast<uint32_t>(i),
                                        program.serial_of(e.tensor), e.kind, e.phase};
      }
      break;
    case EventType::free:
      if (e.tensor < lifetimes_.size() && lifetimes_[e.tensor].alloc != Lifetime::kNever) {
        Lifetime& l = lifetimes_[e.tensor];
        // Live at the peak (allocated at or before it; freed now, after it): keep a copy.
        if (have_peak_ && l.alloc <= peak_index_)
          dead_at_peak_.push_back(DeadAtPeak{l, program.tensors[e.tensor]});
        l.alloc = Lifetime::kNever;  // the id may be reused
      }
      break;
    case EventType::mark: {
      const std::string& name = program.str(static_cast<uint32_t>(e.bytes));
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

}  // namespace

StreamResult stream_run(Program& program, const std::function<void(Program&)>& build,
                        const AllocatorConfig& config, DeviceMemory& device,
                        const StreamOptions& options) {
  StreamRun sink(config, device, options);
  program.set_sink(SinkAttachment{&sink, options.chunk, options.stop_at_oom});
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
  return sink.result(program, complete);
}

}  // namespace memsim
