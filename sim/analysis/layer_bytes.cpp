#include "sim/analysis/layer_bytes.h"

namespace memsim {

LiveBytes live_bytes_at_mark(const Program& program, std::string_view mark) {
  LiveBytes r;
  std::vector<int32_t> layer_of(program.tensors.size(), -1);
  std::vector<uint8_t> live(program.tensors.size(), 0);
  for (const MemoryEvent& e : program.events) {
    if (e.type == EventType::mark) {
      if (program.str(static_cast<uint32_t>(e.bytes)) == mark) {
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

}  // namespace memsim
