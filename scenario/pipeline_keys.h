// Reading parallel.pipeline_schedule, parallel.virtual_stages and the uneven split keys
// parallel.pipeline_first_layers / pipeline_last_layers / pipeline_account_for_embedding /
// pipeline_account_for_loss (internal to the scenario loader; the keys are documented in
// docs/scenario-format.md, the split in scenario/pipeline_split.h).
//
// Contract: pipeline_schedule is 1f1b (default) | gpipe | interleaved; virtual_stages is an
// integer >= 1 (default 1). interleaved needs virtual_stages >= 2; virtual_stages > 1 needs
// interleaved; the layers must split as Megatron-Core splits them (read_pipeline_split:
// evenly over pipeline x virtual_stages unless the split keys say otherwise); gpipe and interleaved need parallel.pipeline > 1
// (1f1b with one stage is the plain loop). Errors name FILE:LINE and the key. Which
// families model a pipeline is checked later (sim/step/modelled_features.h).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

// After parallel.pipeline has been read into p.
void read_pipeline_schedule(const Doc& d, ParallelConfig& p);
// After read_pipeline_schedule: the split keys, then the split checked (the error names
// parallel.pipeline, parallel.virtual_stages or a split key).
void read_pipeline_split(const Doc& d, const ModelConfig& m, ParallelConfig& p);

}  // namespace memsim::scenario_detail
