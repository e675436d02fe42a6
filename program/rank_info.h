// Which GPU of a distributed job a Program simulates.
//
// memsim simulates one rank at a time. For a parallel run (data, tensor, pipeline
// parallelism, ZeRO/FSDP sharding) the schedule picks the rank whose memory is the
// largest (for pipeline parallelism usually stage 0, which keeps the most micro-batches
// of activations in flight) and records here which one it is and why, so reports can say
// "worst rank: stage 0 of 8" instead of silently showing an arbitrary GPU.
//
// Contract: world_size == data * tensor * pipeline * context (parallel.context);
// 0 <= index < world_size; 0 <= pipeline_stage < pipeline. A single-GPU run is the default value.
#pragma once

#include <string>

namespace memsim {

struct RankInfo {
  int index = 0;           // global rank simulated
  int world_size = 1;      // GPUs in the job
  int data = 1;            // data-parallel degree (replicas, or ZeRO/FSDP shard group)
  int tensor = 1;          // tensor-parallel degree
  int pipeline = 1;        // pipeline-parallel degree
  int pipeline_stage = 0;  // stage this rank runs
  std::string why;         // why this rank is the one reported ("" for one GPU)

  bool distributed() const { return world_size > 1; }
};

}  // namespace memsim
