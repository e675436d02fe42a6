// Reading parallel.pipeline_schedule and parallel.virtual_stages (internal to the
// scenario loader; the keys are documented in docs/scenario-format.md).
//
// Contract: pipeline_schedule is 1f1b (default) | gpipe | interleaved; virtual_stages is an
// integer >= 1 (default 1). interleaved needs virtual_stages >= 2 and layers divisible by
// pipeline * virtual_stages (Megatron's --num-layers-per-virtual-pipeline-stage);
// virtual_stages > 1 needs interleaved; gpipe and interleaved need parallel.pipeline > 1
// (1f1b with one stage is the plain loop). Errors name FILE:LINE and the key. Which
// families model a pipeline is checked later (sim/step/modelled_features.h).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

// After parallel.pipeline has been read into p.
void read_pipeline_schedule(const Doc& d, const ModelConfig& m, ParallelConfig& p);

}  // namespace memsim::scenario_detail
