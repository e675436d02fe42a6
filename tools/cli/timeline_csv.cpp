#include "tools/cli/timeline_csv.h"

#include <algorithm>
#include <charconv>
#include <string>

#include "program/tensor_names.h"

namespace memsim::cli {
namespace {

const char* type_name(EventType type) {
  switch (type) {
    case EventType::alloc: return "alloc";
    case EventType::free: return "free";
    case EventType::mark: return "mark";
    case EventType::empty_cache: return "empty_cache";
  }
  return "other";
}

void put_field(std::string& line, const std::string& text) {
  // RFC 4180 quoting, only when needed (op names are normally plain identifiers).
  if (text.find_first_of(",\"\r\n") == std::string::npos) {
    line += text;
    return;
  }
  line += '"';
  for (char c : text) {
    if (c == '"') line += '"';
    line += c;
  }
  line += '"';
}

template <typename Int>
void put_int(std::string& line, Int value) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof buf, value);
  line.append(buf, res.ptr);
}

std::string header() {
  std::string h = "index,type,op,phase,layer,kind,bytes,allocated,reserved,requested";
  for (int k = 0; k < kTensorKindCount; ++k) {
    h += ',';
    h += to_string(static_cast<TensorKind>(k));
  }
  return h + ",name\n";  // appended last: the columns before it keep their positions
}

// Writes `buf` out once it holds ~1 MiB, so memory stays constant for long timelines.
void flush_if_large(std::FILE* out, std::string& buf) {
  if (buf.size() > (1u << 20)) {
    std::fwrite(buf.data(), 1, buf.size(), out);
    buf.clear();
  }
}

}  // namespace

void write_timeline_csv(std::FILE* out, const Program& program, const Timeline& timeline) {
  std::string buf = header();
  const TensorNames names(program);  // program/tensor_names.h: built once

  const size_t n = std::min({timeline.allocated.size(), timeline.reserved.size(),
                             timeline.requested.size(), program.events.size()});
  const bool by_kind = timeline.by_kind.size() >= n;
  for (size_t i = 0; i < n; ++i) {
    const MemoryEvent& e = program.events[i];
    const bool is_tensor = e.type == EventType::alloc || e.type == EventType::free;
    put_int(buf, i);
    buf += ',';
    buf += type_name(e.type);
    buf += ',';
    put_field(buf, e.type == EventType::mark ? program.str(static_cast<uint32_t>(e.bytes))
                                             : program.str(e.op));
    buf += ',';
    buf += to_string(e.phase);
    buf += ',';
    if (e.layer >= 0) put_int(buf, e.layer);
    buf += ',';
    if (is_tensor) buf += to_string(e.kind);
    buf += ',';
    put_int(buf, is_tensor ? e.bytes : uint64_t{0});
    buf += ',';
    put_int(buf, timeline.allocated[i]);
    buf += ',';
    put_int(buf, timeline.reserved[i]);
    buf += ',';
    put_int(buf, timeline.requested[i]);
    for (int k = 0; k < kTensorKindCount; ++k) {
      buf += ',';
      if (by_kind) put_int(buf, timeline.by_kind[i][static_cast<size_t>(k)]);
    }
    buf += ',';
    if (is_tensor) put_field(buf, names.name(e.tensor));
    buf += '\n';
    flush_if_large(out, buf);
  }
  std::fwrite(buf.data(), 1, buf.size(), out);
}

void write_trace_timeline_csv(std::FILE* out, const std::vector<SnapshotTraceEntry>& trace,
                              const std::vector<ReplayTimelinePoint>& timeline) {
  std::string buf = header();
  const size_t n = std::min(trace.size(), timeline.size());
  constexpr size_t kOther = static_cast<size_t>(TensorKind::other);
  for (size_t i = 0; i < n; ++i) {
    const SnapshotTraceEntry& e = trace[i];
    const bool is_block = e.action == TraceAction::alloc || e.action == TraceAction::free_requested ||
                          e.action == TraceAction::free_completed;
    put_int(buf, i);
    buf += ',';
    buf += to_string(e.action);
    buf += ",,other,,";
    if (is_block) buf += "other";
    buf += ',';
    put_int(buf, e.size);
    buf += ',';
    put_int(buf, timeline[i].allocated);
    buf += ',';
    put_int(buf, timeline[i].reserved);
    buf += ',';
    put_int(buf, timeline[i].requested);
    for (size_t k = 0; k < static_cast<size_t>(kTensorKindCount); ++k) {
      buf += ',';
      put_int(buf, k == kOther ? timeline[i].allocated : uint64_t{0});
    }
    buf += ",\n";  // name: a trace block has none
    flush_if_large(out, buf);
  }
  std::fwrite(buf.data(), 1, buf.size(), out);
}

}  // namespace memsim::cli
