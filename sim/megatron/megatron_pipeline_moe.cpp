#include "sim/megatron/megatron_pipeline_moe.h"

#include "scenario/pipeline_split.h"

namespace memsim {

int64_t megatron_chunk_layer_offset(const Scenario& s, int64_t stage, int64_t chunk) {
  return chunk_layers(pipeline_split(s), stage, chunk).offset;  // scenario/pipeline_split.h
}

std::vector<int32_t> megatron_moe_stage_key_part(const Scenario& s, int64_t stage) {
  std::vector<int32_t> key;
  const graph::MoeSpec& m = s.model.arch.moe;
  if (m.experts <= 0) return key;
  // Per-layer routing counts (more than one row of E) tie a MoE layer to its global index.
  const bool per_layer_routing =
      m.routing == graph::MoeRouting::counts && m.counts.size() > static_cast<size_t>(m.experts);
  const PipelineSplit split = pipeline_split(s);
  for (int64_t c = 0; c < split.chunks; ++c) {
    const ChunkLayers layers = chunk_layers(split, stage, c);
    const int64_t first = layers.offset;
    int64_t moe_index = 0;
    for (int64_t i = 0; i < first; ++i) moe_index += m.layer_is_moe(i) ? 1 : 0;
    for (int64_t l = first; l < first + layers.count; ++l) {
      if (!m.layer_is_moe(l)) {
        key.push_back(0);
        continue;
      }
      key.push_back(per_layer_routing ? static_cast<int32_t>(1 + moe_index) : 1);
      ++moe_index;
    }
  }
  return key;
}

}  // namespace memsim
