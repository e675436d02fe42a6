#include "sim/megatron/pipeline_schedule.h"

#include <algorithm>
#include <stdexcept>

namespace memsim {

std::vector<PipelineAction> pipeline_actions(PipelineSchedule schedule, int64_t p, int64_t v,
                                             int64_t m, int64_t stage, bool forward_only) {
  if (p < 1 || v < 1 || m < 1 || stage < 0 || stage >= p)
    throw std::invalid_argument("pipeline_actions: bad pipeline shape");
  if (schedule != PipelineSchedule::interleaved) v = 1;
  const int64_t total = m * v;
  // Virtual micro-batch j -> (chunk, micro-batch): the groups of p consecutive micro-batches
  // go through chunk 0, then chunk 1, ... (backward: the last chunk first).
  auto at = [p, v](int64_t j, bool forward) {
    PipelineAction a;
    a.forward = forward;
    const int64_t in_group = j % (p * v);
    const int64_t chunk = in_group / p;
    a.chunk = static_cast<int32_t>(forward ? chunk : v - 1 - chunk);
    a.micro_batch = static_cast<int32_t>(j / (p * v) * p + in_group % p);
    return a;
  };
  std::vector<PipelineAction> out;
  out.reserve(static_cast<size_t>(2 * total));
  if (forward_only) {
    for (int64_t j = 0; j < total; ++j) out.push_back(at(j, true));
    return out;
  }
  int64_t warmup = 0;
  switch (schedule) {
    case PipelineSchedule::one_f_one_b: warmup = p - stage - 1; break;
    case PipelineSchedule::gpipe: warmup = total; break;
    case PipelineSchedule::interleaved: warmup = (p - stage - 1) * 2 + (v - 1) * p; break;
  }
  warmup = std::min(warmup, total);
  const int64_t remaining = total - warmup;
  for (int64_t j = 0; j < warmup; ++j) out.push_back(at(j, true));
  for (int64_t i = 0; i < remaining; ++i) {
    out.push_back(at(warmup + i, true));
    out.push_back(at(i, false));
  }
  for (int64_t j = remaining; j < total; ++j) out.push_back(at(j, false));
  return out;
}

int64_t max_in_flight(const std::vector<PipelineAction>& actions) {
  int64_t live = 0, most = 0;
  for (const PipelineAction& a : actions) {
    live += a.forward ? 1 : -1;
    most = std::max(most, live);
  }
  return most;
}

}  // namespace memsim
