// Builds and runs one pipeline stage's Program under a checkpointing plan, reusing storage
// from one build to the next (memsim optimize on pipeline scenarios builds dozens of
// stage Programs of one scenario; sim/search/optimize_pipeline.h).
//
// Contract: build(plan, stage) is build_megatron_stage_program of the scenario with `plan`
// as its checkpoint section (checkpoint.reentrant kept); run() executes it as `memsim run`
// would (the scenario's allocator settings, a device whose allocator may use `capacity`
// bytes, 0 = unlimited) without per-kind arrays. The references returned are valid until
// the next build or run.
#pragma once

#include <cstdint>

#include "graph/checkpoint.h"
#include "graph/runtime.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"

namespace memsim {

class StageSimulator {
 public:
  explicit StageSimulator(const Scenario& scenario);

  const Program& build(const graph::CheckpointPlan& plan, int64_t stage);
  // Builds and executes; true when the stage runs without running out of memory.
  bool run(const graph::CheckpointPlan& plan, int64_t stage, uint64_t capacity);
  const Timeline& timeline() const { return timeline_; }
  const Program& program() const { return program_; }
  // The last run, analysed.
  Analysis analysis() const { return analyze(program_, timeline_); }

 private:
  const Scenario& scenario_;
  Scenario planned_;
  Program program_;
  graph::RuntimeBuffers runtime_;
  ExecuteBuffers exec_;
  Timeline timeline_;
};

}  // namespace memsim
