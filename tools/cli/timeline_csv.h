// The --timeline report: one CSV row per executed event.
//
// Columns: index,type,op,phase,layer,kind,bytes,allocated,reserved,requested, then one
// column per TensorKind (parameters,gradients,optimizer_state,activations,temporaries,
// input,loss,other) with the allocated (rounded) bytes of that kind after the event.
// Last, name: what the alloc/free row's tensor is (program/tensor_names.h; empty for
// marks, and for a replayed trace, which has no tensors).
//  - type: alloc | free | mark | empty_cache; op: the op, or a mark's name.
//  - layer and kind are empty when they do not apply (outside a layer; mark rows).
//  - bytes: the requested bytes of an alloc/free, 0 otherwise.
//  - After an OOM the rows stop before the failing alloc (the Timeline's length); the
//    failing request is in the JSON's "oom".
#pragma once

#include <cstdio>

#include <vector>

#include "allocator/snapshot/snapshot.h"
#include "program/program.h"
#include "replay/replay.h"
#include "sim/step/execute.h"

namespace memsim::cli {

void write_timeline_csv(std::FILE* out, const Program& program, const Timeline& timeline);

// The same columns for a replayed trace (memsim replay): type is the trace action
// (alloc, free_requested, free_completed, segment_alloc, ...), op and layer are empty,
// phase is "other", kind is "other" for alloc/free rows, bytes is the traced size, and
// all allocated bytes count as "other" (a trace does not know tensor kinds).
void write_trace_timeline_csv(std::FILE* out, const std::vector<SnapshotTraceEntry>& trace,
                              const std::vector<ReplayTimelinePoint>& timeline);

}  // namespace memsim::cli
