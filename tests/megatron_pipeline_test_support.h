// A small megatron model (d_model 256, 4 heads, bf16 with fp32 master weights, fused
// AdamW, dropout) split into pipeline stages: simulates in milliseconds per stage.
// Shared by the pipeline-parallel tests.
#pragma once

#include <cstdint>

#include "scenario/scenario.h"

namespace memsim_test {

inline memsim::Scenario tiny_pipeline(
    int64_t layers, int64_t pipeline, int64_t micro_batches,
    memsim::PipelineSchedule schedule = memsim::PipelineSchedule::one_f_one_b, int64_t v = 1) {
  using namespace memsim;
  Scenario s;
  s.name = "megatron-tiny-pipeline";
  s.source = "tiny.yaml";
  s.model.family = ModelFamily::megatron;
  s.model.layers = layers;
  s.model.d_model = 256;
  s.model.heads = 4;
  s.model.kv_heads = 4;
  s.model.d_ff = 1024;
  s.model.vocab = 1000;
  s.model.context_length = 128;
  s.model.tied_embeddings = true;
  s.model.dropout = 0.1;
  s.batch.micro_batch = 2;
  s.batch.seq_len = 128;
  s.batch.grad_accum = micro_batches;
  s.precision.params = DType::bf16;
  s.precision.master_weights = true;
  s.optimizer.type = OptimizerType::adamw;
  s.optimizer.impl = OptimizerImpl::fused;
  s.step.warmup_steps = 1;
  s.parallel.pipeline = pipeline;
  s.parallel.pipeline_schedule = schedule;
  s.parallel.virtual_stages = v;
  return s;
}

}  // namespace memsim_test
