#include "sim/search/pipeline_stage_sim.h"

#include <utility>

#include "allocator/caching_allocator.h"
#include "sim/megatron/megatron_pipeline.h"
#include "sim/step/checkpoint_policy.h"

namespace memsim {

StageSimulator::StageSimulator(const Scenario& scenario) : scenario_(scenario) {}

const Program& StageSimulator::build(const graph::CheckpointPlan& plan, int64_t stage) {
  // The scenario's own checkpoint.reentrant stays (see with_plan in sim/search/optimize.cpp).
  planned_ = scenario_;
  planned_.checkpoint = config_for_plan(plan);
  planned_.checkpoint.reentrant = scenario_.checkpoint.reentrant;
  build_megatron_stage_program(planned_, {}, stage, program_, &runtime_);
  return program_;
}

bool StageSimulator::run(const graph::CheckpointPlan& plan, int64_t stage, uint64_t capacity) {
  build(plan, stage);
  SimulatedDevice device(capacity == 0 ? (1ull << 60) : capacity, 0);
  ExecuteOptions options;
  options.record_by_kind = false;  // peaks and the OOM verdict only (as sim/search/optimize.cpp)
  options.buffers = &exec_;
  exec_.timeline = std::move(timeline_);  // the previous run's arrays, reused
  timeline_ = execute(program_, scenario_.allocator, device, options);
  return !timeline_.oom.has_value();
}

}  // namespace memsim
