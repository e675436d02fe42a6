// EventSink: a consumer of a Program's events while they are being emitted (streaming
// execution, issue #20 item 1).
//
// Without a sink a Program stores every event (Program::events), and consumers read the
// whole array afterwards. With a sink attached (Program::set_sink), the Program keeps only
// a short tail of recent events in Program::events and hands older ones to the sink in
// order, in chunks; the allocator emulator and the online analysis
// (sim/analysis/stream_run.h) run on them as they come, so a run's memory no longer holds
// every event, and a run can stop building at its first out-of-memory.
//
// Why a buffered tail and not one call per event: some builders edit events they have
// just emitted (a stream index or a kind on the last alloc, a torch.compile region's
// events rewritten when the region ends, a checkpoint re-run's unborn output removed), and
// the parallel wrappers rewrite the model's construction events while it is being
// wrapped. The Program therefore hands events on only (a) at the start of an alloc, mark
// or empty_cache (so the event just appended is still editable), (b) when the new event's
// phase is not Phase::setup (construction-time rewrites see every setup event), and
// (c) while nobody holds the tail (Program::hold, for a compiled region). Frees never
// flush: an exception unwinding through the builder only emits frees.
//
// Contract:
//  - consume() receives events [first, first + n) of the Program, each exactly once, in
//    order, after every edit the builder makes to them. It returns false once it needs no
//    more events (e.g. the allocator ran out of memory); the Program then keeps counting
//    events but stores and hands on none (event_count() stays the full count).
//  - When the Program was told to abort (set_sink's abort_when_done), the next alloc after
//    consume() returned false throws StopEmitting (once): the builder unwinds, the run
//    ends early, and the total event count is unknown.
#pragma once

#include <cstddef>

namespace memsim {

class Program;
struct MemoryEvent;

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual bool consume(const Program& program, const MemoryEvent* events, size_t n,
                       size_t first) = 0;
};

// A sink and how the Program feeds it (Program::set_sink).
struct SinkAttachment {
  EventSink* sink = nullptr;
  size_t chunk = 4096;           // events per consume() call, about (L2-sized: 128 KiB)
  bool abort_when_done = false;  // throw StopEmitting once the sink stops
};

// Thrown by Program::alloc to stop a builder whose sink needs no more events. Not a
// std::exception, so generic handlers (sweep's per-point catch) do not mistake it for an
// error; the code that attached the sink catches it.
struct StopEmitting {};

}  // namespace memsim
