#include "sim/analysis/analysis.h"

#include "program/tensor_names.h"

#include <algorithm>
#include <cmath>

#include "sim/analysis/peaks.h"

namespace memsim {
namespace {

uint64_t peak_of(const Stat& stat) {
  return stat.peak > 0 ? static_cast<uint64_t>(stat.peak) : 0;
}

// Name of a mark event, or "" when the event is not a mark (or names no string).
const std::string& mark_name(const Program& program, const MemoryEvent& e) {
  static const std::string kEmpty;
  if (e.type != EventType::mark) return kEmpty;
  return program.str(static_cast<uint32_t>(e.bytes));
}

}  // namespace

Breakdown to_breakdown(const std::array<uint64_t, kTensorKindCount>& by_kind) {
  auto at = [&](TensorKind k) { return by_kind[static_cast<size_t>(k)]; };
  Breakdown b;
  b.parameters = at(TensorKind::parameter);
  b.gradients = at(TensorKind::gradient);
  b.optimizer_state = at(TensorKind::optimizer_state);
  b.activations = at(TensorKind::activation);
  b.temporaries = at(TensorKind::temporary);
  b.other = at(TensorKind::input) + at(TensorKind::loss) + at(TensorKind::other);
  return b;
}

EventPoint event_point(const Program& program, const Timeline& timeline, size_t index) {
  EventPoint p;
  p.index = index;
  if (index < program.events.size()) {
    const MemoryEvent& e = program.events[index];
    p.op = e.type == EventType::mark ? mark_name(program, e) : program.str(e.op);
    p.phase = e.phase;
    p.layer = e.layer;
  }
  if (index < timeline.size()) {
    p.allocated = timeline.allocated[index];
    p.reserved = timeline.reserved[index];
    p.requested = timeline.requested[index];
  }
  return p;
}

Analysis analyze(const Program& program, const Timeline& timeline,
                 const AnalysisOptions& options) {
  Analysis a;
  a.events = program.events.size();
  // A Timeline never outruns its Program; clamp anyway so a mismatched pair cannot crash.
  const size_t end = std::min({timeline.allocated.size(), timeline.reserved.size(),
                               timeline.requested.size(), program.events.size()});
  a.events_executed = end;
  a.flops = program.flops;

  for (size_t i = 0; i < end; ++i) {
    if (mark_name(program, program.events[i]) == options.measured_from_mark) {
      a.measured_begin = i;
      break;
    }
  }

  if (a.measured_begin < end) {
    size_t peak_index = a.measured_begin;
    for (size_t i = a.measured_begin; i < end; ++i) {
      if (timeline.allocated[i] > timeline.allocated[peak_index]) peak_index = i;
      a.peak_reserved = std::max(a.peak_reserved, timeline.reserved[i]);
      a.peak_requested = std::max(a.peak_requested, timeline.requested[i]);
    }
    a.peak_allocated = timeline.allocated[peak_index];
    a.peak = event_point(program, timeline, peak_index);

    if (options.live_set) a.live_at_peak = live_set_at(program, peak_index, options.top_tensors);
    if (peak_index < timeline.by_kind.size()) {
      a.breakdown_at_peak = to_breakdown(timeline.by_kind[peak_index]);
    } else {
      a.breakdown_at_peak = to_breakdown(options.live_set ? a.live_at_peak.by_kind
                                                          : live_set_at(program, peak_index, 0).by_kind);
    }

    const double fraction = std::max(0.0, options.min_peak_prominence);
    const auto min_prominence =
        static_cast<uint64_t>(std::floor(static_cast<double>(a.peak_allocated) * fraction));
    for (const CurvePeak& cp : find_top_peaks(timeline.allocated, a.measured_begin, end,
                                              options.top_peaks, min_prominence)) {
      a.top_peaks.push_back(event_point(program, timeline, cp.index));
    }
  }

  if (options.use_final_stats) {
    const MemoryStats& s = timeline.final_stats;
    a.peak_allocated = std::max(a.peak_allocated, peak_of(s.allocated_bytes.all));
    a.peak_reserved = std::max(a.peak_reserved, peak_of(s.reserved_bytes.all));
    a.peak_requested = std::max(a.peak_requested, peak_of(s.requested_bytes.all));
  }

  for (const std::string& name : options.marks) {
    std::optional<MarkPoint> found;
    for (size_t i = a.measured_begin; i < end; ++i) {
      if (mark_name(program, program.events[i]) == name) {
        found = MarkPoint{name, i, timeline.allocated[i], timeline.reserved[i]};
      }
    }
    a.marks.emplace_back(name, std::move(found));
  }

  if (timeline.oom) {
    const OomPoint& o = *timeline.oom;
    OomReport r;
    r.index = o.event_index;
    if (o.event_index < program.events.size()) {
      const MemoryEvent& e = program.events[o.event_index];
      r.op = program.str(e.op);
      r.phase = e.phase;
      r.layer = e.layer;
      r.kind = e.kind;
      if (e.tensor < program.tensors.size()) r.tensor = tensor_name(program, e.tensor, e);
    }
    r.requested_bytes = o.details.requested_bytes;
    r.allocated_bytes = o.details.allocated_bytes;
    r.reserved_bytes = o.details.reserved_bytes;
    r.capacity_bytes = o.details.device_total;
    r.free_bytes = o.details.device_free;
    r.message = o.details.message;
    if (o.event_index > 0 && o.event_index <= end) {
      const size_t before = o.event_index - 1;
      r.breakdown = before < timeline.by_kind.size()
                        ? to_breakdown(timeline.by_kind[before])
                        : to_breakdown(live_set_at(program, before, 0).by_kind);
    }
    a.oom = std::move(r);
  }
  return a;
}

}  // namespace memsim
