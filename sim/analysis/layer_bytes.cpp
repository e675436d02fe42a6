#include "sim/analysis/layer_bytes.h"

namespace memsim {

namespace {

// Walks events [0, end) (stopping early at the mark `mark` when given) and sums the live
// tensors' requested bytes by kind and by layer.
LiveBytes live_bytes(const Program& program, size_t end, const std::string_view* mark) {
  LiveBytes r;
  std::vector<int32_t> layer_of(program.tensors.size(), -1);
  std::vector<uint8_t> live(program.tensors.size(), 0);
  for (size_t i = 0; i < end && i < program.events.size(); ++i) {
    const MemoryEvent& e = program.events[i];
    if (e.type == EventType::mark) {
      if (mark != nullptr && program.str(static_cast<uint32_t>(e.bytes)) == *mark) {
        r.found_mark = true;
        break;
      }
      continue;
    }
    if (e.type == EventType::alloc) {
      live[e.tensor] = 1;
      layer_of[e.tensor] = e.layer;
    } else if (e.type == EventType::free) {
      live[e.tensor] = 0;
    }
  }
  for (size_t t = 0; t < live.size(); ++t) {
    if (!live[t]) continue;
    const TensorInfo& info = program.tensors[t];
    const int k = static_cast<int>(info.kind);
    r.by_kind[k] += info.bytes;
    const int32_t layer = layer_of[t];
    if (layer < 0) {
      r.outside[k] += info.bytes;
      continue;
    }
    if (r.by_layer.size() <= static_cast<size_t>(layer)) r.by_layer.resize(layer + 1);
    r.by_layer[layer][k] += info.bytes;
  }
  return r;
}

}  // namespace

LiveBytes live_bytes_at_mark(const Program& program, std::string_view mark) {
  return live_bytes(program, program.events.size(), &mark);
}

LiveBytes live_bytes_after_event(const Program& program, size_t event_index) {
  const size_t end = event_index < program.events.size() ? event_index + 1 : program.events.size();
  return live_bytes(program, end, nullptr);
}

}  // namespace memsim
