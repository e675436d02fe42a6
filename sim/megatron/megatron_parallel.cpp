#include "sim/megatron/megatron_parallel.h"

#include <algorithm>
#include <string>

namespace memsim {

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
}  // namespace

void require_megatron_model_parallel_modelled(const Scenario& s) {
  const ParallelConfig& p = s.parallel;
  if (p.pipeline_schedule == PipelineSchedule::interleaved &&
      std::max<int64_t>(1, s.batch.grad_accum) % p.pipeline != 0)
    refuse(s, "batch.grad_accum",
           "the interleaved schedule needs the number of micro-batches (" +
               std::to_string(std::max<int64_t>(1, s.batch.grad_accum)) +
               ") to be a multiple of parallel.pipeline (" + std::to_string(p.pipeline) +
               "), as Megatron-LM requires");
  if (p.sequence && p.tensor == 1)
    refuse(s, "parallel.sequence",
           "sequence parallelism needs parallel.tensor > 1 (Megatron turns it off otherwise)");
  if (p.tensor == 1) return;
  if (p.sequence && s.batch.seq_len % p.tensor != 0)
    refuse(s, "parallel.sequence",
           "batch.seq_len (" + std::to_string(s.batch.seq_len) + ") must be divisible by " +
               "parallel.tensor (" + std::to_string(p.tensor) + ")");
  if (s.model.heads % p.tensor != 0)
    refuse(s, "parallel.tensor",
           "model.heads (" + std::to_string(s.model.heads) + ") must be divisible by " +
               "parallel.tensor (" + std::to_string(p.tensor) + ")");
  if (s.model.d_ff % p.tensor != 0)
    refuse(s, "parallel.tensor",
           "model.d_ff (" + std::to_string(s.model.d_ff) + ") must be divisible by " +
               "parallel.tensor (" + std::to_string(p.tensor) + ")");
}

RankInfo megatron_model_parallel_rank(const Scenario& s, RankInfo base) {
  if (s.parallel.tensor <= 1) return base;
  const std::string tp = "tensor-parallel ranks hold equal shards (heads, FFN columns and "
                         "vocabulary split " + std::to_string(s.parallel.tensor) +
                         " ways); rank 0 stands for all";
  // 3D parallelism: the data-parallel group of tensor-parallel rank 0 (its DDP buffer and
  // distributed-optimizer shards hold that rank's shard of the model).
  base.why = base.why.empty() ? tp : tp + "; " + base.why + " of its data-parallel group";
  return base;
}

}  // namespace memsim
