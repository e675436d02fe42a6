// The context-parallel keys parallel.context and parallel.context_rotate (torch's
// context_parallel as torchtitan drives it: ring attention over N ranks, each holding S/N of
// the sequence; graph/ops/ops_ring.h, docs/torchtitan-recipes.md "Context parallelism").
// Internal to the scenario loader, run once parallel.* is read.
//
// Contract: parallel.context 1 (the default) is no context parallelism and reads
// parallel.context_rotate without effect. With N > 1 a combination no real stack allows
// fails first, naming the keys: batch.seq_len not divisible by 2N (x parallel.tensor; the
// head-tail load balancer's 2N chunks), model.attention eager (nothing to replace), a
// sharding other than fsdp2 (torchtitan applies fully_shard over dp_shard x cp whenever CP
// is on). Then what is not modelled is refused by key: other families / rows than
// hf-llama's llama row on transformers' code, mem-efficient attention, LoRA, autocast,
// compile, activation offload, checkpoint policies other than none / full / sac-layer:N,
// loss.impl, tensor or pipeline parallelism, an integer parallel.reshard_after_forward, step
// kinds other than train and forward-backward. Accepted: s.parallel.context and s.parallel.context_rotate set.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

void read_context_parallel(const Doc& d, Scenario& s);  // after build_parallel

}  // namespace memsim::scenario_detail
