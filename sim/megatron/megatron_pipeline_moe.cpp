#include "sim/megatron/megatron_pipeline_moe.h"

namespace memsim {

namespace {
int64_t chunks(const Scenario& s) {
  return s.parallel.pipeline_schedule == PipelineSchedule::interleaved ? s.parallel.virtual_stages : 1;
}
}  // namespace

int64_t megatron_chunk_layer_offset(const Scenario& s, int64_t stage, int64_t chunk) {
  const int64_t p = s.parallel.pipeline, v = chunks(s);
  return (chunk * p + stage) * (s.model.layers / (p * v));
}

std::vector<int32_t> megatron_moe_stage_key_part(const Scenario& s, int64_t stage) {
  std::vector<int32_t> key;
  const graph::MoeSpec& m = s.model.arch.moe;
  if (m.experts <= 0) return key;
  // Per-layer routing counts (more than one row of E) tie a MoE layer to its global index.
  const bool per_layer_routing =
      m.routing == graph::MoeRouting::counts && m.counts.size() > static_cast<size_t>(m.experts);
  const int64_t per_chunk = s.model.layers / (s.parallel.pipeline * chunks(s));
  for (int64_t c = 0; c < chunks(s); ++c) {
    const int64_t first = megatron_chunk_layer_offset(s, stage, c);
    int64_t moe_index = 0;
    for (int64_t i = 0; i < first; ++i) moe_index += m.layer_is_moe(i) ? 1 : 0;
    for (int64_t l = first; l < first + per_chunk; ++l) {
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
