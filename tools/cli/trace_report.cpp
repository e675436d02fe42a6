#include "tools/cli/trace_report.h"

#include <cinttypes>
#include <string>
#include <tuple>
#include <utility>

#include "program/tensor_names.h"
#include "tools/cli/json_report.h"

namespace memsim::cli {

namespace {

// Thread ids of the slice tracks (process 1).
constexpr int kPhaseTid = 1;
constexpr int kLayerTid = 2;
constexpr int kOpTid = 3;

std::string quoted(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Writes the events as one JSON array, comma-separated; streams rather than building a
// Json tree, because a large model's trace has millions of entries.
class EventWriter {
 public:
  explicit EventWriter(std::FILE* out) : out_(out) {}
  // `body` is the event object without its braces.
  void event(const std::string& body) {
    std::fputs(first_ ? "\n{" : ",\n{", out_);
    std::fputs(body.c_str(), out_);
    std::fputc('}', out_);
    first_ = false;
  }

 private:
  std::FILE* out_;
  bool first_ = true;
};

std::string slice(const std::string& name, int tid, size_t begin, size_t end,
                  const std::string& args) {
  char head[160];
  std::snprintf(head, sizeof head, "\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%zu,\"dur\":%zu,",
                tid, begin, end - begin);
  std::string s = head;
  s += "\"name\":" + quoted(name);
  if (!args.empty()) s += ",\"args\":{" + args + "}";
  return s;
}

std::string thread_name(int tid, const char* name) {
  return "\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(tid) +
         ",\"name\":\"thread_name\",\"args\":{\"name\":\"" + name + "\"}";
}

// Emits one slice per maximal run of events with equal key(i); skip(i) events close a
// run and open none.
template <class Key, class Skip, class Emit>
void runs(size_t n, Key key, Skip skip, Emit emit) {
  size_t begin = 0;
  bool open = false;
  for (size_t i = 0; i <= n; ++i) {
    const bool boundary = i == n || skip(i) || !open || key(i) != key(begin);
    if (!boundary) continue;
    if (open) emit(begin, i);
    open = i < n && !skip(i);
    begin = i;
  }
}

}  // namespace

void write_trace_json(std::FILE* out, const Program& program, const Timeline& timeline) {
  const size_t n = timeline.size();
  const auto& ev = program.events;
  std::fputs("{\"otherData\":{\"time_axis\":\"program event index\"},"
             "\"traceEvents\":[",
             out);
  EventWriter w(out);
  const TensorNames names(program);
  constexpr size_t kSliceTensors = 8;
  w.event("\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"memsim\"}");
  w.event(thread_name(kPhaseTid, "phase"));
  w.event(thread_name(kLayerTid, "layer"));
  w.event(thread_name(kOpTid, "op"));

  // Counters, where they change.
  const bool kinds = timeline.by_kind.size() == n;
  for (size_t i = 0; i < n; ++i) {
    const bool edge = i == 0 || i + 1 == n;
    if (edge || timeline.allocated[i] != timeline.allocated[i - 1] ||
        timeline.reserved[i] != timeline.reserved[i - 1] ||
        timeline.requested[i] != timeline.requested[i - 1]) {
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "\"ph\":\"C\",\"pid\":1,\"name\":\"memory\",\"ts\":%zu,\"args\":{"
                    "\"allocated\":%" PRIu64 ",\"reserved\":%" PRIu64 ",\"requested\":%" PRIu64 "}",
                    i, timeline.allocated[i], timeline.reserved[i], timeline.requested[i]);
      w.event(buf);
    }
    if (kinds && (edge || timeline.by_kind[i] != timeline.by_kind[i - 1])) {
      std::string s = "\"ph\":\"C\",\"pid\":1,\"name\":\"allocated by kind\",\"ts\":" +
                      std::to_string(i) + ",\"args\":{";
      for (int k = 0; k < kTensorKindCount; ++k) {
        if (k > 0) s += ',';
        s += std::string("\"") + to_string(static_cast<TensorKind>(k)) + "\":" +
             std::to_string(timeline.by_kind[i][static_cast<size_t>(k)]);
      }
      w.event(s + "}");
    }
  }

  auto never = [](size_t) { return false; };
  runs(
      n, [&](size_t i) { return static_cast<int>(ev[i].phase); }, never,
      [&](size_t b, size_t e) { w.event(slice(to_string(ev[b].phase), kPhaseTid, b, e, "")); });
  runs(
      n, [&](size_t i) { return std::make_pair(ev[i].layer, static_cast<int>(ev[i].phase)); },
      [&](size_t i) { return ev[i].layer < 0; },
      [&](size_t b, size_t e) {
        w.event(slice("layer " + std::to_string(ev[b].layer), kLayerTid, b, e,
                      std::string("\"phase\":\"") + to_string(ev[b].phase) + "\""));
      });
  // Marks are moments, not ops: they get instant events instead of op slices.
  runs(
      n,
      [&](size_t i) {
        return std::make_tuple(ev[i].op, ev[i].layer, static_cast<int>(ev[i].phase));
      },
      [&](size_t i) { return ev[i].type == EventType::mark || ev[i].op == 0; },
      [&](size_t b, size_t e) {
        std::string args = std::string("\"phase\":\"") + to_string(ev[b].phase) + "\"";
        if (ev[b].layer >= 0) args += ",\"layer\":" + std::to_string(ev[b].layer);
        // What the slice allocates, by name (program/tensor_names.h), the first few.
        std::string allocs;
        size_t count = 0;
        for (size_t i = b; i < e; ++i) {
          if (ev[i].type != EventType::alloc) continue;
          if (count++ < kSliceTensors) allocs += (allocs.empty() ? "" : ",") + quoted(names.name(ev[i].tensor));
        }
        if (count > 0) {
          args += ",\"allocates\":[" + allocs + "]";
          if (count > kSliceTensors) args += ",\"allocates_total\":" + std::to_string(count);
        }
        w.event(slice(program.str(ev[b].op), kOpTid, b, e, args));
      });

  for (size_t i = 0; i < n; ++i) {
    if (ev[i].type != EventType::mark) continue;
    w.event("\"ph\":\"i\",\"s\":\"p\",\"pid\":1,\"tid\":" + std::to_string(kPhaseTid) +
            ",\"ts\":" + std::to_string(i) +
            ",\"name\":" + quoted(program.str(static_cast<uint32_t>(ev[i].bytes))));
  }
  if (timeline.oom) {
    const OomPoint& o = *timeline.oom;
    const std::string op = o.event_index < ev.size() ? program.str(ev[o.event_index].op) : "";
    const std::string tensor = o.event_index < ev.size() ? names.name(ev[o.event_index].tensor) : "";
    w.event("\"ph\":\"i\",\"s\":\"g\",\"pid\":1,\"tid\":" + std::to_string(kPhaseTid) +
            ",\"ts\":" + std::to_string(o.event_index) + ",\"name\":\"OOM\",\"args\":{\"op\":" +
            quoted(op) + ",\"tensor\":" + quoted(tensor) + ",\"requested_bytes\":" + std::to_string(o.details.requested_bytes) +
            ",\"message\":" + quoted(o.details.message) + "}");
  }
  std::fputs("\n]}\n", out);
}

}  // namespace memsim::cli
