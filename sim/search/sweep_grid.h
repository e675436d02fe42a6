// The points of a sweep grid, evaluated in parallel with one workspace per worker, and one
// Program per group of points that differ only in what the allocator sees.
//
// Contract:
//  - evaluate_grid(runner, points, threads) == [runner.evaluate(p) for p in points],
//    result for result (the sweep's text, CSV and JSON are unchanged), in point order.
//  - Work shared: each worker parses the scenario once (SweepWorkspace) and reuses its
//    Program and allocator arrays. Points whose overrides differ only in
//    allocator_only_key()s (device.capacity, device.cuda_context, allocator.*) form a
//    group that builds its Program once and replays it through each point's allocator
//    and device: the model builders never read those keys (grep: only the executor,
//    serve planning and the pipeline stage choice do). The exception is the stage choice
//    of a pipeline-parallel scenario (sim/megatron/megatron_pipeline.cpp runs every stage
//    through the scenario's allocator settings to pick the worst one), so for
//    parallel.pipeline > 1 a point whose allocator.* values differ from the built
//    Program's rebuilds.
//  - Groups are the unit of parallel work; when there are fewer groups than workers, a
//    group is split into contiguous chunks so every core has work.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "sim/search/sweep.h"

namespace memsim {

// True for the scenario keys only the allocator and the simulated device read.
bool allocator_only_key(const std::string& key);

std::vector<SweepResult> evaluate_grid(const SweepRunner& runner,
                                       const std::vector<SweepOverrides>& points,
                                       unsigned threads, const SweepProgress& progress = {},
                                       const SweepEvaluateOptions& options = {});

}  // namespace memsim
