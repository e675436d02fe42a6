// The wrap units of FSDP's transformer auto-wrap policy (FSDP1) and of fully_shard per block
// (FSDP2): which transformer layer each parameter was created in, read from the parameter's
// alloc event in the model's construction, and how many layers have parameters. Unit 0 is
// the root (embeddings, final norm, head: layer -1); unit 1 + l is layer l.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "program/program.h"

namespace memsim {

struct ParameterLayers {
  std::unordered_map<uint32_t, int32_t> layer_of_storage;  // parameter storage -> layer (-1: root)
  int32_t layers = 0;                                      // 1 + the largest layer seen
};

inline ParameterLayers parameter_layers(const Program& program) {
  ParameterLayers p;
  for (const MemoryEvent& e : program.events)
    if (e.type == EventType::alloc && e.kind == TensorKind::parameter)
      p.layer_of_storage[e.tensor] = e.layer;
  for (const auto& [storage, layer] : p.layer_of_storage) p.layers = std::max(p.layers, layer + 1);
  return p;
}

}  // namespace memsim
