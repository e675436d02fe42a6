// The --trace report: the simulated run as Chrome trace-event JSON
// ({"traceEvents": [...]}), which ui.perfetto.dev and chrome://tracing open.
//
// Contract (time axis: ts = Program event index, read as microseconds):
//  - Counter tracks ("C"): "memory" {allocated, reserved, requested} and
//    "allocated by kind" {one series per TensorKind}, bytes, emitted only where a value
//    changes (plus the first and last executed event) to keep the file small.
//  - Slices ("X", complete events) on three threads of process 1: "phase" (maximal runs
//    of events in one Phase: setup/forward/loss/backward/optimizer/other), "layer" (runs
//    inside one transformer layer, named "layer N", args.phase) and "op" (runs of one op
//    in one layer and phase, args.phase, args.layer, and args.allocates: the names of the
//    first 8 tensors it allocates, program/tensor_names.h, with allocates_total when
//    there are more). A slice covers [first event, last event + 1).
//  - Instant events ("i"): every mark (by name) and the OOM point ("OOM", args: op,
//    tensor, requested_bytes, message) when the run ran out of memory.
//  - Only executed events appear (the Timeline's length); strings are JSON-escaped with
//    invalid UTF-8 replaced.
#pragma once

#include <cstdio>

#include "program/program.h"
#include "sim/step/execute.h"

namespace memsim::cli {

void write_trace_json(std::FILE* out, const Program& program, const Timeline& timeline);

}  // namespace memsim::cli
